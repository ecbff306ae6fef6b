"""A task's fit is engine work like a decision's (api/server/task_jobs.py): each example's
reading is admitted through the service's admission for the task's owner (priced against
the engine's deadline, its tokens counted in flight, measured by the gate), never sent to
the engine past it."""

from __future__ import annotations

import pytest

from tests.api.conftest import running_app
from tests.api.test_tasks import QUESTION, auth, examples, settled
from tests.api.test_twin_admission import Priced


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice:alice-key\n")
    return {"api_keys_file": str(path), "tasks_db": str(tmp_path / "tasks.sqlite3")}


async def test_a_fits_reading_past_the_engines_deadline_is_refused_before_any_engine_work(keys):
    engine = Priced()
    async with running_app(engine, engine_timeout_s=10.0, **keys) as (client, _):
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(12)}, headers=auth("alice-key")
        )
        assert r.status_code == 201, r.text
        engine.seconds = 30.0  # the engine now prices each reading past its 10 s deadline
        task = await settled(client, "alice-key", r.json()["id"])
        assert task["status"] == "failed" and "deadline" in task["error"], task
        assert not [p for p in engine.plans if p.cache_namespace.startswith("task-fit:")]


async def test_a_fits_readings_go_through_the_gate_and_count_in_flight(keys):
    engine = Priced(delay_s=0.02)
    async with running_app(engine, **keys) as (client, _):
        gate = client._transport.app.state.ops.gate
        seen: list[int] = []
        run = gate.inner.run

        async def watched(plan):
            seen.append(gate.in_flight_tokens)  # what the gate holds while the engine reads
            return await run(plan)

        gate.inner.run = watched
        r = await client.post(
            "/v1/tasks", json={"question": QUESTION, "examples": examples(12)}, headers=auth("alice-key")
        )
        task = await settled(client, "alice-key", r.json()["id"])
        assert task["status"] == "ready", task
        fits = [p for p in engine.plans if p.cache_namespace.startswith("task-fit:")]
        assert len(fits) == 12 and len(seen) == 12
        assert seen == [p.unique_tokens for p in fits]  # each reading admitted, its tokens held while it ran
        assert gate.in_flight_tokens == 0
