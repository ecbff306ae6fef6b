"""Where the per-key token buckets are kept: the store port (`Buckets`) and the in-memory
store (`MemoryBuckets`). The rule of which limit a key is held to is not here: it is
`KeyLimits` (api/identity/keys.py), which any store serves unchanged; a store shared by
replicas implements the three operations of `Buckets`, each atomic."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


class Buckets(Protocol):
    """The buckets' levels; a bucket never touched is full. Safe to call from any thread."""

    def take(self, bucket: BucketId, cost: float, burst: float) -> float:
        """0.0, and `cost` taken (into debt if need be), where the level reaches
        min(cost, burst); else the seconds until it would, nothing taken."""
        ...

    def charge(self, bucket: BucketId, cost: float) -> None:
        """Take `cost` whatever the level (it may go into debt)."""
        ...

    def level(self, bucket: BucketId) -> float | None:
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

    def charge(self, cost: float) -> None:
        """Take `cost` now, into debt if need be."""
        self._refill()
        self.level -= cost

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

    def take(self, bucket: BucketId, cost: float, burst: float) -> float:
        with self._lock:
            return self._bucket(bucket).wait_s(cost, burst)

    def charge(self, bucket: BucketId, cost: float) -> None:
        with self._lock:
            self._bucket(bucket).charge(cost)

    def level(self, bucket: BucketId) -> float | None:
        with self._lock:
            found = self._buckets.get(bucket)
            if found is None:
                return None
            found.charge(0)  # refilled to now
            return found.level
