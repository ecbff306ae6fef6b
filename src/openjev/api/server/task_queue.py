"""The fit queue (api/server/task_jobs.py): one fit runs at a time, and the fits waiting take
their turns fairly across keys: round-robin by owner, first come first served within one
owner's. A key that queues many tasks delays its own, not another key's by more than one
fit per key waiting."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class FairTurns:
    """One holder at a time; `turn(owner)` waits for the owner's turn (module doc)."""

    def __init__(self) -> None:
        self._busy = False
        self._last: str | None = None  # the owner served last: the others go before its next turn
        # The owners waiting, in the order of their next turns (a dict keeps insertion order):
        # an owner served goes to the back while it has more waiting.
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}

    def waiting(self) -> dict[str, int]:
        """By owner, the turns waiting."""
        return {owner: len(queue) for owner, queue in self._waiting.items()}

    @asynccontextmanager
    async def turn(self, owner: str) -> AsyncIterator[None]:
        """Hold the turn for the block (cancelled while waiting: leaves the queue)."""
        if self._busy:
            handed = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(owner, collections.deque()).append(handed)
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():  # the turn came with the cancel: pass it on
                    self._next()
                else:
                    self._leave(owner, handed)
                raise
        else:
            self._last = owner
        self._busy = True
        try:
            yield
        finally:
            self._next()

    def _leave(self, owner: str, handed: asyncio.Future[None]) -> None:
        queue = self._waiting.get(owner)
        if queue is not None and handed in queue:
            queue.remove(handed)
            if not queue:
                del self._waiting[owner]

    def _next(self) -> None:
        """Hand the turn to the next owner's first waiter (another owner's than the last
        served, where one waits), or leave it free."""
        while self._waiting:
            owner = next((o for o in self._waiting if o != self._last), next(iter(self._waiting)))
            queue = self._waiting.pop(owner)
            handed = queue.popleft()
            if queue:
                self._waiting[owner] = queue  # to the back: one turn an owner per round
            if not handed.done():
                self._last = owner
                handed.set_result(None)
                return
        self._busy = False
