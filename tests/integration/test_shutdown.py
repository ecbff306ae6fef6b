"""SIGTERM stops computing: a real `openjev serve` on the embedded model, with a long decision
on the engine and task creates being priced (compiled in worker threads) when SIGTERM comes,
exits within seconds of its drain timeout. Nothing computes after "Finished server process":
the engine stops at its next forward, queued worker-thread work is dropped, and running
worker threads (their requests gone) are not waited for (api/server/drain.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest

from tests.integration.conftest import start_server, stop_server

pytestmark = pytest.mark.model

CREATES = 12  # more than the worker threads (CPUs + 4, at most 32 on a small machine): some queued


def _create(url: str, k: int, out: list) -> None:
    """A task of 1,000 examples (about 1.4 MB): its create compiles every one before it answers."""
    tag = uuid.uuid4().hex[:6]
    words = " ".join(f"w{j}" for j in range(300))
    examples = [{"state": f"{tag} {k} {i} {words}", "answer": bool(i % 2)} for i in range(1000)]
    body = {"question": {"type": "noul", "instructions": "Long?"}, "examples": examples}
    try:
        out.append(httpx.post(url + "/v1/tasks", json=body, timeout=300).status_code)
    except httpx.HTTPError as e:
        out.append(type(e).__name__)


def _decide(url: str, out: list) -> None:
    body = {"state": " ".join(f"w{i}" for i in range(2500)), "questions": {"q": {"type": "noul", "instructions": "?"}}}
    try:
        out.append(httpx.post(url + "/v1/systemone", json=body, timeout=300).status_code)
    except httpx.HTTPError as e:
        out.append(type(e).__name__)


def test_sigterm_exits_within_seconds_while_work_is_in_worker_threads(tmp_path):
    server = start_server(tmp_path, "--drain-timeout-s", "1", "--tasks-db", str(tmp_path / "tasks.db"))
    try:
        out: list = []
        threads = [threading.Thread(target=_create, args=(server.url, k, out)) for k in range(CREATES)]
        threads.append(threading.Thread(target=_decide, args=(server.url, out)))
        for t in threads:
            t.start()
        time.sleep(3)  # bodies in, compiles under way in the worker threads and queued behind them
        t0 = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        server.process.wait(60)
        exited = time.monotonic() - t0
        for t in threads:
            t.join(60)
        log = open(server.log_path).read()
    finally:
        stop_server(server)
    assert server.process.returncode == 0, log[-2000:]
    # the drain's second and uvicorn's graceful 5 s for the task routes, then out at once
    assert exited < 10, (exited, log[-2000:])
    assert "Finished server process" in log
