"""/v1/tasks in-process (the FakeEngine and FakeTokenizer at the engine seam, a real SQLite
file): created, fitted as a job with progress, applied on every decision route by header
and by wording, per key, priced before any engine work, deleted while fitting with
nothing left half-written, kept across a restart."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from openjev.api.server.task_store import open_store
from tests.api.conftest import running_app
from tests.api.test_every_route import EVERY, IDS, Route

QUESTION = {"type": "noul", "instructions": "Is it seven?"}
OPENAI_QUESTION = {"type": "predicate", "name": "q", "instructions": "Is it seven?"}


def examples(count, answer=False):
    return [{"state": f"ticket {i} " + "7 " * (i % 5), "answer": answer} for i in range(count)]


def auth(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice:alice-key\nbob:bob-key\npoor:poor-key tokens_per_min=50\n")
    return {"api_keys_file": str(path), "tasks_db": str(tmp_path / "tasks.sqlite3")}


def calibration_of(route, r):
    """Which fit answered: the batch item's x_calibration, else the response's header."""
    return (r.json()[0]["x_calibration"] or "none") if route.batch else r.headers["x-openjev-calibration"]


async def fitted(client, key, body, timeout=20.0):
    r = await client.post("/v1/tasks", json=body, headers=auth(key))
    assert r.status_code == 201, r.text
    created = r.json()
    assert set(created) == {"id", "status"} and created["status"] in ("queued", "fitting")
    seen = set()
    for _ in range(int(timeout / 0.02)):
        task = (await client.get(f"/v1/tasks/{created['id']}", headers=auth(key))).json()
        seen.add(task["status"])
        if task["status"] in ("ready", "failed"):
            return task, seen
        await asyncio.sleep(0.02)
    raise AssertionError(f"task not fitted in {timeout} s: {task}")


async def settled(client, key, task_id, tries=500):
    """The task once ready or failed (or as it was after `tries` looks, 20 ms apart)."""
    for _ in range(tries):
        task = (await client.get(f"/v1/tasks/{task_id}", headers=auth(key))).json()
        if task["status"] in ("ready", "failed"):
            break
        await asyncio.sleep(0.02)
    return task


async def test_a_task_is_fitted_with_progress_and_reports_its_figures(keys):
    async with running_app(**keys) as (client, engine):
        task, seen = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(30)})
        assert task["status"] == "ready", task
        assert seen <= {"queued", "fitting", "ready"}
        assert task["progress"]["done"] == task["progress"]["total"] == 30
        assert len(engine.plans) == 30  # one reading per example
        fit = task["fit"]
        assert fit["binding"]["wording"] and fit["binding"]["readout"]
        for when in ("before", "after"):
            assert set(fit[when]) == {"n", "accuracy", "brier", "ece", "ece_debiased"} and fit[when]["n"] == 30
        assert fit["after"]["accuracy"] > fit["before"]["accuracy"]  # every gold is false: a bias learns it
        assert set(fit["threshold"]) == {"target_precision", "min_confidence", "coverage", "precision"}
        listed = (await client.get("/v1/tasks", headers=auth("alice-key"))).json()["tasks"]
        assert [t["id"] for t in listed] == [task["id"]]


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_a_fitted_task_applies_on_every_decision_route(keys, route: Route):
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(30)})
        question = OPENAI_QUESTION if route.openai else QUESTION
        body = route.body("ticket 99 7 7", question)
        named = {**auth("alice-key"), "x-openjev-task": task["id"]}
        status, _, r = await route.post(client, body, named)
        assert status == 200, r.text
        applied = calibration_of(route, r)
        assert applied == f"task:{task['id']}"
        # without the header, the question's wording finds it too
        status, _, r = await route.post(client, body, auth("alice-key"))
        applied = calibration_of(route, r)
        assert applied == f"task:{task['id']}"
        # another question: no task by wording, a 409 by header
        other = route.body("ticket 99", {**question, "instructions": "Is it eight?"})
        status, _, r = await route.post(client, other, auth("alice-key"))
        applied = calibration_of(route, r)
        assert applied == "none"
        status, error, _ = await route.post(client, other, named)
        assert status == 409, error
        # another key can neither use it by header nor get it by wording
        status, _, _ = await route.post(client, body, {**auth("bob-key"), "x-openjev-task": task["id"]})
        assert status == 404
        status, _, r = await route.post(client, body, auth("bob-key"))
        applied = calibration_of(route, r)
        assert applied == "none"
        status, _, _ = await route.post(client, body, {**auth("alice-key"), "x-openjev-task": "task_nope"})
        assert status == route.invalid


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_calibration_none_wins_over_a_matching_task_on_every_decision_route(keys, route: Route):
    """The caller's explicit `x-openjev-calibration: none` is the raw reading: neither a ready
    task whose wording matches nor one named by header applies, and the answer is the raw one."""
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(30)})
        question = OPENAI_QUESTION if route.openai else QUESTION
        body = route.body("ticket 99 7 7", question)
        raw = {**auth("alice-key"), "x-openjev-calibration": "none"}
        status, _, matched = await route.post(client, body, raw)
        assert status == 200, matched.text
        assert calibration_of(route, matched) == "none"
        status, _, named = await route.post(client, body, {**raw, "x-openjev-task": task["id"]})
        assert status == 200, named.text
        assert calibration_of(route, named) == "none"
        status, _, fitted_answer = await route.post(client, body, auth("alice-key"))
        assert calibration_of(route, fitted_answer) == f"task:{task['id']}"  # without the header, the task
        status, _, untasked = await route.post(client, body, {**auth("bob-key"), "x-openjev-calibration": "none"})
        answers = [(r.json()[0] if route.batch else r.json())["answers"] for r in (matched, named, untasked)]
        assert (
            answers[0]
            == answers[1]
            == answers[2]
            != (fitted_answer.json()[0] if route.batch else fitted_answer.json())["answers"]
        )


async def test_the_fit_changes_the_answer(keys):
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(40)})
        body = {"state": "ticket 99 7 7", "questions": {"q": QUESTION}}
        plain = await client.post("/v1/systemone", json=body, headers={**auth("bob-key")})
        tasked = await client.post(
            "/v1/systemone", json=body, headers={**auth("alice-key"), "x-openjev-task": task["id"]}
        )
        assert tasked.json()["answers"]["q"]["noul"] < plain.json()["answers"]["q"]["noul"]  # every gold was false


async def test_another_key_cannot_see_or_delete_a_task(keys):
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(12)})
        assert (await client.get(f"/v1/tasks/{task['id']}", headers=auth("bob-key"))).status_code == 404
        assert (await client.get("/v1/tasks", headers=auth("bob-key"))).json() == {"tasks": [], "next": None}
        assert (await client.delete(f"/v1/tasks/{task['id']}", headers=auth("bob-key"))).status_code == 404
        more = await client.post(
            f"/v1/tasks/{task['id']}/examples", json={"examples": examples(1)}, headers=auth("bob-key")
        )
        assert more.status_code == 404
        assert (await client.get(f"/v1/tasks/{task['id']}", headers=auth("alice-key"))).json()["status"] == "ready"
        assert (await client.get(f"/v1/tasks/{task['id']}")).status_code == 401


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"question": QUESTION, "examples": [*examples(11), {"state": "x", "answer": "maybe"}]}, "true or false"),
        (
            {
                "question": {"type": "choice", "criteria": {"a": None, "b": None}},
                "examples": [{"state": f"s{i}", "answer": "c"} for i in range(10)],
            },
            "not one of the task's options",
        ),
        (
            {
                "question": {"type": "score", "criteria": ["low", "high"]},
                "examples": [{"state": "s", "answer": 2}] * 10,
            },
            "level index",
        ),
        ({"question": QUESTION, "examples": examples(9)}, "10 to 20"),
        ({"question": QUESTION, "examples": examples(21)}, "10 to 20"),
    ],
)
async def test_bad_tasks_are_4xx_before_any_engine_work(keys, body, needle):
    async with running_app(max_task_examples=20, **keys) as (client, engine):
        r = await client.post("/v1/tasks", json=body, headers=auth("alice-key"))
        assert r.status_code == 422, r.text
        assert needle in r.text
        assert engine.plans == []
        assert (await client.get("/v1/tasks", headers=auth("alice-key"))).json() == {"tasks": [], "next": None}


async def test_malformed_ids_are_422_and_unknown_ones_404(keys):
    async with running_app(**keys) as (client, _):
        for path in ("/v1/tasks/nope", "/v1/tasks/task_" + "g" * 24):
            assert (await client.get(path, headers=auth("alice-key"))).status_code == 422
            assert (await client.delete(path, headers=auth("alice-key"))).status_code == 422
        assert (await client.get("/v1/tasks/task_" + "0" * 24, headers=auth("alice-key"))).status_code == 404


async def test_a_fit_over_the_keys_budget_is_429_before_any_engine_work(keys):
    """A full bucket pays for one fit beyond it (into debt, as a large request does); the
    key then has no budget: its next fit is refused before anything is read or stored."""
    async with running_app(**keys) as (client, engine):
        first, _ = await fitted(client, "poor-key", {"question": QUESTION, "examples": examples(20)})
        read = len(engine.plans)
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(20)}, headers=auth("poor-key")
        )
        assert r.status_code == 429, r.text
        assert "retry-after" in r.headers
        await asyncio.sleep(0.1)
        assert len(engine.plans) == read
        assert [t["id"] for t in (await client.get("/v1/tasks", headers=auth("poor-key"))).json()["tasks"]] == [
            first["id"]
        ]
        more = {"examples": examples(1)}
        r = await client.post(f"/v1/tasks/{first['id']}/examples", json=more, headers=auth("poor-key"))
        assert r.status_code == 429


async def test_a_task_deleted_while_it_fits_leaves_nothing(keys, tmp_path):
    from tests.support.fakes import FakeEngine

    engine = FakeEngine(delay_s=0.05)
    async with running_app(engine, **keys) as (client, _):
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(40)}, headers=auth("alice-key")
        )
        task_id = r.json()["id"]
        for _ in range(200):
            progress = (await client.get(f"/v1/tasks/{task_id}", headers=auth("alice-key"))).json()
            if progress["status"] == "fitting" and progress["progress"]["done"] >= 2:
                break
            await asyncio.sleep(0.02)
        assert progress["progress"]["total"] == 40 and progress["progress"]["eta_s"] is not None
        assert (await client.delete(f"/v1/tasks/{task_id}", headers=auth("alice-key"))).status_code == 204
        read = len(engine.plans)
        await asyncio.sleep(0.3)
        assert len(engine.plans) <= read + 1  # the job stopped
        assert (await client.get(f"/v1/tasks/{task_id}", headers=auth("alice-key"))).status_code == 404
    conn = sqlite3.connect(keys["tasks_db"])
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM examples").fetchone()[0] == 0


async def test_live_decisions_go_first_a_fit_reads_only_while_none_is_in_flight(keys):
    """A fit's reads are the lowest priority: none starts while a live decision is in flight,
    so a steady client keeps the engine and the fit waits for its gaps."""
    from dataclasses import dataclass, field

    from tests.support.fakes import FakeEngine

    @dataclass
    class TimedEngine(FakeEngine):
        """A FakeEngine that records each call's (namespace, start, end)."""

        calls: list = field(default_factory=list)

        async def run(self, plan):
            start = asyncio.get_running_loop().time()
            try:
                return await super().run(plan)
            finally:
                self.calls.append((plan.cache_namespace, start, asyncio.get_running_loop().time()))

    engine = TimedEngine(delay_s=0.03)
    async with running_app(engine, **keys) as (client, _):
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(20)}, headers=auth("alice-key")
        )
        task_id = r.json()["id"]

        async def live_client(n):
            for i in range(15):
                body = {"state": f"live {n} {i}", "questions": {"q": QUESTION}}
                r = await client.post("/v1/systemone", json=body, headers=auth("bob-key"))
                assert r.status_code == 200, r.text

        await asyncio.gather(*(live_client(n) for n in range(3)))
        task = await settled(client, "alice-key", task_id)
    assert task["status"] == "ready"
    fit = [(start, end) for ns, start, end in engine.calls if ns.startswith("task-fit:")]
    live = [(start, end) for ns, start, end in engine.calls if not ns.startswith("task-fit:")]
    assert len(fit) == 20 and len(live) >= 45
    started_during_live = [s for s, _ in fit if any(ls < s < le for ls, le in live)]
    assert not started_during_live
    # and the live clients were not held off: most of the fit ran after them
    assert sum(s > max(le for _, le in live) for s, _ in fit) >= 10


