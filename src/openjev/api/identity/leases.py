"""Each key's in-flight leases in Redis (`Leases`), for `FleetShare`
(api/identity/fleet_share.py): a lease is a member of the key's sorted set, scored by its
expiry, `lease_s` after it was taken (past any request's deadline, so a replica that dies
mid-request frees its slots by then without anyone's help).

Nothing is left behind by a call that did not answer. A call past
--limits-redis-timeout-ms is given up here, but Redis may still run it: a stalled Redis
runs what it had read once it resumes, and a network may deliver a command late. A late
acquire would leave a lease that no request holds, and a release never sent would keep a
finished request's slot, each until its `lease_s` runs out, while the key's next decisions
wait for a slot that does not free. So every lease whose acquire or release did not answer
is remembered here (an orphan) and released once Redis answers again: as the store
recovers (`StoreHealth.recovered`), and before this replica's next acquire. Such a release
also marks the member released for `lease_s`, and the acquire script refuses a released
member, so an acquire that reaches Redis after its own release adds nothing, in whichever
order the two arrive. Orphans are a handful per stall (the calls in flight when it began,
then one try a second); those of a replica that dies holding them lapse with their leases.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from openjev.api.identity.shared import RedisStore

# KEYS: the key's leases (members scored by their expiry), its released members;
# ARGV: share, member, lease seconds. 1: held; 0: the share is full, or the member released.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if redis.call('ZSCORE', KEYS[2], ARGV[2]) then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000) + 1000)
  return 1
end
return 0
"""
# KEYS: the key's leases, its released members; ARGV: seconds to keep the members marked
# released (0: not marked: their acquire answered, nothing of it can arrive later), members.
_RELEASE = """
redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
local keep = tonumber(ARGV[1])
if keep > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for i = 2, #ARGV do redis.call('ZADD', KEYS[2], now + keep, ARGV[i]) end
  redis.call('PEXPIRE', KEYS[2], math.ceil(keep * 1000) + 1000)
end
return 1
"""


def released_of(leases: str) -> str:
    """The Redis key of the members released after their call did not answer."""
    return leases + ":released"


class Leases:
    """Acquire and release leases of at most `share` per key, each lapsing after `lease_s`;
    whatever did not answer is released once the store answers again (the module's contract)."""

    def __init__(self, store: RedisStore, share: int, lease_s: float) -> None:
        self.store = store
        self.share = share
        self.lease_s = lease_s
        self.acquire_script = store.client.register_script(_ACQUIRE)
        self.release_script = store.client.register_script(_RELEASE)
        self._orphans: dict[str, dict[str, float]] = {}  # leases -> member -> when it lapses anyway (monotonic)
        self._flushing = asyncio.Lock()
        self._recovery: asyncio.Future[None] | None = None
        store.health.on_recovery.append(self._recovered)

    @property
    def orphans(self) -> int:
        """Leases not yet released after a call that did not answer."""
        return sum(len(members) for members in self._orphans.values())

    async def acquire(self, leases: str, member: str) -> bool | None:
        """True once `member` holds a lease of `leases`; False where the share is full; None
        where the store did not answer (the lease is then an orphan: released on recovery)."""
        if self._orphans and not self._flushing.locked():
            await self.flush()
        args: list[Any] = [self.share, member, self.lease_s]
        ok, got = await self.store.call(lambda: self.acquire_script(keys=[leases, released_of(leases)], args=args))
        if not ok:
            self._orphan(leases, member)
            return None
        return bool(got)

    async def release(self, leases: str, member: str) -> None:
        """Free `member`'s slot; where the store does not answer, once it does."""
        ok, _ = await self.store.call(lambda: self.release_script(keys=[leases, released_of(leases)], args=[0, member]))
        if not ok:
            self._orphan(leases, member)

    async def flush(self) -> None:
        """Release every orphan not lapsed yet, marked released, one call per key; what the
        store does not answer stays for the next recovery."""
        async with self._flushing:
            now = time.monotonic()
            for leases in list(self._orphans):
                members = [m for m, lapses in self._orphans[leases].items() if lapses > now]
                if members:
                    args: list[Any] = [self.lease_s, *members]
                    keys = [leases, released_of(leases)]
                    ok, _ = await self.store.call(lambda: self.release_script(keys=keys, args=args))  # noqa: B023
                    if not ok:
                        return
                left = self._orphans.get(leases, {})
                for m in members:
                    left.pop(m, None)
                for m in [m for m, lapses in left.items() if lapses <= now]:
                    del left[m]
                if not left:
                    self._orphans.pop(leases, None)

    def _orphan(self, leases: str, member: str) -> None:
        self._orphans.setdefault(leases, {})[member] = time.monotonic() + self.lease_s

    def _recovered(self) -> None:
        """The store answers again: its orphans released now, not at the next acquire."""
        if self._orphans and (self._recovery is None or self._recovery.done()):
            self._recovery = asyncio.ensure_future(self.flush())
