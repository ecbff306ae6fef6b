"""The ids of recently compiled parts, for the next request that reads the same text: a
state (encoding a ~1,000-token state is most of a warm request's compile, about 3 of 4.5 ms
with the embedded tokenizer, and a state asked new questions is what the prefix cache is
for) and a question's reading (production traffic asks its questions again of new states;
their encoding was a tenth of the server's Python time at 8 clients over a tiny SGLang
model). Keys are (cache namespace, the text's key): tenants do not share entries."""

from __future__ import annotations

import threading
from collections import OrderedDict

# About 40 bytes a token held: ~10 MB at this bound.
SHARED_IDS_TOKENS = 262_144
KEY_CHARS_PER_TOKEN = 4  # a key's text is counted as tokens too, at this many characters each


def _size(key: tuple[str, str], ids: tuple[int, ...]) -> int:
    return len(ids) + len(key[1]) // KEY_CHARS_PER_TOKEN


class SharedIds:
    """A least-recently-used map (namespace, text key) -> ids, bounded by what it holds (the
    ids, and the keys' text at KEY_CHARS_PER_TOKEN characters a token: a key is the text
    itself, and a caller's text can take many characters to a token); an entry over a
    quarter of the bound is not kept (it would evict the rest). Safe across the compile's
    worker threads."""

    def __init__(self, max_tokens: int) -> None:
        self._max = max_tokens
        self._entries: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    @property
    def tokens(self) -> int:
        return self._tokens

    def get(self, key: tuple[str, str]) -> tuple[int, ...] | None:
        with self._lock:
            ids = self._entries.get(key)
            if ids is not None:
                self._entries.move_to_end(key)
            return ids

    def put(self, key: tuple[str, str], ids: tuple[int, ...]) -> None:
        size = _size(key, ids)
        if size > self._max // 4:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._tokens -= _size(key, old) if old is not None else 0
            self._entries[key] = ids
            self._tokens += size
            while self._tokens > self._max:
                dropped_key, dropped = self._entries.popitem(last=False)
                self._tokens -= _size(dropped_key, dropped)
