"""The `Buckets` port's two stores hold one rule (api/identity/buckets.py): the same steps on
the in-memory store and on a real redis-server (Lua scripts, api/identity/shared.py) leave
the same levels. Levels refill at 1 a second here (60 a minute), so a few milliseconds
between steps move them by well under the tolerance."""

from __future__ import annotations

import math

import pytest

from openjev.api.identity.buckets import BucketId, MemoryBuckets, Take
from openjev.api.identity.shared import RedisBuckets, RedisStore

NEAR = 0.05  # tokens of refill the steps' own milliseconds may add


@pytest.fixture(params=["memory", "redis"])
async def store(request):
    if request.param == "memory":
        yield MemoryBuckets()
        return
    server = request.getfixturevalue("redis_server")
    if server.process is None:
        server.start()
    server.flush()
    shared = RedisStore(server.url, "closed", 1.0, 1)  # closed: a failed call raises, never passes unseen
    yield RedisBuckets(shared)
    await shared.close()


async def test_a_take_is_all_or_nothing_and_says_which_part_refused(store):
    requests, tokens = BucketId("k", "requests_per_min", 60), BucketId("k", "tokens_per_min", 60)
    assert (await store.take([Take(requests, 1, 60), Take(tokens, 50, 60)])).wait_s == 0
    refused = await store.take([Take(requests, 1, 60), Take(tokens, 20, 60)])
    assert refused.refused == 1 and refused.wait_s == pytest.approx(10, abs=0.2)  # 10 tokens short at 1 a second
    assert await store.level(requests) == pytest.approx(59, abs=NEAR)  # the request was not taken either
    assert await store.level(tokens) == pytest.approx(10, abs=NEAR)
    assert await store.level(BucketId("other", "tokens_per_min", 60)) is None  # never touched: full


async def test_a_guard_in_debt_refuses_before_anything_is_taken(store):
    requests, tokens = BucketId("k", "requests_per_min", 60), BucketId("k", "tokens_per_min", 60)
    await store.charge(tokens, 100, floor=-60)
    assert await store.level(tokens) == pytest.approx(-40, abs=NEAR)
    taken = await store.take([Take(requests, 1, 60)], guard=tokens)
    assert taken.debt == pytest.approx(40, abs=NEAR) and taken.wait_s == 0
    level = await store.level(requests)  # nothing taken: full (None: never written)
    assert level is None or level == pytest.approx(60, abs=NEAR), level


async def test_charges_stop_at_their_floor_and_refunds_at_the_capacity(store):
    tokens = BucketId("k", "tokens_per_min", 60)
    await store.charge(tokens, 10_000, floor=-60)
    assert await store.level(tokens) == pytest.approx(-60, abs=NEAR)
    await store.charge(tokens, 0, refund=10_000)
    assert await store.level(tokens) == pytest.approx(60, abs=NEAR)
    await store.charge(tokens, 100)  # no floor: an admitted request's own work
    assert await store.level(tokens) == pytest.approx(-40, abs=NEAR)
    await store.charge(tokens, 5, floor=-20)  # past the floor already: left where it is
    assert await store.level(tokens) == pytest.approx(-40, abs=NEAR)
    assert math.isfinite(await store.level(tokens))


async def test_a_refund_comes_before_the_take_in_one_step(store):
    tokens = BucketId("k", "tokens_per_min", 60)
    assert (await store.take([Take(tokens, 50, 60)])).wait_s == 0  # a reservation
    taken = await store.take([Take(tokens, 55, 60, refund=50)])  # handed back, then the real cost
    assert taken.wait_s == 0 and await store.level(tokens) == pytest.approx(5, abs=NEAR)
