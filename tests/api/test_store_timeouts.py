"""When a call to the shared limits store counts as failed (api/identity/shared.py): only
when Redis is what kept it, never this process's own busy loop or its queue for a
connection. A hung Redis (SIGSTOP) fails a call within its timeout; the same Redis
resumed is rejoined by the next call after RETRY_S."""

from __future__ import annotations

import asyncio
import time

import pytest

from openjev.api.identity.buckets import BucketId, Take
from openjev.api.identity.shared import RETRY_S, RedisBuckets, RedisStore
from openjev.errors import LimitsUnavailable

TIMEOUT_S = 0.2
TAKE = [Take(BucketId("k", "requests_per_min", 60), 1, 60)]


@pytest.fixture
async def shared(redis_server):
    if redis_server.process is None:
        redis_server.start()
    redis_server.flush()
    store = RedisStore(redis_server.url, "closed", TIMEOUT_S, 1)
    yield store
    redis_server.resume()
    await store.close()


async def test_a_hung_redis_fails_the_call_within_its_timeout_and_is_rejoined_once_resumed(shared, redis_server):
    buckets = RedisBuckets(shared)
    assert (await buckets.take(TAKE)).wait_s == 0  # connected, the script loaded
    redis_server.pause()
    start = time.monotonic()
    with pytest.raises(LimitsUnavailable):
        await buckets.take(TAKE)
    assert time.monotonic() - start < 4 * TIMEOUT_S, "a hung store must fail the call about its timeout"
    assert shared.health.describe() == {"backend": "redis", "mode": "closed", "reachable": False}
    redis_server.resume()
    with pytest.raises(LimitsUnavailable):  # within RETRY_S of the failure: the mode, no call tried
        await buckets.take(TAKE)
    await asyncio.sleep(RETRY_S + 0.1)
    assert (await buckets.take(TAKE)).wait_s == 0
    assert shared.health.up


async def test_a_loop_blocked_past_the_timeout_is_not_taken_for_redis_being_away(shared):
    buckets = RedisBuckets(shared)
    loop = asyncio.get_running_loop()
    loop.call_soon(time.sleep, 3 * TIMEOUT_S)  # this process busy (a long compile on the loop)
    assert (await buckets.take(TAKE)).wait_s == 0
    assert shared.health.up and shared.health.switches == 0


async def test_a_call_queued_behind_answered_redis_calls_waits_again_and_one_alone_fails(shared):
    """Fakes of a call's own work (`make`) at the seam: the first is slower than the
    timeout while others are answered meanwhile (this process's queue for a connection),
    so it is waited again; the same slowness with nothing answered is a failure."""

    async def slow() -> str:
        await asyncio.sleep(1.6 * TIMEOUT_S)
        return "late"

    async def quick() -> str:
        await asyncio.sleep(0.3 * TIMEOUT_S)
        return "quick"

    async def answered_meanwhile() -> None:
        for _ in range(4):
            assert await shared.call(quick) == (True, "quick")

    queued, _ = await asyncio.gather(shared.call(slow), answered_meanwhile())
    assert queued == (True, "late") and shared.health.up
    assert await shared.call(slow) == (False, None)
    assert not shared.health.up
