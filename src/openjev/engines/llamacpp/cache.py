"""The llama.cpp engine's prefix cache: saved KV states of recent roots, outside the context.

An entry is a request's root (its shared prefix) saved as bytes with llama.cpp's
`llama_state_seq_get_data` once the request is done; a later request whose root starts the
same way restores it into a sequence of its own (`llama_state_seq_set_data`), cuts it to
the shared positions and computes only the rest. Kept outside the context, the entries
cost memory only as they are made (the context holds one request's cells, not the cache's
bound as well), and llama.cpp's attention, which runs over every cell in use, sees only
the request's own.

Entries live in namespaces (Plan.cache_namespace): a lookup sees only its own namespace's
entries. The bound counts each entry's saved bytes; least recently used entries go first.
Pure bookkeeping over opaque states (the engine saves and restores them): testable without
a model. Not thread-safe: the engine's worker thread owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from openjev.engines.prefix_cache import longest_match


class SavedState(Protocol):
    """What the backend's seq_save returns: the bytes of one sequence's KV cells."""

    def __len__(self) -> int: ...


class StateCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], SavedState] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], namespace: str = "") -> tuple[int, SavedState | None]:
        """(m, state) of the `namespace` entry sharing the longest prefix with `tokens` (its
        first m positions are usable; the state may hold more); (0, None) if none."""
        self.lookups += 1
        best_key, best = longest_match(self._entries, tuple(tokens), namespace)
        if best_key is None:
            return 0, None
        self.hits += 1
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key]

    def peek(self, tokens: Sequence[int], namespace: str = "") -> int:
        """How many leading `tokens` an entry of `namespace` holds, read from any thread (a
        snapshot of the keys; no LRU move, no lookup counted)."""
        keys = list(self._entries)  # one C-level copy: the worker thread may insert meanwhile
        return longest_match(keys, tuple(tokens), namespace)[1]

    def covers(self, tokens: Sequence[int], namespace: str = "") -> bool:
        """Whether an entry already holds `tokens` (then saving them again is wasted work)."""
        tokens = tuple(tokens)
        return any(ns == namespace and held[: len(tokens)] == tokens for ns, held in self._entries)

    def insert(self, tokens: Sequence[int], state: SavedState, namespace: str = "") -> bool:
        """Keep `state` (the KV of exactly `tokens`) in `namespace`; entries it supersedes
        (a prefix of it) go, and least recently used ones until the bound holds. False where
        it is not kept (larger than the whole bound, or covered by a longer entry)."""
        tokens = tuple(tokens)
        if not tokens or len(state) > self.max_bytes or self.covers(tokens, namespace):
            return False
        for key in list(self._entries):
            ns, held = key
            if ns == namespace and len(held) < len(tokens) and tokens[: len(held)] == held:
                self._drop(key)  # superseded: the new entry covers it
        self._entries[(namespace, tokens)] = state
        self.nbytes += len(state)
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        self.nbytes -= len(self._entries.pop(key))
