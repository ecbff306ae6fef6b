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
from contextvars import ContextVar
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

    def release(self) -> None:
        """Hand the reservation back (once: a batch's items and the request's end may each ask)."""
        with self._lock:
            held, self._held = self._held, False
        if held and self.tokens:
            self.limits.refund_tokens(self.entry, self.tokens)


# The request's reservation: set by the admission middleware at the door, released by the
# gate before it takes the request's tokens, by a refusal's charge, and at the request's end.
current_reservation: ContextVar[Reservation | None] = ContextVar("openjev_reservation", default=None)


def reserved_tokens(content_length: str | None, encoded: bool, per_min: int) -> int:
    """What the door reserves for a body: its declared bytes over BYTES_PER_TOKEN, or a
    whole minute's budget where its size is unknown (no Content-Length, or compressed)."""
    if encoded or content_length is None or not content_length.isdigit():
        return per_min
    return max(1, min(per_min, int(content_length) // BYTES_PER_TOKEN))


def reserve(limits: KeyLimits, entry: KeyEntry, content_length: str | None, encoded: bool) -> Reservation | None:
    """The key's reservation for this body (RateLimited, 429, where its bucket cannot cover
    it); None where the key has no tokens/min limit."""
    per_min = limits.allowance(entry).tokens_per_min
    if not per_min:
        return None
    tokens = reserved_tokens(content_length, encoded, per_min)
    limits.take_tokens(entry, tokens, why=" (reserved at the door for this body's work, before it is read)")
    return Reservation(limits, entry, tokens)


def release_current() -> None:
    found = current_reservation.get()
    if found is not None:
        found.release()
