"""A SIGTERM drain that runs out of time while an NDJSON batch streams, through a real
`openjev serve` process (issue 16, finding 9): the stream ends properly (a 503 line for
each unfinished item, the summary, then the final chunk, so a strict HTTP client reads a
complete body), the access log says so, and the process exits 0."""

import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.integration.conftest import start_server, stop_server

pytestmark = pytest.mark.model


def _item(tag: str, words: int = 400) -> dict:
    """~4 tokens a word: seconds of prefill each on a CPU, far past a 1 s drain timeout."""
    text = " ".join(f"{tag}word{i}" for i in range(words))
    return {
        "model": "jev-latest",
        "state": f"Ticket history: {text}",
        "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
    }


def test_a_drain_ends_a_streaming_batch_with_503_lines_and_its_summary(tmp_path):
    # Small forwards (--batch-tokens): the engine's thread is between forwards within
    # moments of the shutdown even on a loaded machine, so the process can exit 0 promptly.
    server = start_server(
        tmp_path, "--slice-ms", "100", "--batch-tokens", "256", "--drain-timeout-s", "1", "--log-format", "json"
    )
    try:
        got: dict = {}

        def stream() -> None:
            body = {"requests": [_item(f"d{i}x") for i in range(3)]}
            try:
                with httpx.stream("POST", server.url + "/v1/systemone/batch", json=body, timeout=120) as r:
                    got["status"] = r.status_code
                    got["rid"] = r.headers["x-typesafe-request-id"]
                    got["body"] = r.read().decode()  # raises if the chunked body is cut short
            except httpx.HTTPError as e:
                got["error"] = repr(e)

        reader = threading.Thread(target=stream)
        reader.start()
        deadline = time.monotonic() + 60
        while "evaluations_in_flight" not in _metrics(server):
            assert time.monotonic() < deadline, "the batch never reached the engine"
            time.sleep(0.05)
        os.kill(server.process.pid, signal.SIGTERM)
        reader.join(60)
        assert "error" not in got, got.get("error")  # a complete body: final chunk included
        assert got["status"] == 200
        lines = [json.loads(line) for line in got["body"].splitlines()]
        items, summary = lines[:-1], lines[-1]["summary"]
        assert sorted(line["index"] for line in items) == [0, 1, 2]
        cut = [line for line in items if line.get("status") == 503]
        assert cut, items  # the drain timeout came before the long items could finish
        for line in cut:
            assert "shut down before this item finished" in line["error"]["message"] and line["retry_after"] >= 1
        assert summary["items"] == 3 and summary["drained"] == len(cut)
        # exit 0; the engine's thread may first finish the forward it is in (up to 30 s on a
        # loaded machine: scheduler.stop() joins it), so the wait has a wide margin
        assert server.process.wait(120) == 0
        records = [json.loads(line) for line in open(server.log_path) if line.startswith("{")]
        access = [r for r in records if r.get("logger") == "openjev.access" and r.get("request_id") == got["rid"]]
        assert sorted(r["status"] for r in access if "item" in r) == sorted(line.get("status", 200) for line in items)
        [whole] = [r for r in access if "item" not in r]
        assert whole["items_drained"] == len(cut) and whole["items"] == 3
    finally:
        stop_server(server)


def _metrics(server) -> str:
    """Lines of /metrics with a positive openjev_evaluations_in_flight ('' before)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return "\n".join(
        line
        for line in text.splitlines()
        if line.startswith("openjev_evaluations_in_flight ") and float(line.split()[1]) > 0
    )
