"""What the one HTTP engine (engine.py) is given for a server: `HTTPProtocol`, the seam between
the engine's run loop and a server's JSON (SGLang's in sglang_protocol.py, vLLM's in
vllm_protocol.py), and the shapes its functions exchange. No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from openjev.errors import EngineError

# (label log-probs aligned with the label ids, prompt tokens, cached tokens); None where
# the server does not say.
Reply = tuple[tuple[float, ...], int | None, int | None]
# One branch of a batched call: (input ids, label ids).
Item = tuple[Sequence[int], Sequence[int]]


@dataclass(frozen=True)
class HTTPProtocol:
    """What differs between the servers the HTTP engine (engine.py) speaks to: where a
    call goes, its body, how to abort it, how to read its reply, and three facts about the
    server. The run loop, the calls, the aborts and the health probe are the engine's."""

    name: str  # as messages name the server
    generate_path: str
    abort_path: str
    health_path: str
    # (rid, input ids, label ids, the cache namespace's salt) -> the JSON body of one call
    request_body: Callable[[str, Sequence[int], Sequence[int], str], dict]
    abort_body: Callable[[str], dict]
    # (the reply's JSON, the label ids asked for) -> Reply; EngineError for anything unusable
    parse_reply: Callable[[Any, Sequence[int]], Reply]
    # Whether requests admitted in the same scheduling step share a prefix (then `auto`
    # never needs to stage). SGLang: no, its radix cache takes a prefix once the request
    # that computed it is done.
    shares_prefix_within_a_batch: bool = False
    # At most this many label ids per call; more take further calls on the cached prefix.
    max_ids_per_call: int | None = None
    # The server's flag that raises its context, named when a branch is too long for it.
    context_flag: str = "its context length"
    # Many branches in one call, or None (one call per branch):
    # (rids, [(input ids, label ids)], salt) -> the JSON body
    batch_body: Callable[[Sequence[str], Sequence[Item], str], dict] | None = None
    # (the reply's JSON, the rids, the label ids of each item) -> one Reply per item
    parse_batch_reply: Callable[[Any, Sequence[str], Sequence[Sequence[int]]], list[Reply]] | None = None
    # Whether a call generates no token (the label log-probs come from the prefill alone).
    prefill_only: bool = False
    # Whether a batched call keeps the cache namespace for every item (SGLang-JAX 0.1.0rc0
    # drops `extra_key` when it splits a batch): a namespaced plan is batched only if so.
    batch_keeps_namespace: bool = False
    # Where a batched call goes, if not to generate_path (vLLM: /v1/completions).
    batch_path: str | None = None
    # Whether a batched call asks every item for the same label ids (the union of the
    # items', at most max_ids_per_call; vLLM's completions take one list per call).
    batch_shares_labels: bool = False
    # The bodies that abort every item of a batched call, given its rids (None: one
    # abort_body per rid).
    batch_abort_bodies: Callable[[Sequence[str]], list[dict]] | None = None
    # A batched call's reply read as several requests' parts, each on its own (the reply,
    # each part's rids, each part's items' label ids) -> per part, its replies or the
    # EngineError that fails it (an EngineError raised: the reply fails as a whole). Where
    # set, concurrent requests' stages may share one call (coalesce.py); the server must
    # answer an item aborted alone and the others in full.
    parse_batch_parts: Callable[[Any, Sequence[Sequence[str]], Sequence[Sequence[Sequence[int]]]], list] | None = None


def json_of(content: bytes) -> object:
    """A reply's JSON: orjson first (fast), the stdlib where orjson refuses what Python's own
    encoder writes (a server that sends `-Infinity`, which orjson does not read)."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(content)
    except ValueError:
        raise EngineError("the engine's reply is not JSON") from None


def computed(replies: Sequence[Reply]) -> int | None:
    """The tokens an answered call computed, for the cost model; None where it failed (no
    replies) or the server did not say what it found cached in every item."""
    if not replies:
        return None
    computed = 0
    for _, prompt, cached in replies:
        if prompt is None or cached is None:
            return None
        computed += prompt - cached
    return computed
