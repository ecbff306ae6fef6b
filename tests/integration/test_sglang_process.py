"""openjev with an engine child: start, health, tokenizer check, supervision, shutdown.
The child is tests/support/fake_sglang_server.py (a named fake); SGLang-JAX runs in `make test-sglang`."""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openjev.config import load_settings
from openjev.core.plan import Branch, Plan
from openjev.engines import load_engine as load  # --engine sglang: the sglang loader, given its sections
from openjev.engines import preflight_engine as preflight
from openjev.errors import ConfigError
from tests.integration.conftest import start_server, stop_server
from tests.support.fakes import fake_logprobs
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tokenizer_folder(tmp_path_factory):
    """The embedded model's tokenizer as a local folder (what --model points the sglang engine at)."""
    from transformers import AutoTokenizer

    from openjev.engines.models.source import resolve_source

    source = resolve_source(None)
    folder = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file).save_pretrained(folder)
    return str(folder)


def _settings(folder, **kw):
    base = {
        "engine": "sglang",
        "sglang_python": sys.executable,
        "sglang_module": "tests.support.fake_sglang_server",
        "model": folder,
        "sglang_port": free_port(),
        "startup_timeout_s": 60,
    }
    return load_settings({**base, **kw}, environ={})


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"strategy": "fastest"}, "--strategy"),
        ({"connect": "http://127.0.0.1:1"}, "exactly one"),
        ({"sglang_python": None}, "exactly one"),
        ({"model": None}, "needs --model"),
        ({"sglang_args": ("--disable-radix-cache",), "strategy": "staged"}, "disable-radix-cache"),
    ],
)
def test_preflight_refuses_what_cannot_work(tokenizer_folder, kw, why):
    with pytest.raises(ConfigError, match=why):
        preflight(_settings(tokenizer_folder, **kw))


def test_radix_cache_off_is_fine_for_all(tokenizer_folder):
    preflight(_settings(tokenizer_folder, sglang_args=("--disable-radix-cache",), strategy="all"))


def test_child_is_started_checked_supervised_and_stopped(tokenizer_folder, caplog):
    settings = _settings(tokenizer_folder, sglang_args=("--disable-radix-cache",), strategy="all")
    with caplog.at_level(logging.INFO, logger="openjev.engines.http.remote"):
        loaded = load(settings)
    engine = loaded.engine
    child = engine.process.process
    assert loaded.card.name == Path(tokenizer_folder).name.lower()
    # /v1/models shows the card: the folder's name, never its path or the engine's URL
    assert loaded.card.description == f"{Path(tokenizer_folder).name} served by SGLang", loaded.card.description
    # checked: the child's tokenizer was asked for the probe's ids and they were compared
    assert "the engine's tokenizer equals ours" in caplog.text, caplog.text
    plan = Plan.from_branches([Branch((1, 2, 3), (5, 6)), Branch((1, 2, 4), (5, 6))])

    async def scenario():
        # One event loop from the first call to close, as in the server: the engine's client
        # keeps its connections alive, and they belong to the loop that opened them.
        try:
            result, problem = await engine.run(plan), await loaded.probe()
            assert [r.logprobs for r in result.branches] == [fake_logprobs(b.input_ids, 2) for b in plan.branches]
            assert problem is None  # its /health answers
            died = []
            loaded.supervise(died.append)
            os.killpg(child.pid, signal.SIGKILL)  # the child dies under us
            for _ in range(100):
                if died:
                    break
                await asyncio.sleep(0.05)
            assert died and "exited" in str(died[0])
        finally:
            await engine.close()

    asyncio.run(scenario())
    assert child.poll() is not None


def test_the_servers_context_bounds_each_branch(tokenizer_folder):
    """The limit comes from the server's /get_server_info (max_req_input_len): a longer
    plan is a clear 4xx (TokensExceeded) before anything is sent, not a 502 from its 400."""
    from openjev.errors import TokensExceeded

    loaded = load(_settings(tokenizer_folder, sglang_args=("--context-length", "64")))
    engine = loaded.engine
    try:
        assert engine.max_prompt_tokens == 63
        with pytest.raises(TokensExceeded, match="--context-length"):
            asyncio.run(engine.run(Plan.from_branches([Branch(tuple(range(1, 65)), (5, 6))])))
    finally:
        asyncio.run(engine.close())


def test_stop_terminates_the_process_group(tokenizer_folder):
    loaded = load(_settings(tokenizer_folder))
    child = loaded.engine.process.process
    asyncio.run(loaded.engine.close())
    assert child.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(child.pid, 0)


def test_serve_with_a_child_answers_and_exits_nonzero_when_the_child_dies(tmp_path, tokenizer_folder):
    """The documented supervision: the child's death makes openjev exit 1; a request in
    flight at that moment is answered (503, retryable), not dropped."""
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    server = start_server(
        tmp_path,
        "--engine",
        "sglang",
        "--sglang-python",
        sys.executable,
        "--sglang-module",
        "tests.support.fake_sglang_server",
        "--model",
        tokenizer_folder,
        "--sglang-port",
        str(port),
        "--",
        "--disable-radix-cache",
        "--strategy-unused-flag",
        "--delay-s",
        "1",
        # this checkout's openjev (src) and its tests (the child's module), whatever is installed
        env={"OPENJEV_STRATEGY": "all", "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))},
    )
    body = {"state": "charged twice", "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}
    headers = {"x-openjev-rotations": "1"}
    try:
        r = httpx.post(server.url + "/v1/systemone", timeout=30, json=body, headers=headers)
        assert r.status_code == 200, r.text
        child = subprocess.run(
            ["pgrep", "-f", f"tests.support.fake_sglang_server.*--port {port}"], capture_output=True, text=True
        ).stdout.split()
        assert child
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, server.url + "/v1/systemone", timeout=30, json=body, headers=headers)
            time.sleep(0.5)  # in the child's 1 s forward
            assert not pending.done()
            os.kill(int(child[0]), signal.SIGKILL)
            killed = time.monotonic()
            answer = pending.result()
            assert answer.status_code == 503, answer.text
            assert answer.headers.get("retry-after"), (answer.headers, answer.text)
            assert time.monotonic() - killed < 5
        assert server.process.wait(30) == 1
        assert "SGLang server exited" in open(server.log_path).read()
    finally:
        stop_server(server)