async def test_a_task_survives_a_restart_and_unfinished_jobs_resume(keys):
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(12)})
    store = open_store(__import__("pathlib").Path(keys["tasks_db"]))
    queued = store.create("alice", QUESTION, "w", examples(12), 0.9)
    store.close()
    async with running_app(**keys) as (client, _):
        body = {"state": "ticket 3", "questions": {"q": QUESTION}}
        r = await client.post("/v1/systemone", json=body, headers={**auth("alice-key"), "x-openjev-task": task["id"]})
        assert r.headers["x-openjev-calibration"] == f"task:{task['id']}"
        resumed = await settled(client, "alice-key", queued.id)
        assert resumed["status"] == "ready"


async def test_a_foreign_store_stops_the_app_at_start(tmp_path):
    from openjev.api.server.app import create_app
    from openjev.config import load_settings
    from openjev.errors import ConfigError

    path = tmp_path / "t.sqlite3"
    path.write_bytes(b"x" * 4096)
    with pytest.raises(ConfigError, match="not an SQLite database"):
        create_app(load_settings({"tasks_db": str(path)}, environ={}))
    assert path.read_bytes() == b"x" * 4096


async def test_more_examples_refit_the_task(keys):
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(12)})
        r = await client.post(
            f"/v1/tasks/{task['id']}/examples", json={"examples": examples(8)}, headers=auth("alice-key")
        )
        assert r.status_code == 202, r.text
        assert (r.json()["status"], r.json()["examples"]) == ("queued", 20)
        for _ in range(500):
            again = (await client.get(f"/v1/tasks/{task['id']}", headers=auth("alice-key"))).json()
            if again["status"] == "ready":
                break
            await asyncio.sleep(0.02)
        assert again["fit"]["after"]["n"] == 20


