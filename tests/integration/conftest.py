"""Integration fixtures: the real embedded model, in-process and behind a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import pytest

from openjev.config import load_settings
from tests.support import processes
from tests.support.models import EMBEDDED, EMBEDDED_ENV
from tests.support.net import free_port


@pytest.fixture(scope="session")
def embedded():
    """The embedded model in float32, loaded once per session (converted weights come from the
    user cache). float32 explicitly: `auto` means bfloat16 on CPUs with native support, and the
    exactness tests hold float32 to its own tolerance."""
    from openjev.engines import load_engine

    return load_engine(load_settings({**EMBEDDED, "dtype": "float32"}, environ={}))


@pytest.fixture(scope="session")
def embedded_bf16():
    """The embedded model in bfloat16 (whatever this CPU does natively), once per session."""
    from openjev.engines import load_engine

    return load_engine(load_settings({**EMBEDDED, "dtype": "bfloat16"}, environ={}))


@dataclass
class LiveServer:
    url: str
    key: str | None
    process: subprocess.Popen
    log_path: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


def start_server(
    tmp_path, *args: str, key: str | None = None, env: dict | None = None, wait: bool = True
) -> LiveServer:
    """`python -m openjev serve` on a free loopback port; waits for /health unless told not to.

    float32 unless `env` says otherwise: these tests compare answers across requests to 1e-3,
    and bfloat16 (what `auto` picks on CPUs with native support) rounds differently when
    batching or the prefix cache change the computation (about 1e-2; tests/integration/
    test_bf16_parity.py holds bfloat16 to its own tolerance). The embedded model on the in-process
    engine unless `args` or `env` name another (flags win over the environment).

    The server runs in a process group of its own and is stopped with the test run however
    that ends (tests/support/processes.py); a test stops it earlier with stop_server."""
    env = {**EMBEDDED_ENV, "OPENJEV_DTYPE": "float32", **(env or {})}
    port = free_port()
    log_path = str(tmp_path / f"server-{port}.log")
    cmd = [sys.executable, "-m", "openjev", "serve", "--port", str(port), *args]
    if key:
        cmd += ["--api-key", key]
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        proc = processes.spawn(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
    server = LiveServer(f"http://127.0.0.1:{port}", key, proc, log_path)
    if not wait:
        return server
    try:
        _wait_healthy(server)
    except BaseException:  # not healthy, or the run interrupted while waiting: nothing left behind
        stop_server(server)
        raise
    return server


def _wait_healthy(server: LiveServer) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited {server.process.returncode}:\n{open(server.log_path).read()[-3000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not healthy in time:\n{open(server.log_path).read()[-3000:]}")


def stop_server(server: LiveServer) -> None:
    """SIGTERM to the server's process group (it drains), SIGKILL after 20 s."""
    processes.stop(server.process, grace_s=20)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("live"), key="test-key-123")
    yield server
    stop_server(server)
