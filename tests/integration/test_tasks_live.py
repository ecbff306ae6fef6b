"""/v1/tasks on a real server process with the embedded model and a real SQLite file: a task
created with 50 labelled examples over HTTP, fitted as a job whose progress is seen, applied
to later requests on both wire formats (and a batch item) after the server restarted; another
key cannot see, use or delete it."""

from __future__ import annotations

import time

import httpx
import pytest

from openjev.core.calibration import TypeFit, apply
from tests.integration.conftest import start_server, stop_server

QUESTION = {"type": "noul", "instructions": "Does the customer ask for their money back?"}
OPENAI_QUESTION = {"type": "predicate", "name": "refund", "instructions": QUESTION["instructions"]}
ASKS = [
    "I want a refund for order {n}, it arrived broken.",
    "Please send my money back for order {n}.",
    "Order {n} was wrong; refund me please.",
    "Cancel order {n} and return the payment to my card.",
    "I demand my money back for invoice {n}.",
]
OTHER = [
    "Where is my order {n}? It has not arrived.",
    "Can I change the address on order {n}?",
    "Thanks, order {n} arrived and it is great.",
    "Do you sell gift cards like order {n}?",
    "What are your opening hours this week? (ref {n})",
]


def examples():
    out = []
    for n in range(25):
        out.append({"state": ASKS[n % 5].format(n=100 + n), "answer": True})
        out.append({"state": OTHER[n % 5].format(n=200 + n), "answer": False})
    return out


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_a_task_is_fitted_over_http_and_applied_after_a_restart(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice:alice-key\nbob:bob-key\n")
    args = ("--api-keys-file", str(keys), "--tasks-db", str(tmp_path / "tasks.sqlite3"), "--readout", "letters")
    server = start_server(tmp_path, *args)
    try:
        r = httpx.post(
            server.url + "/v1/tasks", json={"question": QUESTION, "examples": examples()}, headers=auth("alice-key")
        )
        assert r.status_code == 201, r.text
        task_id = r.json()["id"]
        seen, deadline = [], time.monotonic() + 300
        while time.monotonic() < deadline:
            task = httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=auth("alice-key")).json()
            seen.append((task["status"], task["progress"]["done"]))
            if task["status"] in ("ready", "failed"):
                break
            time.sleep(0.05)
        assert task["status"] == "ready", task
        assert task["progress"] == {"done": 50, "total": 50, "eta_s": None}
        assert any(status == "fitting" and 0 < done < 50 for status, done in seen), seen  # progress on the way
        assert task["fit"]["after"]["n"] == 50 and task["fit"]["binding"]["readout"] == "letters"
    finally:
        stop_server(server)

    server = start_server(tmp_path, *args)  # the same file: the task survives the restart
    try:
        named = {**auth("alice-key"), "x-openjev-task": task_id}
        state = "Refund order 999 now, it is broken."
        jev = httpx.post(
            server.url + "/v1/systemone", json={"state": state, "questions": {"q": QUESTION}}, headers=named
        )
        assert jev.status_code == 200, jev.text
        assert jev.headers["x-openjev-calibration"] == f"task:{task_id}"
        oai = httpx.post(
            server.url + "/v1/decisions",
            json={"model": "jev-latest", "input": state, "questions": [OPENAI_QUESTION]},
            headers=named,
        )
        assert oai.status_code == 200, oai.text
        assert oai.headers["x-openjev-calibration"] == f"task:{task_id}"
        batch = httpx.post(
            server.url + "/v1/systemone/batch",
            json={"requests": [{"state": state, "questions": {"q": QUESTION}}]},
            headers={**auth("alice-key"), "accept": "application/json"},  # by wording, no header
        )
        assert batch.json()[0]["x_calibration"] == f"task:{task_id}"
        # the answer is the stored fit applied to the model's raw reading
        raw = httpx.post(
            server.url + "/v1/systemone",
            json={"state": state, "questions": {"q": QUESTION}},
            headers={**auth("bob-key"), "x-openjev-calibration": "none"},
        )
        assert raw.headers["x-openjev-calibration"] == "none"
        p = raw.json()["answers"]["q"]["noul"]
        fit = task["fit"]
        expected = apply(TypeFit(fit["temperature"], tuple(fit["bias"])), (p, 1 - p))[0]
        assert jev.json()["answers"]["q"]["noul"] == pytest.approx(expected, abs=1e-6)
        # another key: cannot see, use or delete it
        assert httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=auth("bob-key")).status_code == 404
        assert httpx.get(f"{server.url}/v1/tasks", headers=auth("bob-key")).json() == {"tasks": [], "next": None}
        used = httpx.post(
            server.url + "/v1/systemone",
            json={"state": state, "questions": {"q": QUESTION}},
            headers={**auth("bob-key"), "x-openjev-task": task_id},
        )
        assert used.status_code == 404
        assert httpx.delete(f"{server.url}/v1/tasks/{task_id}", headers=auth("bob-key")).status_code == 404
        assert httpx.delete(f"{server.url}/v1/tasks/{task_id}", headers=auth("alice-key")).status_code == 204
        assert httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=auth("alice-key")).status_code == 404
    finally:
        stop_server(server)
