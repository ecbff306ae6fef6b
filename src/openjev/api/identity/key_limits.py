"""What a key is held to: its `Allowance` (its own limits where the keys file sets them,
else the server's, resolved in one place) and the per-key buckets (`KeyLimits`) that
every enforcing and reporting place reads: requests/min at the door, tokens/min at the
engine and for refused work, the debt checked at the door, the standing reported in
OpenAI's x-ratelimit-* headers and GET /v1/limits. Where the buckets are kept is
buckets.py's (`Buckets`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from openjev.api.identity.buckets import BucketId, Buckets, MemoryBuckets
from openjev.api.identity.keys import LIMITS, KeyEntry
from openjev.errors import RateLimited

# A key's debt for refused work is capped at this many minutes of its tokens/min budget.
DEBT_MINUTES = 1


@dataclass(frozen=True)
class Allowance:
    """What a key is held to, per minute (0: no limit). `of` is the one place the rule is
    written: a key's own limit where the keys file sets one, else the server's."""

    requests_per_min: int
    tokens_per_min: int

    def of(self, entry: KeyEntry | None) -> Allowance:
        """`entry`'s allowance, where this is the server's (itself without a key)."""
        if entry is None:
            return self
        return Allowance(
            self.requests_per_min if entry.requests_per_min is None else entry.requests_per_min,
            self.tokens_per_min if entry.tokens_per_min is None else entry.tokens_per_min,
        )

    def by_kind(self) -> dict[str, int]:
        """The limits that are set, by bucket kind."""
        return {k: v for k, v in zip(LIMITS, (self.requests_per_min, self.tokens_per_min), strict=True) if v}


class KeyLimits:
    """Per-key buckets on requests/min and distinct tokens/min (429 beyond, with Retry-After),
    each key held to its `Allowance`; the buckets are kept in `buckets` (in memory by default)."""

    def __init__(
        self,
        requests_per_min: int,
        tokens_per_min: int,
        clock: Callable[[], float] = time.monotonic,
        buckets: Buckets | None = None,
    ) -> None:
        self.server = Allowance(requests_per_min, tokens_per_min)
        self._buckets = buckets if buckets is not None else MemoryBuckets(clock)

    def allowance(self, entry: KeyEntry | None) -> Allowance:
        return self.server.of(entry)

    def _bucket(self, entry: KeyEntry, kind: str) -> BucketId | None:
        """The key's bucket of `kind`; None where the key has no such limit."""
        per_min = self.allowance(entry).by_kind().get(kind, 0)
        return BucketId(entry.name, kind, per_min) if per_min else None

    def _take(self, entry: KeyEntry, kind: str, cost: float, what: str, burst_less: float = 0, why: str = "") -> None:
        bucket = self._bucket(entry, kind)
        if bucket is None:
            return
        wait = self._buckets.take(bucket, cost, max(0.0, bucket.per_min - burst_less))
        if wait > 0:
            raise RateLimited(
                f"API key {entry.name!r} is over its {bucket.per_min} {what} per minute{why}; retry later",
                retry_after_s=wait,
            )

    def charge_tokens(self, entry: KeyEntry, tokens: int) -> None:
        """Take `tokens` from the key's tokens/min bucket whatever its level, into debt down to
        one minute's budget at most (`DEBT_MINUTES`): work already done for a request that was
        then refused (compile bombs cost the key as if they had run, so they cannot be
        repeated for free), while one mistake never locks a key out for longer than the cap
        takes to refill (its Retry-After at most about two minutes)."""
        bucket = self._bucket(entry, "tokens_per_min")
        if bucket is not None and tokens > 0:
            self._buckets.charge(bucket, tokens, floor=-DEBT_MINUTES * bucket.per_min)

    def refund_tokens(self, entry: KeyEntry, tokens: int) -> None:
        """Give back `tokens` taken earlier (a reservation; the bucket never exceeds its capacity)."""
        bucket = self._bucket(entry, "tokens_per_min")
        if bucket is not None and tokens > 0:
            self._buckets.charge(bucket, -tokens)

    def refuse_debt(self, entry: KeyEntry) -> None:
        """429 where the key's tokens/min bucket is in debt (earlier work, refused requests'
        included, took more than it had): checked at the door, before the body is read or
        anything compiled, so a key in debt cannot buy compile work with refused requests.
        Retry-After: until the debt is paid back."""
        bucket = self._bucket(entry, "tokens_per_min")
        level = None if bucket is None else self._buckets.level(bucket)
        if bucket is None or level is None:
            return
        debt = -level
        if debt >= 0:
            raise RateLimited(
                f"API key {entry.name!r} is over its {bucket.per_min} distinct tokens per minute (in debt by "
                f"{math.ceil(debt)} tokens of earlier work, refused requests' included): refused before any "
                "work; retry later",
                retry_after_s=(debt + 1) / (bucket.per_min / 60.0),
            )

    def take_request(self, entry: KeyEntry) -> None:
        self._take(entry, "requests_per_min", 1, "requests")

    def take_batch_items(self, entry: KeyEntry, extra: int) -> None:
        """A batch's items beyond the first, which its request took at the door: every item
        is one request. A batch that found the bucket full passes and leaves it in debt (as
        a large request does with tokens), so a batch larger than the limit is not refused
        forever but the key waits afterwards."""
        self._take(
            entry,
            "requests_per_min",
            extra,
            "requests",
            burst_less=1,
            why=f" (a batch counts one per item, {extra + 1})",
        )

    def take_tokens(self, entry: KeyEntry, tokens: int, why: str = "") -> None:
        self._take(entry, "tokens_per_min", tokens, "distinct tokens", why=why)

    def standing(self, entry: KeyEntry) -> dict[str, tuple[int, int, float]]:
        """What the key has left, by kind with a limit ("requests_per_min",
        "tokens_per_min"): (the limit per minute, what may be taken now, seconds until the
        bucket is full again). Read only: nothing is taken (OpenAI's x-ratelimit-* headers)."""
        out: dict[str, tuple[int, int, float]] = {}
        for kind, per_min in self.allowance(entry).by_kind().items():
            level = self._buckets.level(BucketId(entry.name, kind, per_min))
            if level is None:
                out[kind] = (per_min, per_min, 0.0)
                continue
            out[kind] = (per_min, max(0, int(level)), max(0.0, (per_min - level) / (per_min / 60.0)))
        return out
