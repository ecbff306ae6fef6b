"""The llama.cpp engine's prefix cache: KV sequences kept across requests, bounded by bytes.

An entry is a request's root (its shared prefix) left in the context's KV cache under a
sequence id of its own; a later request whose root starts the same way copies the shared
positions into its own sequences (llama.cpp's seq_cp adds a sequence to a cell: nothing is
copied) and computes only the rest. Entries live in namespaces (Plan.cache_namespace): a
lookup sees only its own namespace's entries. The bound counts each entry's cells at the
context's bytes per cell; cells two entries share are counted twice (the bound is never
exceeded). Least recently used entries go first.

Pure bookkeeping over sequence ids (the engine applies the KV operations): testable
without a model. Not thread-safe: the engine's worker thread owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from openjev.engines.prefix_cache import longest_match


class SeqCache:
    def __init__(self, max_bytes: int, bytes_per_cell: int) -> None:
        self.max_bytes = max_bytes
        self.bytes_per_cell = max(1, bytes_per_cell)
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], int] = OrderedDict()
        self.hits = 0
        self.lookups = 0

    @property
    def cells(self) -> int:
        return sum(len(key[1]) for key in self._entries)

    @property
    def nbytes(self) -> int:
        return self.cells * self.bytes_per_cell

    def __len__(self) -> int:
        return len(self._entries)

    def seqs(self) -> list[int]:
        return list(self._entries.values())

    def lookup(self, tokens: Sequence[int], namespace: str = "") -> tuple[int, int | None]:
        """(m, seq) of the `namespace` entry sharing the longest prefix with `tokens` (its
        first m positions are usable); (0, None) if none."""
        self.lookups += 1
        tokens = tuple(tokens)
        best_key, best = longest_match(self._entries, tokens, namespace)
        if best_key is None:
            return 0, None
        self.hits += 1
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key]

    def insert(self, tokens: Sequence[int], seq: int, namespace: str = "") -> list[int]:
        """Keep `seq` (holding exactly `tokens`) in `namespace`. Returns the sequences the
        caller must now clear: entries it supersedes or that the bound evicts, or `seq`
        itself where it is not kept (too large, or covered by a longer entry)."""
        tokens = tuple(tokens)
        if not tokens or len(tokens) * self.bytes_per_cell > self.max_bytes:
            return [seq]
        freed: list[int] = []
        for key in list(self._entries):
            ns, held = key
            if ns != namespace:
                continue
            if len(held) >= len(tokens) and held[: len(tokens)] == tokens:
                self._entries.move_to_end(key)  # already covered by a longer entry
                return [seq]
            if len(held) < len(tokens) and tokens[: len(held)] == held:
                freed.append(self._entries.pop(key))  # superseded: the new entry covers it
        self._entries[(namespace, tokens)] = seq
        while self.nbytes > self.max_bytes:
            dropped = self.pop_lru()
            if dropped is None:
                break
            freed.append(dropped)
        return freed

    def pop_lru(self, keep: int | None = None) -> int | None:
        """Drop the least recently used entry whose sequence is not `keep` (one in use); its
        sequence (the caller clears it), or None if there is none."""
        for key, seq in self._entries.items():
            if seq != keep:
                del self._entries[key]
                return seq
        return None

    def clear(self) -> list[int]:
        seqs = list(self._entries.values())
        self._entries.clear()
        return seqs
