"""Where the per-key token buckets are kept: the store port (`Buckets`) and the in-memory
store (`MemoryBuckets`). The rule of which limit a key is held to is not here: it is
`KeyLimits` (api/identity/key_limits.py), which any store serves unchanged; a store shared
by replicas implements the three operations of `Buckets`, each atomic (Redis:
api/identity/shared.py)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BucketId:
    """One bucket: a key's, of one kind ("requests_per_min", "tokens_per_min"), at one limit
    per minute (a reloaded limit is a fresh bucket). The bucket holds `per_min` when full
    and refills at `per_min` a minute."""

    key: str
    kind: str
    per_min: int


@dataclass(frozen=True)
class Take:
    """One bucket's part of a `Buckets.take`: `refund` given back first (a reservation handed
    back, never past the capacity), then `cost` taken where the level reaches min(cost, burst)."""

    bucket: BucketId
    cost: float
    burst: float
    refund: float = 0.0


@dataclass(frozen=True)
class Taken:
    """What `Buckets.take` did: `wait_s` 0.0 where every cost was taken, else the seconds until
    the take at `refused` could be, nothing taken; `debt` (not None) where the guard bucket
    was at or below 0, by that much, and then nothing was taken."""

    wait_s: float
    debt: float | None = None
    refused: int = -1


class Buckets(Protocol):
    """The buckets' levels; a bucket never touched is full. Each operation is one atomic
    step of the store (one round trip for a shared one), awaited on the event loop."""

    async def take(self, takes: Sequence[Take], guard: BucketId | None = None) -> Taken:
        """The refunds given back; then, unless `guard`'s level is at or below 0, every cost
        taken where each bucket reaches its take's min(cost, burst) (into debt if need be),
        else none of them."""
        ...

    async def charge(self, bucket: BucketId, cost: float, floor: float = -math.inf, refund: float = 0.0) -> None:
        """`refund` given back (never past the capacity), then `cost` taken whatever the level
        (it may go into debt, never below `floor`); a negative cost gives back, never past
        the bucket's capacity."""
        ...

    async def level(self, bucket: BucketId) -> float | None:
        """The level refilled to now, nothing taken; None for a bucket never touched."""
        ...


class TokenBucket:
    """`rate` per minute, bursting to one minute's worth. Debt is allowed: a cost above the
    capacity passes when the bucket is full and leaves it negative, so a large request is
    never refused forever but pays for itself before the next one."""

    def __init__(self, per_min: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = float(per_min)
        self.rate = per_min / 60.0
        self.level = self.capacity
        self._clock = clock
        self._t = clock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._t) * self.rate)
        self._t = now

    def charge(self, cost: float, floor: float = -math.inf) -> None:
        """Take `cost` now, into debt if need be (never below `floor`, never above capacity)."""
        self._refill()
        self.level = min(self.capacity, max(min(floor, self.level), self.level - cost))

    def wait_s(self, cost: float, burst: float | None = None) -> float:
        """0 if `cost` may be taken now (then it is), else seconds until it may. `cost`
        passes once the level reaches min(cost, burst or the capacity)."""
        self._refill()
        need = min(cost, self.capacity if burst is None else burst)
        if self.level >= need:
            self.level -= cost
            return 0.0
        return (need - self.level) / self.rate


class MemoryBuckets:
    """`Buckets` in this process's memory: one server's, lost at restart."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: dict[BucketId, TokenBucket] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def _bucket(self, bucket: BucketId) -> TokenBucket:
        found = self._buckets.get(bucket)
        if found is None:
            found = self._buckets[bucket] = TokenBucket(bucket.per_min, self._clock)
        return found

    async def take(self, takes: Sequence[Take], guard: BucketId | None = None) -> Taken:
        with self._lock:
            buckets = [self._bucket(t.bucket) for t in takes]
            for t, found in zip(takes, buckets, strict=True):
                if t.refund:
                    found.charge(-t.refund)
            held = None if guard is None else self._buckets.get(guard)
            if held is not None:
                held.charge(0)  # refilled to now
                if held.level <= 0:
                    return Taken(0.0, debt=-held.level)
            for i, (t, found) in enumerate(zip(takes, buckets, strict=True)):
                found.charge(0)
                need = min(t.cost, t.burst)
                if found.level < need:
                    return Taken((need - found.level) / found.rate, refused=i)
            for t, found in zip(takes, buckets, strict=True):
                found.charge(t.cost)
            return Taken(0.0)

    async def charge(self, bucket: BucketId, cost: float, floor: float = -math.inf, refund: float = 0.0) -> None:
        with self._lock:
            found = self._bucket(bucket)
            if refund:
                found.charge(-refund)
            found.charge(cost, floor)

    async def level(self, bucket: BucketId) -> float | None:
        with self._lock:
            found = self._buckets.get(bucket)
            if found is None:
                return None
            found.charge(0)  # refilled to now
            return found.level
