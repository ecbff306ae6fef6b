"""The calls an HTTP engine makes, each built from its protocol's bodies, sent by the
`Sender`, and its reply read and validated by the protocol: one branch (its labels split
over calls where the protocol takes fewer), many branches in one batched call, and several
requests' parts in one shared call (coalesce.py). What each call costs the server is
learned as it answers (`CallCosts`, which auto's choice of strategy reads)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from openjev.core.types import NO_KEY, Share
from openjev.engines.http.protocol import HTTPProtocol, Item, Reply, computed
from openjev.engines.http.sender import Sender
from openjev.engines.http.submission import CallCosts
from openjev.errors import TokensExceeded


class Calls:
    """The calls to one server (`sender`) in `protocol`; `max_prompt_tokens` bounds a branch."""

    def __init__(self, protocol: HTTPProtocol, sender: Sender, max_prompt_tokens: int | None) -> None:
        self.protocol = protocol
        self.sender = sender
        self.max_prompt_tokens = max_prompt_tokens  # the server's context less one generated token, if known
        self.costs = CallCosts()  # what a call costs this server, from the calls made (auto's choice)

    def too_long(self, tokens: int) -> TokensExceeded:
        return TokensExceeded(
            f"a branch of {tokens} tokens exceeds the {self.protocol.name} server's context "
            f"({self.max_prompt_tokens} prompt tokens; raise its {self.protocol.context_flag})"
        )

    async def generate(
        self, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "", share: Share = NO_KEY
    ) -> Reply:
        """(label log-probs, prompt tokens, cached tokens) of one branch, in the cache
        namespace `salt` (Plan.cache_namespace), its calls in `share`'s turn (Plan.share)."""
        if self.max_prompt_tokens is not None and len(input_ids) > self.max_prompt_tokens:
            raise self.too_long(len(input_ids))
        per_call = self.protocol.max_ids_per_call
        if per_call is None or len(label_ids) <= per_call:
            return await self.one(input_ids, label_ids, salt, share)
        values: list[float] = []
        prompt: int | None = 0
        cached: int | None = 0
        # More labels than one call takes: the next call finds this call's prompt in the cache.
        for start in range(0, len(label_ids), per_call):
            v, p, c = await self.one(input_ids, label_ids[start : start + per_call], salt, share)
            values.extend(v)
            prompt = None if prompt is None or p is None else prompt + p
            cached = None if cached is None or c is None else cached + c
        return tuple(values), prompt, cached

    async def one(
        self, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "", share: Share = NO_KEY
    ) -> Reply:
        """One branch in one call, its reply validated."""
        rid = uuid.uuid4().hex
        body, aborts = self.protocol.request_body(rid, input_ids, label_ids, salt), [self.protocol.abort_body(rid)]
        ticket, t0 = self.costs.begin(), time.perf_counter()
        replies: list[Reply] = []
        try:
            payload = await self.sender.post(self.protocol.generate_path, body, aborts, len(input_ids), share)
            replies.append(self.protocol.parse_reply(payload, label_ids))
        finally:
            self.costs.end(ticket, computed(replies), time.perf_counter() - t0)
        return replies[0]

    async def batch(
        self, items: Sequence[tuple[Sequence[int], Sequence[int]]], salt: str, share: Share = NO_KEY
    ) -> list[Reply]:
        """Many branches in one call (protocol.batch_body), one Reply each, in order."""
        parse = self.protocol.parse_batch_reply
        if parse is None:
            raise ValueError(f"the {self.protocol.name} protocol has no batched calls")
        rids = [uuid.uuid4().hex for _ in items]  # (run refused any branch too long before a call)

        def read(payload: object) -> tuple[list[Reply], list[Reply]]:
            return (replies := parse(payload, rids, [lb for _, lb in items])), replies

        return await self._batched(rids, items, (salt, share), read)

    async def shared(
        self, parts: Sequence[tuple[Sequence[str], Sequence[Item]]], salt: str, share: Share = NO_KEY
    ) -> list:
        """One batched call carrying several requests' parts (coalesce.py): per part, its
        replies or the EngineError that fails it; raises what fails the call as a whole."""
        parse = self.protocol.parse_batch_parts
        if parse is None:
            raise ValueError(f"the {self.protocol.name} protocol does not share batched calls")
        rids = [rid for part_rids, _ in parts for rid in part_rids]
        items = [item for _, part_items in parts for item in part_items]

        def read(payload: object) -> tuple[list, list[Reply]]:
            got = parse(payload, [r for r, _ in parts], [[lb for _, lb in its] for _, its in parts])
            whole = not any(isinstance(g, BaseException) for g in got)  # else the cost is not known
            return got, [r for g in got for r in g] if whole else []

        return await self._batched(rids, items, (salt, share), read)

    def abort(self, rids: Sequence[str]) -> None:
        """Abort these items of a shared call on the server (their requests left)."""
        self.sender.abort([self.protocol.abort_body(r) for r in rids])

    async def _batched(
        self, rids: Sequence[str], items: Sequence[Item], whose: tuple[str, Share], read: Callable
    ) -> Any:
        """One batch_body call of `items` (named by `rids`) in `whose` (the cache namespace's
        salt, the share whose turn it takes), aborted whole where cancelled; `read(reply)`
        gives (the result, the replies the cost model learns from)."""
        salt, share = whose
        p = self.protocol
        if p.batch_body is None:
            raise ValueError(f"the {p.name} protocol has no batched calls")
        aborts = p.batch_abort_bodies(rids) if p.batch_abort_bodies else [p.abort_body(rid) for rid in rids]
        ticket, t0 = self.costs.begin(), time.perf_counter()
        learned: list[Reply] = []
        try:
            body, tokens = p.batch_body(rids, items, salt), sum(len(ids) for ids, _ in items)
            payload = await self.sender.post(p.batch_path or p.generate_path, body, aborts, tokens, share)
            result, learned = read(payload)
        finally:
            self.costs.end(ticket, computed(learned), time.perf_counter() - t0)
        return result
