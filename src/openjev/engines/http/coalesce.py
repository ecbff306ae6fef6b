"""Concurrent requests' stages in one batched call: fewer calls where a call's own work is
what costs (SGLang with a cheap forward, as on a GPU: its HTTP front end, tokenizer manager
and scheduler pay per call, and so does our client).

Each request's stage is a *part* (its items: input ids, label ids). A part goes out at once
while fewer than `depth` shared calls are in flight, so an idle server sees every request
as soon as it comes: coalescing adds no wait. Past that, parts wait, and when a call returns
every waiting part of the same cache namespace goes in ONE call (up to `max_items` items;
a part is never split).

A shared call belongs to no request: it runs in a task of its own, so a request that leaves
(its deadline, its client gone) does not take the call from the others. That request's own
items are aborted on the server by their rids (SGLang answers an item aborted alone with
`finish_reason` abort and the others in full), and a call every request of which has left is
cancelled, which aborts all of its items (sender.py `Sender.post`). Each request's slice of the reply
is read on its own (HTTPProtocol.parse_batch_parts), so an unusable item fails its own
request only; a call that fails as a whole (server gone, stalled, 5xx) fails each request in
it with that error.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from openjev.core.types import NO_KEY, Share
from openjev.engines.http.protocol import Item, Reply

# (parts: each one's rids and items, the cache namespace's salt, the share whose turn the
# call takes at the slots) -> per part, its replies or the error that fails it
SharedCall = Callable[[Sequence[tuple[Sequence[str], Sequence[Item]]], str, Share], Coroutine[Any, Any, list]]


@dataclass(eq=False)
class _Part:
    items: list[Item]
    future: asyncio.Future
    share: Share = NO_KEY  # its request's (Plan.share)
    rids: list[str] = field(default_factory=list)
    call: _Call | None = None


@dataclass(eq=False)
class _Call:
    parts: list[_Part]
    task: asyncio.Task | None = None


class Coalescer:
    """Sends parts through `call` (engine: one batched POST), at most `depth` calls in flight
    before parts wait to share the next; `abort(rids)` aborts a leaving request's items on the
    server (fire and forget)."""

    def __init__(
        self, call: SharedCall, abort: Callable[[Sequence[str]], None], *, depth: int, max_items: int = 256
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._call = call
        self._abort = abort
        self._depth = depth
        self._max_items = max_items
        self._waiting: dict[str, deque[_Part]] = {}
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()  # the shared calls running, kept alive until done
        self.calls = 0  # shared calls sent
        self.parts = 0  # parts sent in them

    async def submit(self, items: Sequence[Item], salt: str, share: Share = NO_KEY) -> list[Reply]:
        """The replies to `items` (one per item, in order) of a request served from `share`,
        sent in a call shared with other requests' parts of the same namespace `salt`; raises
        what fails this part."""
        part = _Part(list(items), asyncio.get_running_loop().create_future(), share)
        self._waiting.setdefault(salt, deque()).append(part)
        self._flush()
        try:
            return await part.future
        except asyncio.CancelledError:
            self._leave(part)
            raise

    def _flush(self) -> None:
        """Send what waits, one call per namespace, while fewer than `depth` are in flight."""
        for salt in list(self._waiting):
            if self._in_flight >= self._depth:
                return
            queue = self._waiting[salt]
            taken: list[_Part] = []
            count = 0
            while queue and (not taken or count + len(queue[0].items) <= self._max_items):
                part = queue.popleft()
                if part.future.done():  # left while it waited
                    continue
                taken.append(part)
                count += len(part.items)
            if not queue:
                del self._waiting[salt]
            if taken:
                self._send(_Call(taken), salt)

    def _send(self, call: _Call, salt: str) -> None:
        for part in call.parts:
            part.rids = [uuid.uuid4().hex for _ in part.items]
            part.call = call
        self._in_flight += 1
        self.calls += 1
        self.parts += len(call.parts)
        call.task = asyncio.get_running_loop().create_task(self._run(call, salt))
        self._tasks.add(call.task)
        call.task.add_done_callback(self._tasks.discard)

    async def _run(self, call: _Call, salt: str) -> None:
        try:
            # the call takes its first part's request's turn at the slots (slots.py)
            got = await self._call([(p.rids, p.items) for p in call.parts], salt, call.parts[0].share)
        except asyncio.CancelledError:
            return  # every part had left (_leave): nobody waits for an answer
        except Exception as e:  # noqa: BLE001 - the call failed as a whole: each part gets its error
            for p in call.parts:
                if not p.future.done():
                    p.future.set_exception(e)
        else:
            for p, outcome in zip(call.parts, got, strict=True):
                if p.future.done():
                    continue
                if isinstance(outcome, BaseException):
                    p.future.set_exception(outcome)
                else:
                    p.future.set_result(outcome)
        finally:
            self._in_flight -= 1
            self._flush()

    def _leave(self, part: _Part) -> None:
        """`part`'s request left: it stops waiting, or its items are aborted; a call whose
        every part has left is cancelled (which aborts all of it)."""
        call = part.call
        if call is None or (call.task is not None and call.task.done()):
            return  # still waiting (_flush skips it), or its call is over
        if all(p.future.done() and p.future.cancelled() for p in call.parts):
            if call.task is not None:
                call.task.cancel()
            return
        self._abort(part.rids)
