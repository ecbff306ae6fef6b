"""Per-key limits shared by every replica: the `Buckets` port (api/identity/buckets.py) kept
in Redis (`RedisBuckets`), each operation one Lua script, so one round trip and no
read-modify-write race between replicas; and the store's health (`StoreHealth`): what a
replica does while Redis does not answer within --limits-redis-timeout-ms, the mode
(--limits-redis-mode):

- `closed`: 503 with Retry-After (an outage of ours, which the official SDKs retry);
- `local`: each replica holds each key to its share, the limit / --limits-replicas, in its
  own memory, so the fleet never admits more than promised;
- `open`: per-key limits off until Redis answers.

A switch between up and down is one log line. While down, one call a second tries Redis
again; its first answer rejoins the fleet (no restart). Time is Redis's own (`TIME`):
one clock for every replica."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from openjev.api.identity.buckets import BucketId, MemoryBuckets, Take, Taken
from openjev.errors import LimitsUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_S = 1.0  # while down, how often a call tries Redis again
# Turns of the event loop a call past its timeout is given before it counts as failed: a
# loop blocked past the timeout (a long compile) must not be taken for Redis being away.
GRACE_TURNS = 3
LATE_WAITS = 3
LATE_S = 0.02  # a wake later than this past its timeout: the loop was busy, not Redis slow

# A bucket is a hash {l: level, t: seconds} refilled to Redis's TIME; it expires once full.
_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function refilled(key, per_min)
  local v = redis.call('HMGET', key, 'l', 't')
  if not v[1] then return nil end
  local level, at = tonumber(v[1]), tonumber(v[2])
  if now > at then level = math.min(per_min, level + (now - at) * per_min / 60) end
  return level
end
local function store(key, per_min, level)
  redis.call('HSET', key, 'l', tostring(level), 't', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((per_min - level) * 60000 / per_min) + 1000)
end
"""
# KEYS: the buckets[, the guard]; ARGV: the guard's per_min (0: none), then per bucket:
# per_min, cost, burst, refund. The refunds first; then every cost, or none (see Buckets.take).
_TAKE = (
    _COMMON
    + """
local n = #KEYS - (tonumber(ARGV[1]) > 0 and 1 or 0)
local levels = {}
for i = 1, n do
  local per_min, refund = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i + 1])
  levels[i] = refilled(KEYS[i], per_min) or per_min
  if refund > 0 then
    levels[i] = math.min(per_min, levels[i] + refund)
    store(KEYS[i], per_min, levels[i])
  end
end
if n < #KEYS then
  local g = refilled(KEYS[#KEYS], tonumber(ARGV[1]))
  if g and g <= 0 then return {'0', tostring(-g), '-1'} end
end
for i = 1, n do
  local per_min, cost, burst = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i])
  local need = math.min(cost, burst)
  if levels[i] < need then return {tostring((need - levels[i]) * 60 / per_min), '', tostring(i - 1)} end
end
for i = 1, n do
  store(KEYS[i], tonumber(ARGV[4 * i - 2]), levels[i] - tonumber(ARGV[4 * i - 1]))
end
return {'0', '', '-1'}
"""
)
# KEYS: the bucket; ARGV: per_min, cost, floor ('' for none), refund
_CHARGE = (
    _COMMON
    + """
local per_min, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local level = math.min(per_min, (refilled(KEYS[1], per_min) or per_min) + tonumber(ARGV[4]))
local floor = ARGV[3] == '' and level - cost or tonumber(ARGV[3])
store(KEYS[1], per_min, math.min(per_min, math.max(math.min(floor, level), level - cost)))
return 1
"""
)
_LEVEL = _COMMON + "local level = refilled(KEYS[1], tonumber(ARGV[1]))\nreturn level and tostring(level) or false\n"


