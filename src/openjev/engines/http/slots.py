"""The HTTP engines' call slots: at most `n` calls in flight to the engine server, and while
calls wait for a slot, the next goes in the keys' fair order (engines/fair_share.py's
`FairTurns`, by the call's tokens and its key's weight); with one key waiting, arrival order.

The key is that of the request the call belongs to: its plan's `share`, which
`HTTPEngine.run` passes with each call (a shared call of the coalescer takes its first
part's). What the engine server does with the calls
it has been sent (SGLang's and vLLM's own schedulers batch whatever is in flight) is beyond
this order: it acts only where calls queue here, past `--max-engine-calls`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from openjev.core.types import NO_KEY, Share
from openjev.engines.fair_share import FairTurns, Want


@dataclass(eq=False)
class _Waiter:
    want: Want
    granted: asyncio.Future[None]


class FairSlots:
    """`n` slots, taken with `async with slots.hold(tokens, share):`."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("at least one slot")
        self._n = self._free = n
        self._waiting: list[_Waiter] = []
        self._turns = FairTurns()

    @property
    def held(self) -> int:
        """Slots held now (calls in flight)."""
        return self._n - self._free

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def hold(self, tokens: int, share: Share = NO_KEY) -> AsyncIterator[None]:
        """A slot for one call of `tokens` tokens of the request served from `share`."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            waiter = _Waiter(Want(share, tokens), asyncio.get_running_loop().create_future())
            self._waiting.append(waiter)
            try:
                await waiter.granted
            except asyncio.CancelledError:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                elif waiter.granted.done() and not waiter.granted.cancelled():
                    self._release()  # granted as it was cancelled: the slot goes on
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            waiter = self._waiting.pop(self._turns.choose([w.want for w in self._waiting]))
            if not waiter.granted.done():  # (one cancelled meanwhile leaves on its own)
                waiter.granted.set_result(None)
                return
        self._free += 1
