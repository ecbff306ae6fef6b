"""When a call to the shared limits store counts as failed (api/identity/shared.py): only
when Redis is what kept it, never this process's own busy loop or its queue for a
connection. A hung Redis (SIGSTOP) fails a call within its timeout; the same Redis
resumed is rejoined by the next call after RETRY_S."""

from __future__ import annotations

import asyncio
import time

import pytest

from openjev.api.identity.buckets import BucketId, Take
from openjev.api.identity.leases import Leases, released_of
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


LEASES = "openjev:inflight:k"


def _zcard(redis_server, key: str = LEASES) -> int:
    return int(redis_server.command("ZCARD", key).strip().lstrip(b":"))


async def _recover(shared) -> None:
    """Past RETRY_S, one call Redis answers: the store is up again, its recovery run."""
    await asyncio.sleep(RETRY_S + 0.1)
    assert (await RedisBuckets(shared).take(TAKE)).wait_s == 0 and shared.health.up
    for _ in range(100):  # the orphans' release, a task started by the recovery
        await asyncio.sleep(0.01)


async def test_an_acquire_that_timed_out_leaves_no_lease_once_redis_answers_again(shared, redis_server):
    """Redis stalled (SIGSTOP) runs the acquire it had read when it resumes: a lease no
    request holds, until the share's lease_s. Released on recovery, the share is whole."""
    leases = Leases(shared, 2, 600)
    assert await leases.acquire(LEASES, "warm") is True  # connected, the scripts loaded
    await leases.release(LEASES, "warm")
    redis_server.pause()
    start = time.monotonic()
    assert await leases.acquire(LEASES, "lost") is None
    assert time.monotonic() - start < 4 * TIMEOUT_S
    assert leases.orphans == 1
    redis_server.resume()
    await asyncio.sleep(0.1)
    assert _zcard(redis_server) == 1, "the stalled Redis ran the acquire given up on"
    await _recover(shared)
    assert _zcard(redis_server) == 0 and leases.orphans == 0
    assert [await leases.acquire(LEASES, m) for m in ("a", "b", "c")] == [True, True, False]


async def test_a_release_not_sent_while_redis_was_away_is_sent_once_it_answers(shared, redis_server):
    leases = Leases(shared, 2, 600)
    assert [await leases.acquire(LEASES, m) for m in ("a", "b")] == [True, True]
    redis_server.pause()
    await leases.release(LEASES, "a")  # times out: Redis runs it when it resumes
    await leases.release(LEASES, "b")  # within RETRY_S of the failure: not tried
    redis_server.resume()
    await asyncio.sleep(0.1)
    assert _zcard(redis_server) == 1, "b's lease is still held in Redis"
    await _recover(shared)
    assert _zcard(redis_server) == 0 and leases.orphans == 0


async def test_the_orphans_are_released_before_the_next_acquire_where_no_call_marked_the_recovery(shared, redis_server):
    leases = Leases(shared, 1, 600)
    assert await leases.acquire(LEASES, "held") is True
    redis_server.pause()
    await leases.release(LEASES, "held")
    redis_server.resume()
    await asyncio.sleep(RETRY_S + 0.1)
    assert await leases.acquire(LEASES, "next") is True  # the orphan released first: the share of 1 is free


async def test_an_acquire_that_reaches_redis_after_its_release_adds_nothing(shared, redis_server):
    """A late command (a network that delivers it after the release sent on recovery),
    played at the seam: the acquire script run after the orphan's release."""
    leases = Leases(shared, 2, 600)
    redis_server.pause()
    assert await leases.acquire(LEASES, "late") is None
    shared.health.up = True  # the resumed store taken as answering (no wait for RETRY_S)
    redis_server.resume()
    await leases.flush()
    redis_server.command("DEL", LEASES)  # the stalled acquire as if it had not run yet
    args = [2, "late", 600]
    assert await shared.call(lambda: leases.acquire_script(keys=[LEASES, released_of(LEASES)], args=args)) == (True, 0)
    assert _zcard(redis_server) == 0
    assert await leases.acquire(LEASES, "fresh") is True