class StoreHealth:
    """Whether the shared store answers, and what to do while it does not (`mode`)."""

    def __init__(self, where: str, mode: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.where = where
        self.mode = mode
        self.up = True  # until a call fails: a replica starts as a member of the fleet
        self.switches = 0
        self._clock = clock
        self._retry_at = 0.0
        self.on_recovery: list[Callable[[], None]] = []  # called on the loop as the store answers again

    def usable(self) -> bool:
        """Whether a call should try the store now: always while up; while down, one call a
        second (the others keep to the mode while it tries)."""
        if self.up:
            return True
        now = self._clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + RETRY_S
        return True

    def failed(self, exc: BaseException) -> None:
        self._retry_at = self._clock() + RETRY_S
        if self.up:
            self.up = False
            self.switches += 1
            log.warning(
                "shared limits store %s unreachable (%s): mode %s until it answers",
                self.where,
                type(exc).__name__,
                self.mode,
            )

    def answered(self) -> None:
        if not self.up:
            self.up = True
            self.switches += 1
            log.warning("shared limits store %s answers again: limits shared by the fleet", self.where)
            for recovered in self.on_recovery:
                recovered()

    def describe(self) -> dict[str, Any]:
        """For /v1/limits and /health: the backend, its mode and whether it answers."""
        return {"backend": "redis", "mode": self.mode, "reachable": self.up}

    def stats(self) -> dict[str, float]:
        """For /metrics."""
        return {"limits_store_up": float(self.up), "limits_store_switches": float(self.switches)}

    def unavailable(self) -> LimitsUnavailable:
        return LimitsUnavailable(
            "the shared limits store does not answer, and this server admits nothing it cannot count; "
            "retry after Retry-After",
            retry_after_s=max(1, round(RETRY_S)),
        )


class RedisStore:
    """The client, the scripts and the health of one Redis; every call bounded by `timeout_s`."""

    def __init__(self, url: str, mode: str, timeout_s: float, replicas: int, prefix: str = "openjev:") -> None:
        self.client = aioredis.Redis.from_url(  # no CLIENT SETINFO round trips on each new connection
            url, socket_connect_timeout=timeout_s, retry_on_timeout=False, lib_name=None, lib_version=None
        )
        where = url.split("@")[-1]  # never the password
        self.health = StoreHealth(where, mode)
        self.timeout_s = timeout_s
        self.replicas = replicas
        self.prefix = prefix
        self._answered_at = -math.inf  # loop time of the last call Redis answered
        self.take = self.client.register_script(_TAKE)
        self.charge = self.client.register_script(_CHARGE)
        self.level = self.client.register_script(_LEVEL)

    async def call(self, make: Callable[[], Awaitable[T]]) -> tuple[bool, T | None]:
        """(True, the answer), or (False, None) where the store is down or did not answer in time."""
        if not self.health.usable():
            return False, None
        task = asyncio.ensure_future(make())
        task.add_done_callback(self._answered)
        try:
            done = await self._wait(task)
            for _ in range(GRACE_TURNS):  # a reply that came while this loop was busy elsewhere is read first
                if done or task.done():
                    break
                await asyncio.sleep(0)
            if not task.done():
                raise TimeoutError
            answer = task.result()
        except (RedisError, OSError, TimeoutError) as exc:
            self.health.failed(exc)
            return False, None
        finally:
            if not task.done():
                task.cancel()
        self.health.answered()
        return True, answer

    async def _wait(self, task: asyncio.Future[Any]) -> bool:
        """Whether `task` finished within the timeout. A wait that woke late (this process's
        loop busy, or its GIL held by compiles in worker threads) measured this process, and one
        during which another call was answered measured this process's queue for a connection:
        neither is Redis being away, so the call is waited again, up to LATE_WAITS times."""
        loop = asyncio.get_running_loop()
        late = self.timeout_s + max(LATE_S, 0.1 * self.timeout_s)
        for _ in range(1 + LATE_WAITS):
            start = loop.time()
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            if done:
                return True
            if loop.time() - start < late and self._answered_at < start:
                return False
        return task.done()

    def _answered(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._answered_at = asyncio.get_running_loop().time()

    async def close(self) -> None:
        await self.client.aclose()


class RedisBuckets:
    """`Buckets` in Redis, for every replica that names it; while it is down, the mode's."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._local = MemoryBuckets()  # mode local: each key's share of its limit, here

    def _key(self, bucket: BucketId) -> str:
        return f"{self.store.prefix}bucket:{bucket.key}:{bucket.kind}:{bucket.per_min}"

    def _share(self, bucket: BucketId) -> BucketId:
        """The bucket this replica holds alone while the store is away (mode local)."""
        return BucketId(bucket.key, bucket.kind, max(1, bucket.per_min // self.store.replicas))

    def _part(self, bucket: BucketId) -> float:
        """This replica's part of `bucket` while the store is away: its share's size over the whole's."""
        return self._share(bucket).per_min / bucket.per_min

    async def take(self, takes: Sequence[Take], guard: BucketId | None = None) -> Taken:
        keys = [self._key(t.bucket) for t in takes] + ([] if guard is None else [self._key(guard)])
        args: list[Any] = [0 if guard is None else guard.per_min]
        for t in takes:
            args += [t.bucket.per_min, t.cost, t.burst, t.refund]
        ok, answer = await self.store.call(lambda: self.store.take(keys=keys, args=args))
        if ok:
            wait, debt, refused = answer  # type: ignore[misc]
            return Taken(float(wait), float(debt) if debt else None, int(refused))
        mode = self.store.health.mode
        if mode == "closed":
            raise self.store.health.unavailable()
        if mode == "open":
            return Taken(0.0)
        local = [Take(self._share(t.bucket), t.cost, t.burst * self._part(t.bucket), t.refund) for t in takes]
        return await self._local.take(local, None if guard is None else self._share(guard))

    async def charge(self, bucket: BucketId, cost: float, floor: float = -math.inf, refund: float = 0.0) -> None:
        args = [bucket.per_min, cost, "" if math.isinf(floor) else floor, refund]
        ok, _ = await self.store.call(lambda: self.store.charge(keys=[self._key(bucket)], args=args))
        if not ok and self.store.health.mode == "local":
            share = self._share(bucket)
            await self._local.charge(share, cost, floor * self._part(bucket), refund)

    async def level(self, bucket: BucketId) -> float | None:
        ok, answer = await self.store.call(lambda: self.store.level(keys=[self._key(bucket)], args=[bucket.per_min]))
        if ok:
            return None if answer is None else float(answer)
        if self.store.health.mode == "local":
            return await self._local.level(self._share(bucket))
        return None