async def test_a_jev_body_names_its_task_as_the_header_does(keys):
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(12)})
        other, _ = await fitted(
            client, "alice-key", {"question": {**QUESTION, "instructions": "Is it 8?"}, "examples": examples(12)}
        )
        body = {"state": "ticket 1", "questions": {"q": QUESTION}, "x_task": task["id"]}
        r = await client.post("/v1/systemone", json=body, headers=auth("alice-key"))
        assert r.headers["x-openjev-calibration"] == f"task:{task['id']}"
        wrong = await client.post("/v1/systemone", json={**body, "x_task": other["id"]}, headers=auth("alice-key"))
        assert wrong.status_code == 409  # that task is for another question
        both = {**auth("alice-key"), "x-openjev-task": other["id"]}
        assert (await client.post("/v1/systemone", json=body, headers=both)).status_code == 422
        batch = {"requests": [{**body, "x_task": other["id"]}]}
        r = await client.post(
            "/v1/systemone/batch", json=batch, headers={**auth("alice-key"), "accept": "application/json"}
        )
        assert r.json()[0]["status"] == 409
        malformed = await client.post("/v1/systemone", json={**body, "x_task": "nope"}, headers=auth("alice-key"))
        assert malformed.status_code == 422


async def test_the_task_bounds_are_published(keys):
    async with running_app(max_task_examples=77, max_example_tokens=555, **keys) as (client, _):
        limits = (await client.get("/v1/limits", headers=auth("alice-key"))).json()
    assert (limits["max_task_examples"], limits["max_example_tokens"]) == (77, 555)
