"""Each key held to its `Allowance` (api/identity/keys.py): requests/min and distinct
tokens/min buckets (429 beyond, with Retry-After), kept in a `Buckets` store
(api/identity/buckets.py: this process's memory by default; Redis, shared by replicas,
with --limits-redis-url: api/identity/shared.py). Every check is one step of the store,
awaited on the event loop; `from_thread` runs one from a worker thread."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any

from openjev.api.identity.buckets import BucketId, Buckets, MemoryBuckets, Take, Taken
from openjev.api.identity.keys import Allowance, KeyEntry
from openjev.errors import RateLimited

# A key's debt for refused work is capped at this many minutes of its tokens/min budget.
DEBT_MINUTES = 1
RESERVED_WHY = " (reserved at the door for this body's work, before it is read)"


class KeyLimits:
    """Per-key buckets on requests/min and distinct tokens/min, each key held to its `Allowance`."""

    def __init__(
        self,
        requests_per_min: int,
        tokens_per_min: int,
        clock: Callable[[], float] = time.monotonic,
        buckets: Buckets | None = None,
    ) -> None:
        self.server = Allowance(requests_per_min, tokens_per_min)
        self.buckets: Buckets = buckets if buckets is not None else MemoryBuckets(clock)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the store is awaited on
        self._pending: set[asyncio.Task[None]] = set()

    def allowance(self, entry: KeyEntry | None) -> Allowance:
        return self.server.of(entry)

    def _bucket(self, entry: KeyEntry, kind: str) -> BucketId | None:
        """The key's bucket of `kind`; None where the key has no such limit."""
        per_min = self.allowance(entry).by_kind().get(kind, 0)
        return BucketId(entry.tenant, kind, per_min) if per_min else None

    def from_thread(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` (a charge or a refund) from a worker thread on the loop the store is
        awaited on, and wait for it: it is in the store before the thread goes on."""
        here = _running_loop()
        if here is not None:  # called on a loop after all: it cannot wait there, so it is scheduled
            task = here.create_task(work)
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        elif self._loop is None or self._loop.is_closed():
            asyncio.run(work)  # no loop has awaited the store yet
        else:
            asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=30)

    async def admit(self, entry: KeyEntry, reserve: int = 0) -> None:
        """At the door, before the body is read or anything compiled, in one step of the
        store: 429 where the key's tokens/min bucket is in debt (earlier work, refused
        requests' included, took more than it had: a key in debt buys no compile work with
        refused requests; Retry-After until it is paid back); else one of its requests/min
        and `reserve` of its tokens/min (api/identity/reservation.py), both or neither (429)."""
        self._loop = asyncio.get_running_loop()
        requests, tokens = self._bucket(entry, "requests_per_min"), self._bucket(entry, "tokens_per_min")
        takes = [(requests, Take(requests, 1, requests.per_min), "requests", "")] if requests else []
        if tokens is not None and reserve > 0:
            takes.append((tokens, Take(tokens, reserve, tokens.per_min), "distinct tokens", RESERVED_WHY))
        if not takes and tokens is None:
            return
        if takes:
            taken = await self.buckets.take([t for _, t, _, _ in takes], guard=tokens)
        else:  # a tokens limit alone, nothing reserved: its debt is all there is to ask
            level = await self.buckets.level(tokens) if tokens is not None else None
            taken = Taken(0.0, None if level is None or level > 0 else -level)
        if taken.debt is not None and tokens is not None:
            raise RateLimited(
                f"API key {entry.name!r} is over its {tokens.per_min} distinct tokens per minute (in debt by "
                f"{math.ceil(taken.debt)} tokens of earlier work, refused requests' included): refused before "
                "any work; retry later",
                retry_after_s=(taken.debt + 1) / (tokens.per_min / 60.0),
            )
        if taken.wait_s > 0:
            bucket, _, what, why = takes[taken.refused]
            raise self._over(entry, bucket, what, why, taken.wait_s)

    @staticmethod
    def _over(entry: KeyEntry, bucket: BucketId, what: str, why: str, wait_s: float) -> RateLimited:
        return RateLimited(
            f"API key {entry.name!r} is over its {bucket.per_min} {what} per minute{why}; retry later",
            retry_after_s=wait_s,
        )

    async def charge_tokens(self, entry: KeyEntry, tokens: int, refund: int = 0) -> None:
        """`refund` (the door's reservation) given back, then `tokens` taken from the key's
        tokens/min bucket whatever its level, into debt down to one minute's budget at most
        (`DEBT_MINUTES`): work already done for a request that was then refused (compile
        bombs cost the key as if they had run, so they cannot be repeated for free), while
        one mistake never locks a key out for longer than the cap takes to refill."""
        bucket = self._bucket(entry, "tokens_per_min")
        if bucket is not None and (tokens > 0 or refund > 0):
            await self.buckets.charge(bucket, max(0, tokens), floor=-DEBT_MINUTES * bucket.per_min, refund=refund)

    async def refund_tokens(self, entry: KeyEntry, tokens: int) -> None:
        """Give back `tokens` taken earlier (a reservation; the bucket never exceeds its capacity)."""
        bucket = self._bucket(entry, "tokens_per_min")
        if bucket is not None and tokens > 0:
            await self.buckets.charge(bucket, -tokens)

    async def take_batch_items(self, entry: KeyEntry, extra: int) -> None:
        """A batch's items beyond the first, which its request took at the door: every item
        is one request. A batch that found the bucket full passes and leaves it in debt (as
        a large request does with tokens), so a batch larger than the limit is not refused
        forever but the key waits afterwards."""
        bucket = self._bucket(entry, "requests_per_min")
        if bucket is None:
            return
        taken = await self.buckets.take([Take(bucket, extra, max(0.0, bucket.per_min - 1))])
        if taken.wait_s > 0:
            why = f" (a batch counts one per item, {extra + 1})"
            raise self._over(entry, bucket, "requests", why, taken.wait_s)

    async def take_request(self, entry: KeyEntry) -> None:
        """One of the key's requests/min alone (429 where its bucket is empty), its tokens' debt
        not asked: a call that starts no engine work (a task read, listed or deleted)."""
        self._loop = asyncio.get_running_loop()
        bucket = self._bucket(entry, "requests_per_min")
        if bucket is not None:
            taken = await self.buckets.take([Take(bucket, 1, bucket.per_min)])
            if taken.wait_s > 0:
                raise self._over(entry, bucket, "requests", "", taken.wait_s)

    async def take_tokens(self, entry: KeyEntry, tokens: int, refund: int = 0) -> None:
        """The request's distinct tokens, in one step with `refund` (its reservation) given back first."""
        bucket = self._bucket(entry, "tokens_per_min")
        if bucket is None:
            return
        taken = await self.buckets.take([Take(bucket, tokens, bucket.per_min, refund=refund)])
        if taken.wait_s > 0:
            raise self._over(entry, bucket, "distinct tokens", "", taken.wait_s)

    async def standing(self, entry: KeyEntry) -> dict[str, tuple[int, int, float]]:
        """What the key has left, by kind with a limit ("requests_per_min",
        "tokens_per_min"): (the limit per minute, what may be taken now, seconds until the
        bucket is full again). Read only: nothing is taken (OpenAI's x-ratelimit-* headers)."""
        out: dict[str, tuple[int, int, float]] = {}
        for kind, per_min in self.allowance(entry).by_kind().items():
            level = await self.buckets.level(BucketId(entry.tenant, kind, per_min))
            if level is None:
                out[kind] = (per_min, per_min, 0.0)
                continue
            out[kind] = (per_min, max(0, int(level)), max(0.0, (per_min - level) / (per_min / 60.0)))
        return out


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
