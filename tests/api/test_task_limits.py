"""/v1/tasks under a hostile tenant, in-process (the FakeEngine and FakeTokenizer at the
engine seam, a real SQLite file): writes priced before work and refused work charged, an
add compiling only its new examples, the example cap and the per-key queue cap held under
concurrent requests, fits taking turns across keys, listings paged and counted, and the
store's file locked from outside holding up no one but the store's callers."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from dataclasses import dataclass, field

import pytest

from openjev.api.server.task_queue import FairTurns
from openjev.api.server.task_thread import StoreThread
from openjev.core.service import DecisionService
from openjev.errors import NotReady
from tests.api.conftest import running_app
from tests.api.test_tasks import QUESTION, auth, examples, fitted, settled
from tests.support.fakes import FakeEngine

LONG = {"state": "word " * 300, "answer": True}  # far over the tests' --max-example-tokens


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text(
        "alice:alice-key\nbob:bob-key\n"
        "tight:tight-key tokens_per_min=1500\n"  # room for one task's body, not many refusals
        "few:few-key requests_per_min=3\n"
    )
    return {"api_keys_file": str(path), "tasks_db": str(tmp_path / "tasks.sqlite3")}


@pytest.fixture
def compiles(monkeypatch):
    """Every compile of an example or a request (DecisionService.prepare_now), counted."""
    seen: list[int] = []
    real = DecisionService.prepare_now

    def counted(self, *args, **kwargs):
        seen.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DecisionService, "prepare_now", counted)
    return seen


@dataclass
class HeldEngine(FakeEngine):
    """A FakeEngine whose fit readings wait until `release` is set; each reading's namespace recorded."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    read: list = field(default_factory=list)

    async def run(self, plan):
        if plan.cache_namespace.startswith("task-fit:"):
            await self.release.wait()
            self.read.append(plan.cache_namespace)
        return await super().run(plan)


async def test_a_refused_write_is_charged_so_a_limited_key_gets_429(keys, compiles):
    """An example over --max-example-tokens is found first (the longest body is compiled
    first), and what was compiled is charged: repeating the refusal runs the key out."""
    body = {"question": QUESTION, "examples": [*examples(19), LONG]}
    async with running_app(max_example_tokens=64, **keys) as (client, _):
        r = await client.post("/v1/tasks", json=body, headers=auth("alice-key"))
        assert r.status_code == 422 and "example 19 takes" in r.text, r.text
        assert len(compiles) == 1  # the long one alone, not the 19 before it
        statuses = [
            (await client.post("/v1/tasks", json=body, headers=auth("tight-key"))).status_code for _ in range(6)
        ]
        assert statuses[0] == 422 and 429 in statuses, statuses
        limited = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(10)}, headers=auth("tight-key")
        )
        assert limited.status_code == 429 and "retry-after" in limited.headers
        assert (await client.get("/v1/tasks", headers=auth("tight-key"))).json()["tasks"] == []


async def test_an_add_compiles_only_its_new_examples(keys, compiles):
    async with running_app(max_example_tokens=64, **keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(30)})
        compiles.clear()
        r = await client.post(f"/v1/tasks/{task['id']}/examples", json={"examples": [LONG]}, headers=auth("alice-key"))
        assert r.status_code == 422 and "example 30 takes" in r.text, r.text
        assert len(compiles) == 1  # the stored 30 are priced at their kept counts
        r = await client.post(
            f"/v1/tasks/{task['id']}/examples", json={"examples": examples(2)}, headers=auth("alice-key")
        )
        assert r.status_code == 202 and r.json()["examples"] == 32
        assert (await settled(client, "alice-key", task["id"]))["status"] == "ready"


async def test_concurrent_adds_never_pass_the_example_cap(keys):
    async with running_app(max_task_examples=100, **keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(10)})
        path = f"/v1/tasks/{task['id']}/examples"

        async def add(n):
            more = [{"state": f"more {n} {i}", "answer": True} for i in range(9)]
            return (await client.post(path, json={"examples": more}, headers=auth("alice-key"))).status_code

        statuses = await asyncio.gather(*(add(n) for n in range(20)))
        assert sorted(set(statuses)) == [202, 422], statuses
        assert statuses.count(202) == 10  # 10 + 10 x 9 = 100, the cap
        held = (await client.get(f"/v1/tasks/{task['id']}", headers=auth("alice-key"))).json()["examples"]
        assert held == 100


async def test_a_key_has_at_most_max_queued_tasks_waiting_and_fits_take_turns_across_keys(keys):
    engine = HeldEngine()
    async with running_app(engine, max_queued_tasks=3, **keys) as (client, _):
        made = []
        for _ in range(3):
            r = await client.post(
                "/v1/tasks", json={"question": QUESTION, "examples": examples(10)}, headers=auth("alice-key")
            )
            assert r.status_code == 201, r.text
            made.append(r.json()["id"])
        over = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(10)}, headers=auth("alice-key")
        )
        assert over.status_code == 429 and "--max-queued-tasks" in over.text and "retry-after" in over.headers
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(10)}, headers=auth("bob-key")
        )
        assert r.status_code == 201  # the cap is per key
        bob = r.json()["id"]
        await asyncio.sleep(0.05)
        engine.release.set()
        for task_id, key in [*((m, "alice-key") for m in made), (bob, "bob-key")]:
            assert (await settled(client, key, task_id))["status"] == "ready"
        # alice's first task held the engine when bob's came; bob's was read next, before alice's others
        assert engine.read[10:20] == ["task-fit:bob"] * 10, engine.read
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(10)}, headers=auth("alice-key")
        )
        assert r.status_code == 201  # fitted: room again


