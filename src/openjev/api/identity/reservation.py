"""A key's tokens reserved at the door, before its body is read (issue 48, item 4).

A decision request's compile is paid for only once it is done (its tokens at the gate, or
its work where it was refused), so without a reservation N concurrent bodies from one key
all pass the door's debt check and all compile. At the door the key's tokens/min bucket
is debited by a reservation sized from the body (`reserved_tokens`: a quarter of its
declared bytes, at most one minute's budget), atomically, or the request is a 429 before
any work; the reservation is handed back once the request's real cost is known (the gate
takes its distinct tokens, a refusal charges its work) or when it ends. So concurrent
bodies beyond the key's remaining budget are refused at the door, and what they could
cost is what one of them does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from openjev.api.identity.key_limits import KeyLimits
from openjev.api.identity.keys import KeyEntry

BYTES_PER_TOKEN = 4  # a token of text is about 4 bytes of JSON: the door's estimate of a body's work


@dataclass
class Reservation:
    """Tokens taken from `entry`'s bucket at the door, handed back once (`release`)."""

    limits: KeyLimits
    entry: KeyEntry
    tokens: int
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _held: bool = True

    def claim(self) -> int:
        """The tokens to hand back, once (a batch's items and the request's end may each ask;
        the later ones get 0): the caller gives them back, alone or in its own step of the store."""
        with self._lock:
            held, self._held = self._held, False
        return self.tokens if held else 0

    async def release(self) -> None:
        """Hand the reservation back (once)."""
        tokens = self.claim()
        if tokens:
            await self.limits.refund_tokens(self.entry, tokens)


def reserved_tokens(content_length: str | None, encoded: bool, per_min: int) -> int:
    """What the door reserves for a body: its declared bytes over BYTES_PER_TOKEN, or a
    whole minute's budget where its size is unknown (no Content-Length, or compressed)."""
    if encoded or content_length is None or not content_length.isdigit():
        return per_min
    return max(1, min(per_min, int(content_length) // BYTES_PER_TOKEN))


async def admit(limits: KeyLimits, entry: KeyEntry, content_length: str | None, encoded: bool) -> Reservation | None:
    """The door's one step of the store (`KeyLimits.admit`): the key's debt, one of its
    requests and its reservation for this body (RateLimited, 429, where its buckets cannot
    cover them); the reservation, None where the key has no tokens/min limit."""
    per_min = limits.allowance(entry).tokens_per_min
    tokens = reserved_tokens(content_length, encoded, per_min) if per_min else 0
    await limits.admit(entry, reserve=tokens)
    return Reservation(limits, entry, tokens) if tokens else None
