"""/v1/outcomes in-process (the FakeEngine at the engine seam, a real SQLite file): every
decision route records its decisions under its request id, outcomes are accepted all or
nothing, per key, and feed their question's task, refitted from the stored readings with
no engine work; each answer says which fit answered and what it rests on."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import CARD, running_app
from tests.api.test_every_route import EVERY, IDS, Route

QUESTION = {"type": "noul", "instructions": "Is it seven?"}
CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}}
OPENAI_QUESTION = {"type": "predicate", "name": "q", "instructions": "Is it seven?"}


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice:alice-key\nbob:bob-key\n")
    return {"api_keys_file": str(path), "tasks_db": str(tmp_path / "tasks.sqlite3")}


async def decide(client, route: Route, state: str, key="alice-key", question=None):
    """(decision id, response) of one decision on `route`."""
    q = question or (OPENAI_QUESTION if route.openai else QUESTION)
    status, error, r = await route.post(client, route.body(state, q), auth(key))
    assert status == 200, error
    rid = r.headers["x-typesafe-request-id"]
    return (f"{rid}:0" if route.batch else rid), r


async def post(client, outcomes, key="alice-key"):
    return await client.post("/v1/outcomes", json={"outcomes": outcomes}, headers=auth(key))


async def tasks_of(client, key="alice-key"):
    return (await client.get("/v1/tasks", headers=auth(key))).json()["tasks"]


async def ready(client, task_id, key="alice-key", tries=500):
    for _ in range(tries):
        task = (await client.get(f"/v1/tasks/{task_id}", headers=auth(key))).json()
        if task["status"] == "ready":
            return task
        await asyncio.sleep(0.02)
    raise AssertionError(f"task not ready: {task}")


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_every_decision_route_keeps_its_decision_for_an_outcome(keys, route: Route):
    async with running_app(**keys) as (client, _):
        decision, _ = await decide(client, route, "ticket 1 7")
        name = "q"  # Jev's key in `questions`; OpenAI's question `name`
        r = await post(client, [{"decision_id": decision, "question": name, "answer": True}])
        assert r.status_code == 200, r.text
        (accepted,) = r.json()["outcomes"]
        assert r.json()["accepted"] == 1 and accepted["status"] == "new" and accepted["question"] == name
        # by index too; the same answer again changes nothing, another answer wins
        r = await post(client, [{"decision_id": decision, "question": 0, "answer": True}])
        assert r.json()["outcomes"][0]["status"] == "same"
        r = await post(client, [{"decision_id": decision, "question": name, "answer": False}])
        assert r.json()["outcomes"][0]["status"] == "changed"
        (task,) = await tasks_of(client)
        assert task["id"] == accepted["task"] and task["status"] == "collecting"
        assert task["outcomes"] == 1 and task["examples"] == 0
        assert task["question"]["instructions"] == "Is it seven?"
        # another key: the decision is not its own
        r = await post(client, [{"decision_id": decision, "question": name, "answer": True}], key="bob-key")
        assert r.status_code == 404, r.text
        assert await tasks_of(client, "bob-key") == []


async def test_bad_outcomes_are_refused_whole_and_change_nothing(keys):
    route = EVERY[0]
    async with running_app(**keys) as (client, _):
        first, _ = await decide(client, route, "ticket 1", question=CHOICE)
        good = {"decision_id": first, "question": "q", "answer": "billing"}
        bad = [
            ({"decision_id": first, "question": "q", "answer": "sales"}, 422),  # not one of the options
            ({"decision_id": first, "question": "q", "answer": True}, 422),  # a choice's answer is a name
            ({"decision_id": "req_" + "0" * 32, "question": "q", "answer": "tech"}, 404),  # unknown
            ({"decision_id": first, "question": "other", "answer": "tech"}, 404),  # no such question
            ({"decision_id": first, "question": 3, "answer": "tech"}, 404),
            ({"decision_id": first, "question": "q", "answer": "tech", "extra": 1}, 422),  # strict body
            ({"decision_id": "no spaces allowed", "question": "q", "answer": "tech"}, 422),
            ({"decision_id": first, "question": -1, "answer": "tech"}, 422),
            ({"decision_id": first, "question": True, "answer": "tech"}, 422),
        ]
        for item, status in bad:
            r = await post(client, [good, item])
            assert r.status_code == status, (item, r.text)
        for body in ({"outcomes": []}, {"outcomes": [good] * 1001}, {}, {"outcomes": good}, []):
            r = await client.post("/v1/outcomes", json=body, headers=auth("alice-key"))
            assert r.status_code == 422, (str(body)[:80], r.text)
        r = await client.post(
            "/v1/outcomes", content=b'{"outcomes": [', headers={**auth("alice-key"), "content-type": "application/json"}
        )
        assert r.status_code in (400, 422)
        assert await tasks_of(client) == []  # nothing kept, no task made
        r = await post(client, [good])
        assert r.json()["outcomes"][0]["status"] == "new"  # the refused calls kept nothing of it


async def test_outcomes_make_the_task_ready_without_engine_work_and_answers_say_so(keys):
    route = EVERY[0]
    async with running_app(**keys) as (client, engine):
        body = route.body("ticket 0 7", QUESTION)
        r = await client.post(route.path, json=body, headers=auth("alice-key"))
        assert r.headers["x-openjev-calibration-basis"].endswith("basis=none")
        assert r.json()["answers"]["q"]["x_basis"] == {"kind": "none"}
        outcomes = []
        for i in range(12):
            decision, _ = await decide(client, route, f"ticket {i} " + "7 " * (i % 3))
            outcomes.append({"decision_id": decision, "question": "q", "answer": i % 4 != 0})
        plans = len(engine.plans)
        r = await post(client, outcomes)
        assert r.status_code == 200, r.text
        task = await ready(client, r.json()["outcomes"][0]["task"])
        assert len(engine.plans) == plans  # the refit read the stored readings: no engine work
        assert task["fit"]["rests_on"]["outcomes"] == 12 and task["fit"]["rests_on"]["examples"] == 0
        assert task["outcomes"] == 12
        r = await client.post(route.path, json=route.body("ticket 99", QUESTION), headers=auth("alice-key"))
        assert r.headers["x-openjev-calibration"] == f"task:{task['id']}"
        basis = r.headers["x-openjev-calibration-basis"]
        assert basis.startswith(f"task:{task['id']}; basis=task; examples=0; outcomes=12; cv_ece=")
        x_basis = r.json()["answers"]["q"]["x_basis"]
        assert x_basis["kind"] == "task" and x_basis["outcomes"] == 12 and x_basis["examples"] == 0
        assert x_basis["cv_ece"] == pytest.approx(task["fit"]["after"]["ece"])
        # bob's same question is answered by no task of alice's
        r = await client.post(route.path, json=route.body("ticket 99", QUESTION), headers=auth("bob-key"))
        assert r.headers["x-openjev-calibration"] == "none"


async def test_a_task_with_examples_refits_on_both_from_stored_readings(keys):
    route = EVERY[0]
    async with running_app(**keys) as (client, engine):
        examples = [{"state": f"ticket {i} " + "7 " * (i % 5), "answer": i % 2 == 0} for i in range(20)]
        r = await client.post("/v1/tasks", json={"question": QUESTION, "examples": examples}, headers=auth("alice-key"))
        task = await ready(client, r.json()["id"])
        assert (task["fit"]["rests_on"]["examples"], task["fit"]["rests_on"]["outcomes"]) == (20, 0)
        refits = client._transport.app.state.outcomes.refits
        refits.min_interval_s = 0.5  # the schedule's T (30 s), shortened: the refit comes T after the last fit
        outcomes = []
        for i in range(10):
            decision, _ = await decide(client, route, f"case {i}")
            outcomes.append({"decision_id": decision, "question": "q", "answer": True})
        plans = len(engine.plans)
        r = await post(client, outcomes)
        assert {o["task"] for o in r.json()["outcomes"]} == {task["id"]}  # joined the task of its wording
        for _ in range(500):
            task = (await client.get(f"/v1/tasks/{task['id']}", headers=auth("alice-key"))).json()
            if task["fit"]["rests_on"]["outcomes"] == 10:
                break
            await asyncio.sleep(0.02)
        assert task["fit"]["rests_on"]["examples"] == 20 and task["fit"]["rests_on"]["outcomes"] == 10
        assert task["outcomes"] == 10 and task["examples"] == 20
        assert len(engine.plans) == plans  # the examples' readings were kept by the example job


async def test_outcomes_and_tasks_survive_a_restart(keys):
    route = EVERY[0]
    async with running_app(**keys) as (client, _):
        ids = [(await decide(client, route, f"ticket {i}"))[0] for i in range(11)]
        r = await post(client, [{"decision_id": d, "question": "q", "answer": True} for d in ids[:10]])
        task = await ready(client, r.json()["outcomes"][0]["task"])
    async with running_app(**keys) as (client, _):
        (again,) = await tasks_of(client)
        assert again["id"] == task["id"] and again["status"] == "ready" and again["outcomes"] == 10
        r = await post(client, [{"decision_id": ids[10], "question": "q", "answer": False}])
        assert r.status_code == 200 and r.json()["outcomes"][0]["task"] == task["id"]


async def test_recording_off_keeps_nothing(keys):
    async with running_app(**keys, outcome_retention="0") as (client, _):
        decision, _ = await decide(client, EVERY[0], "ticket 1")
        r = await post(client, [{"decision_id": decision, "question": "q", "answer": True}])
        assert r.status_code == 404


def _sample(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    return 0.0


async def test_recorded_decisions_are_counted_in_metrics(keys):
    async with running_app(**keys) as (client, _):
        for i in range(3):
            await decide(client, EVERY[0], f"ticket {i}")
        await post(client, [{"decision_id": (await decide(client, EVERY[0], "x"))[0], "question": "q", "answer": True}])
        text = (await client.get("/metrics")).text
        assert _sample(text, "openjev_outcome_decisions_recorded_total") == 4
        assert _sample(text, "openjev_outcome_decisions_dropped_total") == 0


async def test_a_task_fed_by_outcomes_is_refused_under_other_weights(keys):
    route = EVERY[0]
    async with running_app(**keys) as (client, _):
        ids = [(await decide(client, route, f"ticket {i}"))[0] for i in range(12)]
        r = await post(client, [{"decision_id": d, "question": "q", "answer": i % 3 == 0} for i, d in enumerate(ids)])
        task = await ready(client, r.json()["outcomes"][0]["task"])
    other = replace(CARD, fingerprint="other-weights")
    async with running_app(**keys, card=other) as (client, _):
        body = route.body("ticket 99", QUESTION)
        r = await client.post(route.path, json=body, headers=auth("alice-key"))
        assert r.headers["x-openjev-calibration"] == "none"  # not applied by wording
        r = await client.post(route.path, json=body, headers={**auth("alice-key"), "x-openjev-task": task["id"]})
        assert r.status_code == 409 and "weights" in r.text
        # new outcomes under these weights: the old ones, read by other weights, are not fitted on
        fresh = [(await decide(client, route, f"case {i}"))[0] for i in range(3)]
        r = await post(client, [{"decision_id": d, "question": "q", "answer": True} for d in fresh])
        assert r.status_code == 200 and r.json()["outcomes"][0]["task"] == task["id"]
        refits = client._transport.app.state.outcomes.refits
        stored = await asyncio.to_thread(client._transport.app.state.tasks.store.get, "alice", task["id"])
        assert await asyncio.to_thread(refits.fit_of, stored) is None  # 3 readings under these weights: too few