async def test_fair_turns_round_robin_by_owner_and_a_cancelled_waiter_leaves():
    turns, order = FairTurns(), []
    first_in = asyncio.Event()
    go = asyncio.Event()

    async def job(owner, n):
        async with turns.turn(owner):
            order.append(f"{owner}{n}")
            first_in.set()
            await go.wait()

    holder = asyncio.create_task(job("a", 0))
    await first_in.wait()
    waiting = [asyncio.create_task(job(o, n)) for o, n in [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("b", 2)]]
    await asyncio.sleep(0)
    gone = asyncio.create_task(job("c", 2))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    assert turns.waiting() == {"a": 3, "b": 2, "c": 1}
    go.set()
    await asyncio.gather(holder, *waiting)
    assert order == ["a0", "b1", "a1", "c1", "b2", "a2", "a3"]  # the holder's owner after the others


async def test_listings_are_paged(keys):
    async with running_app(max_queued_tasks=0, **keys) as (client, _):
        made = []
        for n in range(5):
            body = {"question": {**QUESTION, "instructions": f"Is it {n}?"}, "examples": examples(10)}
            made.append((await client.post("/v1/tasks", json=body, headers=auth("alice-key"))).json()["id"])
        seen, after, pages = [], None, 0
        while True:
            params = {"limit": 2, **({"after": after} if after else {})}
            page = (await client.get("/v1/tasks", params=params, headers=auth("alice-key"))).json()
            seen += [t["id"] for t in page["tasks"]]
            pages, after = pages + 1, page["next"]
            if after is None:
                break
        assert seen == made and pages == 3
        whole = (await client.get("/v1/tasks", headers=auth("alice-key"))).json()
        assert [t["id"] for t in whole["tasks"]] == made and whole["next"] is None
        for bad in ({"limit": 0}, {"limit": 501}, {"after": "nope"}, {"after": "inf~" + made[0]}):
            assert (await client.get("/v1/tasks", params=bad, headers=auth("alice-key"))).status_code == 422


async def test_every_task_route_is_one_of_the_keys_requests(keys):
    async with running_app(**keys) as (client, _):
        calls = [
            client.get("/v1/tasks", headers=auth("few-key")),
            client.get("/v1/tasks/task_" + "0" * 24, headers=auth("few-key")),
            client.delete("/v1/tasks/task_" + "0" * 24, headers=auth("few-key")),
            client.get("/v1/tasks", headers=auth("few-key")),
        ]
        statuses = [(await call).status_code for call in calls]
        assert statuses == [200, 404, 404, 429], statuses
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(10)}, headers=auth("few-key")
        )
        assert r.status_code == 429
        assert (await client.get("/v1/tasks", headers=auth("alice-key"))).status_code == 200  # another key's own


async def test_a_store_locked_from_outside_holds_up_only_its_callers(keys):
    """While another process holds the store's file, the health probe and a decision without
    a task answer; a decision naming a task waits for the store (its own thread), then answers."""
    async with running_app(**keys) as (client, _):
        task, _ = await fitted(client, "alice-key", {"question": QUESTION, "examples": examples(10)})
        outside = sqlite3.connect(keys["tasks_db"], check_same_thread=False, isolation_level=None)
        outside.execute("BEGIN EXCLUSIVE")
        released = threading.Event()

        def release():
            outside.execute("COMMIT")
            released.set()

        timer = threading.Timer(3.0, release)
        timer.start()
        try:
            body = {"state": "ticket 1 7", "questions": {"q": QUESTION}}
            named = asyncio.create_task(
                client.post("/v1/systemone", json=body, headers={**auth("alice-key"), "x-openjev-task": task["id"]})
            )
            await asyncio.sleep(0.2)  # the named task's read is waiting on the file
            assert not named.done()
            assert (await client.get("/health/live")).status_code == 200
            plain = await client.post("/v1/systemone", json=body, headers=auth("bob-key"))
            assert plain.status_code == 200
            assert not released.is_set()  # both answered while the file was locked
            r = await named
            assert r.status_code == 200 and r.headers["x-openjev-calibration"] == f"task:{task['id']}"
        finally:
            timer.join()
            outside.close()


async def test_a_store_call_past_the_busy_timeout_is_a_503():
    def locked():
        raise sqlite3.OperationalError("database is locked")

    thread = StoreThread()
    with pytest.raises(NotReady) as caught:
        await thread.call(locked)
    assert caught.value.status == 503
    thread.close()
