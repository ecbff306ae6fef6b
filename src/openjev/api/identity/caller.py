"""The caller at the edge: the door makes one `core.caller.Caller` per request
(`caller_for`) and keeps it on the request's scope state; each route takes it from there
once (`caller_of`) and passes it on as an argument. What the edge charges rides along as
its `account` (`KeyAccount`: the key, its allowance and the tokens reserved for it at the
door), read back only here, by the places that charge (`account_of`; a refused request's
work: `charge_refused`)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from openjev.api.identity.key_limits import KeyLimits
from openjev.api.identity.keys import Allowance, KeyEntry
from openjev.api.identity.reservation import Reservation
from openjev.core.caller import ANONYMOUS, Caller
from openjev.core.types import Share
from openjev.errors import TokensExceeded

SCOPE_KEY = "caller"  # where the door keeps it in the request's scope state


@dataclass(frozen=True)
class KeyAccount:
    """What a key-holding caller is charged to: its key, what it is held to, and the tokens
    reserved for this request at the door (None where its key has no tokens/min limit)."""

    entry: KeyEntry
    allowance: Allowance
    reservation: Reservation | None = None

    def claim(self) -> int:
        """The door's reservation, claimed once, to hand back in the step that replaces it (0
        where there is none, or it was claimed already)."""
        return 0 if self.reservation is None else self.reservation.claim()


def caller_for(entry: KeyEntry | None, allowance: Allowance, reservation: Reservation | None = None) -> Caller:
    """The caller of a request made with `entry` (None: a server without keys, one tenant)."""
    if entry is None:
        return ANONYMOUS
    return Caller(
        tenant=entry.tenant,
        cache_namespace=entry.cache_namespace,
        share=Share(entry.name, entry.weight),
        account=KeyAccount(entry, allowance, reservation),
    )


def account_of(caller: Caller) -> KeyAccount | None:
    """What `caller` is charged to; None for a caller without a key."""
    return caller.account if isinstance(caller.account, KeyAccount) else None


def entry_of(caller: Caller) -> KeyEntry | None:
    """The caller's key entry; None without one."""
    account = account_of(caller)
    return None if account is None else account.entry


def caller_of(connection: HTTPConnection) -> Caller:
    """The caller the door made for this request (the anonymous one where it made none: a
    path it does not guard, or a server without keys)."""
    found = connection.scope.get("state", {}).get(SCOPE_KEY)
    return found if isinstance(found, Caller) else ANONYMOUS


def charge_refused(key_limits: KeyLimits, caller: Caller, exc: TokensExceeded) -> None:
    """Charge the work a refused request cost (`exc.work_tokens`, tokens encoded before the
    refusal) to `caller`'s tokens/min bucket, in place of what was reserved at the door;
    nothing for a caller without a key. From a worker thread (on the loop:
    `charge_refused_async`)."""
    account = account_of(caller)
    if account is None:
        return
    refund = account.claim()
    if exc.work_tokens or refund:
        key_limits.from_thread(key_limits.charge_tokens(account.entry, exc.work_tokens, refund=refund))


async def charge_refused_async(key_limits: KeyLimits, caller: Caller, exc: TokensExceeded) -> None:
    """`charge_refused` on the event loop."""
    account = account_of(caller)
    if account is None:
        return
    refund = account.claim()
    if exc.work_tokens or refund:
        await key_limits.charge_tokens(account.entry, exc.work_tokens, refund=refund)
