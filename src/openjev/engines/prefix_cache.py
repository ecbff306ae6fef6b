"""A byte-bounded LRU of prefix KV, keyed by token ids, with longest-prefix lookup.

Entries live in namespaces (Plan.cache_namespace): a lookup sees only its own namespace's
entries, so one tenant never reuses, or learns of, another's state. "" is the namespace
of a server without keys. The byte bound is shared by all namespaces (one LRU).

Values are duck-typed (`nbytes`, `prefix(m)`, `contiguous()`; the in-process engine stores
KVChains), so the policy is testable without a model. Any prefix of a stored sequence is
usable (causal attention), so lookups match partially: a request that shares only the
first m tokens of an entry reuses those m. Not thread-safe: the engine's worker thread
owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by binary search over C-speed slice compares."""
    hi = min(len(a), len(b))
    if hi == 0 or a[0] != b[0]:
        return 0
    if a[:hi] == b[:hi]:
        return hi
    lo = 1  # a[:lo] == b[:lo] holds
    hi -= 1  # a[:hi + 1] != b[:hi + 1] holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def longest_match(
    keys: Iterable[tuple[str, tuple[int, ...]]], tokens: tuple[int, ...], namespace: str
) -> tuple[tuple[str, tuple[int, ...]] | None, int]:
    """(key, m) of the `namespace` key sharing the longest prefix m with `tokens` (the first
    such key on a tie); (None, 0) if none shares any."""
    best_key, best = None, 0
    for key in keys:
        if key[0] != namespace:
            continue
        m = common_prefix_len(key[1], tokens)
        if m > best:
            best_key, best = key, m
    return best_key, best


class CacheCounters(Protocol):
    """What `cache_stats` reads: both PrefixCache and llamacpp.cache.StateCache have it."""

    @property
    def nbytes(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def lookups(self) -> int: ...
    @property
    def hits(self) -> int: ...

    def __len__(self) -> int: ...


def cache_stats(cache: CacheCounters) -> dict[str, float]:
    """A prefix cache's metrics (prefix_cache_*), read without locking."""
    return {
        "prefix_cache_bytes": cache.nbytes,
        "prefix_cache_max_bytes": cache.max_bytes,
        "prefix_cache_entries": len(cache),
        "prefix_cache_lookups": cache.lookups,
        "prefix_cache_hits": cache.hits,
        "prefix_cache_hit_ratio": cache.hits / cache.lookups if cache.lookups else 0.0,
    }


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], Any] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.lookups = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int], namespace: str = "") -> tuple[int, Any | None]:
        """(m, value.prefix(m)) for the entry of `namespace` sharing the longest prefix with
        `tokens`; (0, None) if none."""
        self.lookups += 1
        tokens = tuple(tokens)
        best_key, best = longest_match(self._entries, tokens, namespace)
        if best_key is None:
            return 0, None
        self.hits += 1
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key].prefix(best)

    def peek(self, tokens: Sequence[int], namespace: str = "") -> int:
        """How many leading `tokens` an entry of `namespace` holds, read from any thread (a
        snapshot of the keys; no LRU move, no hit counted)."""
        tokens = tuple(tokens)
        keys = list(self._entries)  # one C-level copy: the worker thread may insert meanwhile
        return max((common_prefix_len(seq, tokens) for ns, seq in keys if ns == namespace), default=0)

    def insert(self, tokens: Sequence[int], value: Any, namespace: str = "") -> bool:
        """Keep `value` (the KV of exactly `tokens`) in `namespace`; False if disabled or
        larger than the bound."""
        tokens = tuple(tokens)
        if not tokens or value.nbytes > self.max_bytes:
            return False
        for key in list(self._entries):
            ns, seq = key
            if ns != namespace:
                continue
            if len(seq) >= len(tokens) and seq[: len(tokens)] == tokens:
                self._entries.move_to_end(key)  # already covered by a longer entry
                return True
            if len(seq) < len(tokens) and tokens[: len(seq)] == seq:
                self._drop(key)  # superseded: the new entry covers it
        value = value.contiguous()
        self._entries[(namespace, tokens)] = value
        self._bytes += value.nbytes
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        self._bytes -= self._entries.pop(key).nbytes
