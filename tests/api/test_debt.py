"""Debt reserved before work, and capped (issue 48, item 4), on every decision route.

The issue's: a key with tokens_per_min=3000 sending 64 refused 2 MB bodies at once had all
64 compiled (19.2 s of CPU), its debt reached 21.1 M tokens and its Retry-After 422,348 s
(4.9 days); one honest 40,000-token mistake locked a key out for 741 s. Now the door
reserves each body's work (a quarter of its bytes, at most a minute's budget) before it
is read, so bodies past the key's remaining budget are 429s that compile nothing, and a
refusal's charge leaves at most one minute's budget of debt: Retry-After at most ~61 s."""

from __future__ import annotations

import asyncio

import pytest

from openjev.api.identity.buckets import TokenBucket
from openjev.api.identity.reservation import reserved_tokens
from tests.api.conftest import running_app
from tests.api.test_every_route import EVERY, IDS

CAP_RETRY_S = 61  # one minute's budget of debt refills in 60 s (+1 token, rounded up)


def _counting_compiles(monkeypatch) -> list[int]:
    from openjev.core.prompts import PromptCompiler

    compiles: list[int] = []
    original = PromptCompiler.compile

    def counted(self, request, *args, **kwargs):
        compiles.append(len(request.questions))
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(PromptCompiler, "compile", counted)
    return compiles


@pytest.mark.parametrize("route", EVERY, ids=IDS)
@pytest.mark.usefixtures("limits_store")
async def test_64_concurrent_refused_bodies_compile_once_and_the_retry_is_capped(monkeypatch, route):
    compiles = _counting_compiles(monkeypatch)
    async with running_app(api_keys=("key-a", "key-b"), key_tokens_per_min=3000, max_in_flight=64) as (client, engine):
        a = {"Authorization": "Bearer key-a"}
        refused = route.body("7 " * 40_000)  # 40,000 tokens: past the 32,768 per branch
        results = await asyncio.gather(*(route.post(client, refused, a) for _ in range(64)))
        statuses = sorted(status for status, _, _ in results)
        assert statuses == [route.invalid] + [429] * 63, statuses
        assert len(compiles) == 1, f"{len(compiles)} of 64 concurrent refused bodies were compiled"
        for status, _, r in results:
            if status == 429 and "retry-after" in r.headers:
                assert int(r.headers["retry-after"]) <= CAP_RETRY_S, r.headers["retry-after"]
        status, error, r = await route.post(client, route.body("7 7"), a)  # in debt: 429, capped
        assert status == 429, error
        retry = int(r.headers["retry-after"]) if r.status_code == 429 else error.get("retry_after")
        assert retry is not None and retry <= CAP_RETRY_S, retry
        assert engine.plans == []
        status, _, _ = await route.post(client, route.body("7 7"), {"Authorization": "Bearer key-b"})
        assert status == 200  # another key is served


@pytest.mark.usefixtures("limits_store")
async def test_one_40000_token_mistake_locks_a_key_out_for_at_most_a_minute():
    async with running_app(api_keys=("key-a",), key_tokens_per_min=3000) as (client, _):
        a = {"Authorization": "Bearer key-a"}
        body = {
            "model": "jev-latest",
            "state": "7 " * 40_000,
            "questions": {"q": {"type": "noul", "instructions": "Refund?"}},
        }
        r = await client.post("/v1/systemone", json=body, headers=a)
        assert r.status_code == 422 and "per branch" in r.text, r.text[:300]
        small = {"model": "jev-latest", "state": "7", "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}
        r = await client.post("/v1/systemone", json=small, headers=a)
        assert r.status_code == 429 and int(r.headers["retry-after"]) <= CAP_RETRY_S, r.headers  # was 741 s


def test_the_bucket_debt_stops_at_its_floor_and_a_refund_at_its_capacity():
    now = [0.0]
    bucket = TokenBucket(3000, clock=lambda: now[0])
    bucket.charge(21_100_000, floor=-3000)
    assert bucket.level == -3000
    bucket.charge(-10_000)
    assert bucket.level == 3000  # a refund never fills past the capacity
    bucket.charge(5000)  # no floor: an admitted request's debt is its own work
    assert bucket.level == -2000
    bucket.charge(100, floor=-1000)  # already past the floor: a charge leaves it where it is
    assert bucket.level == -2000


def test_the_door_reserves_a_quarter_of_the_declared_bytes_at_most_a_minutes_budget():
    assert reserved_tokens("400", encoded=False, per_min=3000) == 100
    assert reserved_tokens("2000000", encoded=False, per_min=3000) == 3000
    assert reserved_tokens("400", encoded=True, per_min=3000) == 3000  # compressed: size unknown
    assert reserved_tokens(None, encoded=False, per_min=3000) == 3000  # chunked: size unknown
