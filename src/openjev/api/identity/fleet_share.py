"""Each key's in-flight share held across the fleet (`FleetShare`): a key's evaluations in
flight on every replica together stay within its share, as `KeyShare`
(api/identity/admission.py) holds them on one. Each evaluation holds a lease in Redis
(api/identity/leases.py: a member of the key's sorted set, scored by its expiry), so a
replica that dies mid-request frees its slots when their leases run out, never later than
`lease_s`; a lease whose acquire or release did not answer (a stalled Redis, a slow network)
is released once Redis answers again, so a stall leaves no slot taken behind it. While the
store does not answer: the mode's (api/identity/shared.py): closed 503, local the share /
replicas here, open this replica's own share."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

from openjev.api.identity.admission import KeyShare
from openjev.api.identity.caller import entry_of
from openjev.api.identity.leases import Leases
from openjev.api.identity.shared import RedisStore
from openjev.core.caller import Caller
from openjev.errors import RateLimited

FIRST_POLL_S = 0.005  # a refused lease is tried again after this, doubling up to MAX_POLL_S
MAX_POLL_S = 0.1


class FleetShare(KeyShare):
    """At most `share` evaluations in flight per API key across every replica naming `store`."""

    def __init__(self, share: int, max_wait_s: float, retry_after_s: int, store: RedisStore, lease_s: float) -> None:
        super().__init__(share, max_wait_s, retry_after_s)
        self.store = store
        self.lease_s = lease_s
        self.leases = Leases(store, share, lease_s)
        self._local = KeyShare(max(1, share // store.replicas), max_wait_s, retry_after_s)  # mode local
        self._own = KeyShare(share, max_wait_s, retry_after_s)  # mode open

    @contextlib.asynccontextmanager
    async def __call__(self, caller: Caller) -> AsyncIterator[None]:
        entry = entry_of(caller)
        if entry is None or self.share <= 0:
            yield
            return
        leases = f"{self.store.prefix}inflight:{entry.name}"
        member = uuid.uuid4().hex
        held = await self._lease(entry.name, leases, member)
        if held is None:  # the store is away: the mode's bound instead
            if self.store.health.mode == "closed":
                raise self.store.health.unavailable()
            async with (self._local if self.store.health.mode == "local" else self._own)(caller):
                yield
            return
        try:
            yield
        finally:  # released even when the request is cancelled (client gone, deadline)
            await asyncio.shield(asyncio.ensure_future(self.leases.release(leases, member)))

    async def _lease(self, name: str, leases: str, member: str) -> bool | None:
        """True once a lease is held; None where the store does not answer; RateLimited
        after `max_wait_s` without a free slot."""
        deadline = time.monotonic() + self.max_wait_s
        delay = FIRST_POLL_S
        while True:
            got = await self.leases.acquire(leases, member)
            if got is None:
                return None
            if got:
                return True
            if time.monotonic() + delay > deadline:
                raise RateLimited(
                    f"API key {name!r} has {self.share} evaluations in flight across the servers, its share; "
                    "retry after Retry-After",
                    retry_after_s=self.retry_after_s,
                )
            await asyncio.sleep(delay)
            delay = min(MAX_POLL_S, delay * 2)
