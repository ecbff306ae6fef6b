"""/v1/outcomes on a real server process with the embedded model, keys on and a real SQLite
file: 60 outcomes posted for one question make its task ready with no engine work (the
server's engine counters do not move), the next answer to that question names the task's fit
and what it rests on, the decisions, outcomes and task survive a restart, another key gets
404 on them, and bad outcomes get a 4xx and change nothing."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import start_server, stop_server
from tests.integration.test_tasks_live import ASKS, OTHER, QUESTION, auth

pytestmark = pytest.mark.model


def engine_work(url: str) -> tuple[float, float]:
    """(plans sent to the engine, model forwards run) as /metrics says."""
    found = {"openjev_engine_calls_total": 0.0, "openjev_engine_forwards": 0.0}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            if s.name in found:
                found[s.name] = s.value
    return found["openjev_engine_calls_total"], found["openjev_engine_forwards"]


def decide(url: str, state: str, key: str = "alice-key") -> tuple[str, httpx.Response]:
    r = httpx.post(url + "/v1/systemone", json={"state": state, "questions": {"refund": QUESTION}}, headers=auth(key))
    assert r.status_code == 200, r.text
    return r.headers["x-typesafe-request-id"], r


def outcomes(url: str, items: list[dict], key: str = "alice-key") -> httpx.Response:
    return httpx.post(url + "/v1/outcomes", json={"outcomes": items}, headers=auth(key), timeout=60)


def test_outcomes_make_a_task_ready_without_engine_work_and_survive_a_restart(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice:alice-key\nbob:bob-key\n")
    args = ("--api-keys-file", str(keys), "--tasks-db", str(tmp_path / "tasks.sqlite3"), "--readout", "letters")
    server = start_server(tmp_path, *args)
    try:
        truth = []
        for n in range(61):
            asks = n % 2 == 0
            rid, first = decide(server.url, (ASKS if asks else OTHER)[n % 5].format(n=300 + n))
            truth.append({"decision_id": rid, "question": "refund", "answer": asks})
        assert first.headers["x-openjev-calibration-basis"].endswith("basis=global")  # the shipped fit, unchecked
        # bad outcomes: a 4xx, and nothing kept
        wrong = [truth[0], {**truth[1], "answer": "yes"}]
        assert outcomes(server.url, wrong).status_code == 422
        assert outcomes(server.url, [truth[0], {**truth[1], "decision_id": "req_" + "f" * 32}]).status_code == 404
        assert outcomes(server.url, truth[:2], key="bob-key").status_code == 404  # alice's decisions
        assert outcomes(server.url, truth * 20).status_code == 422  # over 1000 in one call
        assert httpx.get(server.url + "/v1/tasks", headers=auth("alice-key")).json()["tasks"] == []
        before = engine_work(server.url)
        r = outcomes(server.url, truth[:60])
        assert r.status_code == 200, r.text
        assert r.json()["accepted"] == 60 and {o["status"] for o in r.json()["outcomes"]} == {"new"}
        task_id = r.json()["outcomes"][0]["task"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            task = httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=auth("alice-key")).json()
            if task["status"] == "ready":
                break
            time.sleep(0.1)
        assert task["status"] == "ready", task
        assert task["outcomes"] == 60 and task["fit"]["rests_on"]["outcomes"] == 60
        assert engine_work(server.url) == before  # the refit read the stored readings
        _, answer = decide(server.url, "Refund order 999 now, it is broken.")
        assert answer.headers["x-openjev-calibration"] == f"task:{task_id}"
        basis = answer.json()["answers"]["refund"]["x_basis"]
        assert basis["kind"] == "task" and basis["outcomes"] == 60 and basis["examples"] == 0
        assert f"task:{task_id}; basis=task; examples=0; outcomes=60" in answer.headers["x-openjev-calibration-basis"]
        assert httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=auth("bob-key")).status_code == 404
    finally:
        stop_server(server)

    server = start_server(tmp_path, *args)  # the same file: decisions, outcomes and task kept
    try:
        again = httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=auth("alice-key")).json()
        assert again["status"] == "ready" and again["outcomes"] == 60
        r = outcomes(server.url, truth[59:61])  # one posted before the restart, one decided before it
        assert r.status_code == 200 and [o["status"] for o in r.json()["outcomes"]] == ["same", "new"]
        assert outcomes(server.url, truth[60:], key="bob-key").status_code == 404
        _, answer = decide(server.url, "Refund order 1000, please.")
        assert answer.headers["x-openjev-calibration"] == f"task:{task_id}"
    finally:
        stop_server(server)
