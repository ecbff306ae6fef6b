"""The API tier past one process (issue 47): real openjev replicas (`python -m openjev serve`
on loopback ports) sharing a real redis-server, in front of one engine server. The engine is
tests/support/fake_sglang_server.py (a named fake at the engine seam: the limits under test
are the API tier's, and a real model would only slow each request); `make test-api-tier`
runs these, installing redis-server where it is missing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import LiveServer, start_server, stop_server
from tests.support import processes
from tests.support.net import free_port

KEYS = """\
rpm:rpm-key requests_per_min=60
tpm:tpm-key tokens_per_min=3000
flood:flood-key
bob:bob-key
"""
BODY = {
    "model": "jev-latest",
    "state": "Customer: my card was charged twice for order 1182, please give the money back.",
    "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
}


@pytest.fixture(scope="session")
def tokenizer_folder(tmp_path_factory):
    """The embedded model's tokenizer as a local folder (what --model points the sglang engine at)."""
    from transformers import AutoTokenizer

    from openjev.engines.models.source import resolve_source

    source = resolve_source(None)
    folder = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file).save_pretrained(folder)
    return str(folder)


def _engine_server(folder: str, log_dir: Path, delay_s: float):
    port = free_port()
    log = open(log_dir / "engine.log", "w")
    args = ["--model-path", folder, "--port", str(port), "--delay-s", str(delay_s)]
    proc = processes.spawn(
        [sys.executable, "-m", "tests.support.fake_sglang_server", *args], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, proc, log
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the fake engine server did not start: {(log_dir / 'engine.log').read_text()[-2000:]}")


@pytest.fixture(scope="session")
def engine_server(tokenizer_folder, tmp_path_factory):
    """One fake SGLang server every replica connects to, answering at once."""
    url, proc, log = _engine_server(tokenizer_folder, tmp_path_factory.mktemp("engine"), 0.0)
    yield url
    proc.kill()
    proc.wait(10)
    log.close()


@pytest.fixture(scope="session")
def slow_engine_server(tokenizer_folder, tmp_path_factory):
    """The same, each token-id call taking 0.3 s: an evaluation stays in flight long enough to be seen."""
    url, proc, log = _engine_server(tokenizer_folder, tmp_path_factory.mktemp("slow-engine"), 0.3)
    yield url
    proc.kill()
    proc.wait(10)
    log.close()


@dataclass
class Fleet:
    """Replicas sharing one keys file, one Redis and one engine; stopped by the fixture."""

    tmp: Path
    engine: str
    tokenizer: str
    redis_url: str
    keys_file: Path
    replicas: list[LiveServer] = field(default_factory=list)

    def start(self, n: int = 2, *extra: str, engine: str | None = None) -> list[LiveServer]:
        for _ in range(n):
            args = ("--engine", "sglang", "--connect", engine or self.engine, "--model", self.tokenizer)
            args += ("--api-keys-file", str(self.keys_file), "--limits-redis-url", self.redis_url)
            args += ("--max-in-flight", "4", "--limits-replicas", str(n), *extra)
            self.replicas.append(start_server(self.tmp, *args))
        return self.replicas

    def log(self, server: LiveServer) -> str:
        return Path(server.log_path).read_text()

    def hangup(self) -> None:
        for server in self.replicas:
            os.kill(server.process.pid, signal.SIGHUP)


@pytest.fixture
def fleet(tmp_path, redis_server, engine_server, tokenizer_folder):
    if redis_server.process is None:  # a test that killed it left it down
        redis_server.start()
    redis_server.flush()
    keys = tmp_path / "keys.txt"
    keys.write_text(KEYS)
    made = Fleet(tmp_path, engine_server, tokenizer_folder, redis_server.url, keys)
    yield made
    for server in made.replicas:
        stop_server(server)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def load(
    urls: list[str], key: str, seconds: float, concurrency: int, body: dict | None = None
) -> tuple[Counter, float]:
    """`concurrency` callers for `seconds`, each sending to the replicas in turn (so both are
    sent to alternately and at once): the statuses, and the slowest answer in seconds."""
    statuses: Counter = Counter()
    slowest = 0.0
    end = time.monotonic() + seconds

    async def caller(client: httpx.AsyncClient, first: int) -> None:
        nonlocal slowest
        i = first
        while time.monotonic() < end:
            t0 = time.monotonic()
            r = await client.post(urls[i % len(urls)] + "/v1/systemone", json=body or BODY, headers=auth(key))
            slowest = max(slowest, time.monotonic() - t0)
            statuses[r.status_code] += 1
            if r.status_code == 503:
                assert "retry-after" in r.headers, r.text
            i += 1
            if r.status_code == 429:
                await asyncio.sleep(0.05)  # a refused caller does not spin

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(caller(client, n) for n in range(concurrency)))
    return statuses, slowest
