"""Operations through a real `openjev serve` process with the embedded model: per-key 429,
token admission (529), JSON logs, a client that goes away, and the SIGTERM drain."""

import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import start_server, stop_server

pytestmark = pytest.mark.model

SHORT = {
    "model": "jev-latest",
    "state": "Hi, I was charged twice for order #1234 and I want my money back today.",
    "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
}
SECRET = "Quokka-91ab-do-not-log"


def _long(n_words: int, tag: str = "") -> dict:
    """A request whose prefill takes seconds on a CPU (distinct text per tag: no cache hits);
    250 words are ~1,000 tokens, ~2 s on an idle 2-core CPU."""
    words = " ".join(f"{tag}word{i}" for i in range(n_words))
    return {**SHORT, "state": f"Ticket history: {words}"}


def _post(server, body, key, out, timeout=120):
    try:
        out.append(
            httpx.post(
                server.url + "/v1/systemone",
                json=body,
                timeout=timeout,
                headers={"Authorization": f"Bearer {key}"} if key else {},
            )
        )
    except httpx.HTTPError as e:
        out.append(e)


def _gauge(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _wait_for(server, name: str, timeout_s: float = 60) -> None:
    """Until gauge `name` is positive (a busy machine may take a while to get a request in)."""
    deadline = time.monotonic() + timeout_s
    while _gauge(server, name) <= 0:
        assert time.monotonic() < deadline, f"{name} stayed 0"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    keys = tmp / "keys"
    keys.write_text("# tenants\nalice:alice-key requests_per_min=2\nbob:bob-key\n")
    server = start_server(
        tmp,
        "--api-keys-file",
        str(keys),
        "--max-tokens-in-flight",
        "200",
        "--log-format",
        "json",
        "--slice-ms",
        "100",
        "--engine-timeout-s",
        "600",
    )  # a busy shared CPU can be 20x slower than idle
    server.keys_path = keys
    yield server
    stop_server(server)


def test_per_key_requests_per_minute_through_a_real_server(ops_server):
    codes = []
    for _ in range(3):
        r = httpx.post(
            ops_server.url + "/v1/systemone", json=SHORT, timeout=60, headers={"Authorization": "Bearer alice-key"}
        )
        codes.append(r.status_code)
    assert codes == [200, 200, 429]
    assert r.json()["detail"]["error_type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1
    ok = httpx.post(
        ops_server.url + "/v1/systemone", json=SHORT, timeout=60, headers={"Authorization": "Bearer bob-key"}
    )
    assert ok.status_code == 200
    # unauthenticated with a broken body: 401, the body never parsed
    r = httpx.post(
        ops_server.url + "/v1/systemone", content=b"{broken", timeout=10, headers={"content-type": "application/json"}
    )
    assert r.status_code == 401


def test_tokens_in_flight_bound_through_a_real_server(ops_server):
    out: list = []
    first = threading.Thread(target=_post, args=(ops_server, _long(120, "a"), "bob-key", out))
    first.start()
    _wait_for(ops_server, "openjev_tokens_in_flight")  # the first is in the engine (alone: admitted)
    second: list = []
    _post(ops_server, _long(60, "b"), "bob-key", second)
    first.join(120)
    assert out[0].status_code == 200, out[0]
    assert second[0].status_code == 529, second[0].text
    assert second[0].json()["detail"]["error_type"] == "rate_limit_error"
    assert int(second[0].headers["retry-after"]) >= 1
    metrics = httpx.get(ops_server.url + "/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
    }
    assert samples[("openjev_rejections_total", (("error_type", "rate_limit_error"), ("status", "529")))] >= 1
    assert samples[("openjev_tokens_in_flight", ())] == 0


def test_json_logs_parse_and_a_client_that_goes_away_is_one_info_line(ops_server):
    try:
        httpx.post(
            ops_server.url + "/v1/systemone",
            json=_long(300, SECRET),
            timeout=1.0,
            headers={"Authorization": "Bearer bob-key"},
        )
    except httpx.ReadTimeout:
        pass
    time.sleep(2.0)  # the server notices within its 0.5 s poll
    lines = open(ops_server.log_path).read().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    gone = [r for r in records if r.get("logger") == "openjev.access" and r.get("status") == 499]
    assert len(gone) == 1 and gone[0]["level"] == "info" and gone[0]["key"] == "bob"
    assert not [r for r in records if r["level"] == "error"]
    assert SECRET not in "\n".join(lines)


def test_sighup_reloads_the_keys_file(ops_server):
    def status(key):
        return httpx.get(
            ops_server.url + "/v1/models", timeout=10, headers={"Authorization": f"Bearer {key}"}
        ).status_code

    assert status("carol-key") == 401
    ops_server.keys_path.write_text("bob:bob-key\ncarol:carol-key\n")
    os.kill(ops_server.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while status("carol-key") != 200:
        assert time.monotonic() < deadline, "carol's key never accepted"
        time.sleep(0.1)
    assert status("alice-key") == 401 and status("bob-key") == 200
    assert ops_server.process.poll() is None  # SIGHUP did not end it


def test_sigterm_drains_in_flight_requests_then_exits_zero(tmp_path):
    server = start_server(tmp_path, "--slice-ms", "100")
    try:
        out: list = []
        slow = threading.Thread(target=_post, args=(server, _long(250, "drain"), "", out))
        slow.start()
        _wait_for(server, "openjev_evaluations_in_flight")
        os.kill(server.process.pid, signal.SIGTERM)
        time.sleep(0.3)
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        new = httpx.post(server.url + "/v1/systemone", json=SHORT, timeout=10)
        assert new.status_code == 503 and new.headers["retry-after"] and new.headers["x-typesafe-request-id"]
        assert new.json()["detail"]["error_type"] == "unknown"
        slow.join(120)
        assert out[0].status_code == 200, out[0]
        assert server.process.wait(30) == 0
    finally:
        stop_server(server)


def test_drain_timeout_answers_json_503_and_exits_zero(tmp_path):
    server = start_server(tmp_path, "--slice-ms", "100", "--drain-timeout-s", "1")
    try:
        out: list = []
        slow = threading.Thread(target=_post, args=(server, _long(600, "cut"), "", out))
        slow.start()
        _wait_for(server, "openjev_evaluations_in_flight")
        os.kill(server.process.pid, signal.SIGTERM)
        slow.join(60)
        r = out[0]
        assert r.status_code == 503, r
        assert r.json()["detail"]["error_type"] == "unknown" and r.headers["x-typesafe-request-id"]
        assert server.process.wait(30) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not exit after its drain timeout")
    finally:
        stop_server(server)
