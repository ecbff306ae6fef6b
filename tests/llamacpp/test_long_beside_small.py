"""A long question beside another key's small decisions, on a real `openjev serve --engine
llamacpp` (the embedded GGUF; `make test-llamacpp`): the small ones stay 200 and prompt (the
long one's decode calls give way to them, llamacpp/turns.py), and the long one is answered
or refused at the door by its measured price (llamacpp/steps.py, engines/cost_model.py),
never a 504. And SIGTERM stops the engine's work within a few seconds.

    OPENJEV_LLAMACPP=1 .venv/bin/python -m pytest tests/llamacpp/test_long_beside_small.py
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        os.environ.get("OPENJEV_LLAMACPP") != "1", reason="the llama.cpp suite runs with `make test-llamacpp`"
    ),
]

HEAVY, VICTIM = "heavy-key-0123456789", "victim-key-0123456789"
SMALL_WITHIN_S = 10.0  # the small decisions' bound beside the long one (the issue's mark)


def _long(words: int) -> dict:
    """One yes/no question of about `words` tokens (a word a token), its start unique: no
    cache helps."""
    text = uuid.uuid4().hex + " " + "word " * words
    return {"state": "hi", "questions": {"q": {"type": "noul", "instructions": f"{text}Is it?"}}}


def _small() -> dict:
    return {"state": "hi", "questions": {"q": {"type": "noul", "instructions": "ok?"}}}


def _post(server, key: str, body: dict, timeout: float = 300) -> tuple[int, float, str]:
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    return r.status_code, time.monotonic() - t0, r.text[:300]


def _start(tmp_path, *args: str):
    from tests.integration.conftest import start_server

    return start_server(
        tmp_path, "--engine", "llamacpp", "--tasks-db", "off", "--api-key", HEAVY, "--api-key", VICTIM, *args
    )


def _beside(server, words: int) -> tuple[tuple[int, float, str], list[tuple[int, float, str]]]:
    """The long question from HEAVY and, while it is out, VICTIM's small decisions one after
    another (each on the last's answer, a second apart)."""
    long_out: list = []
    thread = threading.Thread(target=lambda: long_out.append(_post(server, HEAVY, _long(words))))
    _post(server, VICTIM, _small())  # the victim's state cached, as a client's usual traffic finds it
    thread.start()
    small: list[tuple[int, float, str]] = []
    while thread.is_alive() or not small:
        small.append(_post(server, VICTIM, _small(), timeout=120))
        time.sleep(1.0)
    thread.join()
    return long_out[0], small


def test_another_keys_small_decisions_stay_prompt_beside_a_long_question(tmp_path):
    from tests.integration.conftest import stop_server

    server = _start(tmp_path, "--engine-timeout-s", "120")
    try:
        (status, seconds, text), small = _beside(server, 3000)
    finally:
        stop_server(server)
    assert status in (200, 422, 529), (status, seconds, text)  # answered, or refused at the door: never a 504
    assert all(s == 200 for s, _, _ in small), small
    assert max(t for _, t, _ in small) < SMALL_WITHIN_S, small
    if status == 200:  # it was served while the small ones went between its decode calls
        assert len(small) >= 2, small


def test_a_question_past_the_deadline_is_refused_at_the_door_not_a_504(tmp_path):
    from tests.integration.conftest import stop_server

    server = _start(tmp_path, "--engine-timeout-s", "10")
    try:
        (status, seconds, text), small = _beside(server, 7000)
    finally:
        stop_server(server)
    # priced from the cost the engine measured (its warm-up and every decode call since)
    assert status != 504, (status, seconds, text)
    if status == 422:
        assert "would take about" in text and seconds < 5, (seconds, text)
    assert all(s == 200 for s, _, _ in small), small


def test_sigterm_stops_a_long_decision_within_seconds(tmp_path):
    from tests.integration.conftest import stop_server

    server = _start(tmp_path, "--engine-timeout-s", "300", "--drain-timeout-s", "1")
    try:
        out: list = []
        thread = threading.Thread(target=lambda: out.append(_post(server, HEAVY, _long(6000))))
        thread.start()
        time.sleep(3)  # its decode calls under way
        t0 = time.monotonic()
        os.kill(server.process.pid, signal.SIGTERM)
        assert server.process.wait(15) == 0
        exited = time.monotonic() - t0
        thread.join(30)
    finally:
        stop_server(server)
    assert exited < 6, exited  # the drain's second, then the engine stops at its next decode call
    assert out and out[0][0] in (200, 422, 503), out
