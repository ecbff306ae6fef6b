"""A request and its content-free twin are one decision's work (core/content_free.py): the
service prepares both plans, then admits them for the caller as one (core/ports.py
`Admission.admit`, api/identity/admission.py `GatedEngine.admit`), priced together against
the queue and the deadline, on every decision route. The twin is never gated as a second
request queued behind its own first (which refused it, 529, on every retry)."""

from __future__ import annotations

import pytest

from tests.api.conftest import running_app
from tests.api.test_content_free_routes import CHOICE, OPENAI_CHOICE, _calibration
from tests.api.test_every_route import EVERY, IDS
from tests.support.fakes import FakeEngine

A, B = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}


def _gate(client):
    return client._transport.app.state.ops.gate  # the app behind running_app's in-process client


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_a_request_and_its_twin_are_admitted_as_one_on_an_empty_queue(tmp_path, route):
    engine = FakeEngine(delay_s=0.05)
    async with running_app(engine, calibration=_calibration(tmp_path), api_keys=("key-a", "key-b")) as (client, _):
        body = route.body("I was charged twice.", _choice(route))
        status, error, _ = await route.post(client, body, B)  # measures the drain rate; its own twin read
        assert status == 200, error
        pair = sum(plan.unique_tokens for plan in engine.plans[-2:])
        gate = _gate(client)
        rate = gate.rate.per_second()
        assert len(engine.plans) == 2 and rate
        # The pair takes longer than the queue wait at the measured rate, but nothing else is in
        # flight: it waits behind no one, so it is served (its twin, key-a's own, read beside it).
        gate.max_wait_s = 0.9 * pair / rate
        for _ in range(3):  # never a 529 that a retry meets again
            status, error, _ = await route.post(client, route.body("Charged twice again.", _choice(route)), A)
            assert status == 200, error
        assert len(engine.plans) == 2 + 2 + 1 + 1  # key-a's first read its twin; its retries found it cached
        assert gate.in_flight_tokens == 0


def _choice(route):
    return OPENAI_CHOICE if route.openai else CHOICE


class Priced(FakeEngine):
    """The fake engine with a cost model: each plan `seconds` by itself (Engine.estimate_s)."""

    seconds: float = 0.0

    def estimate_s(self, plan):
        return self.seconds


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_a_request_and_its_twin_are_priced_as_one_against_the_deadline(tmp_path, route):
    engine = Priced()
    engine.seconds = 6.0  # each plan alone within the 10 s deadline; the pair, 12 s, is not
    settings = {"calibration": _calibration(tmp_path), "engine_timeout_s": 10.0}
    async with running_app(engine, **settings) as (client, _):
        alone = route.body("Alone.", {"type": "noul", "instructions": "Is it seven?"} if not route.openai else None)
        status, error, _ = await route.post(client, alone, {})  # no twin (no content-free fit): one plan
        assert status == 200, error
        plans = len(engine.plans)
        status, error, _ = await route.post(client, route.body("With its twin.", _choice(route)), {})
        assert status == route.invalid, error  # too large for the server by itself: a 4xx, not a 529
        assert "about 12 s" in error["message"] and "10 s deadline" in error["message"]
        assert len(engine.plans) == plans  # refused before any engine work, the twin's included
        assert _gate(client).in_flight_tokens == 0
