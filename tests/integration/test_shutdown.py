"""SIGTERM stops computing: a real `openjev serve` on the embedded model, a long decision on the
engine when SIGTERM comes, exits within seconds of its drain timeout (the engine stops at its
next forward; work left in worker threads is not waited for, api/server/drain.py)."""

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


def _decide(url: str, out: list) -> None:
    state = uuid.uuid4().hex + " " + "word " * 6000  # about 6,000 tokens, none cached
    body = {"state": state, "questions": {"q": {"type": "noul", "instructions": "Is it?"}}}
    try:
        out.append(httpx.post(url + "/v1/systemone", json=body, timeout=600).status_code)
    except httpx.HTTPError as e:
        out.append(type(e).__name__)


def test_sigterm_during_a_long_decision_exits_within_seconds(tmp_path):
    # a deadline long enough that the decision is admitted on a slow CPU (it is priced)
    server = start_server(tmp_path, "--drain-timeout-s", "1", "--engine-timeout-s", "900", "--tasks-db", "off")
    try:
        out: list = []
        thread = threading.Thread(target=_decide, args=(server.url, out))
        thread.start()
        time.sleep(3)  # its forwards under way
        t0 = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        server.process.wait(60)
        exited = time.monotonic() - t0
        thread.join(60)
        log = open(server.log_path).read()
    finally:
        stop_server(server)
    assert server.process.returncode == 0, log[-2000:]
    assert out and out[0] in (200, 503), (out, log[-2000:])  # answered in time, or cut by the drain timeout
    assert exited < 6, (exited, log[-2000:])  # the drain's second, then the engine's next forward
