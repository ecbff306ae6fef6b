"""A real `openjev serve` process on loopback with the embedded model, driven by real clients:
httpx, the official typesafe-sdk, and the public conformance suite jevcompat."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.integration.conftest import start_server, stop_server

README_EXAMPLE = {
    "model": "jev-latest",
    "state": "Hi, I was charged twice for order #1234 and I want my money back today.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "department": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "Payments, charges and refunds", "technical": "Bugs in the app"},
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["Routine", "Urgent", "Emergency"],
        },
    },
}


def _readme_curl_body() -> dict:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("-d '") + len("-d '")
    return json.loads(text[start : text.index("}'", start) + 1])


def test_readme_example(live):
    assert _readme_curl_body() == README_EXAMPLE  # the README shows exactly what is tested here
    r = httpx.post(live.url + "/v1/systemone", json=README_EXAMPLE, headers=live.headers(), timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "smollm2-135m-instruct"
    assert set(body["answers"]) == {"refund", "department", "urgency"}
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
    assert int(r.headers["x-openjev-prefix-tokens"]) > 0


def test_official_sdk_parses_every_answer_type_with_zstd_bodies(live):
    from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

    long_state = README_EXAMPLE["state"] + " More context. " * 200  # > 1 KiB: the SDK compresses it
    with TypeSafeClient(api_key=live.key, base_url=live.url, timeout=60) as client:
        r = client.system_one(
            state=long_state,
            questions={
                "refund": Noul(instructions="Does the customer ask for a refund?"),
                "team": Choice(instructions="Which team?", criteria={"billing": "Payments", "tech": None}),
                "anger": Score(instructions="How angry?", criteria=["Calm", "Annoyed", "Furious"]),
            },
        )
    assert 0 <= r.nouls["refund"].noul <= 1
    assert r.choices["team"].choice in ("billing", "tech")
    assert 0 <= r.scores["anger"].score <= 2


def test_health_live_answers_while_the_engine_is_busy(live):
    big = {
        **README_EXAMPLE,
        "state": "The customer writes a long letter. " * 150,
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Is statement {i} true?"} for i in range(24)},
    }
    done = threading.Event()
    result = {}

    def call():
        result["r"] = httpx.post(live.url + "/v1/systemone", json=big, headers=live.headers(), timeout=300)
        done.set()

    worker = threading.Thread(target=call)
    worker.start()
    try:
        # wait until the request is admitted (in flight), then probe liveness while it runs
        # (paced: a probe loop without pauses would take the CPU from the request it waits on)
        for _ in range(400):
            if httpx.get(live.url + "/health", timeout=10, headers=live.headers()).json().get("in_flight"):
                break
            time.sleep(0.02)
        answered_while_busy = 0
        while not done.is_set():
            if httpx.get(live.url + "/health/live", timeout=10).status_code == 200 and not done.is_set():
                answered_while_busy += 1
            time.sleep(0.1)
        assert answered_while_busy > 0
    finally:
        worker.join()
    assert result["r"].status_code == 200


def run_jevcompat(url: str, key: str, tmp_path) -> None:
    """The conformance suite against `url`: every MUST and SHOULD passes."""
    report = tmp_path / "jevcompat.json"
    env = {**os.environ, "OPENJEV_TEST_KEY": key}
    proc = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "jevcompat"),
            "test",
            url,
            "--key-env",
            "OPENJEV_TEST_KEY",
            "--json",
            str(report),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(proc.stdout[-4000:])
    data = json.loads(report.read_text())
    summary = data["summary"]
    assert summary["verdict"] == "conformant", proc.stdout[-4000:]
    assert summary["MUST"]["failed"] == 0 and summary["MUST"]["passed"] == 32
    assert summary["SHOULD"]["failed"] == 0 and summary["SHOULD"]["passed"] == 15
    assert not data["inconclusive"] and not data["case_errors"]
    assert proc.returncode == 0


def test_conformance_suite_passes_every_must_and_should(live, tmp_path):
    run_jevcompat(live.url, live.key, tmp_path)


def test_unusable_model_is_refused_at_startup(tmp_path):
    server = start_server(tmp_path, "--model", str(tmp_path / "missing-model"), wait=False)
    try:
        assert server.process.wait(60) == 2
        assert "no such file or folder" in open(server.log_path).read()
    finally:
        stop_server(server)


def test_model_that_fails_to_load_exits_nonzero(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    server = start_server(tmp_path, "--model", str(folder), wait=False)
    try:
        assert server.process.wait(120) == 1
        assert "cannot serve" in open(server.log_path).read()
    finally:
        stop_server(server)
