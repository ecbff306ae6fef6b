"""The tokens in flight by key, and how many of them a new request waits for.

Every engine serves the keys with work waiting in their fair order (engines/fair_share.py:
the in-process scheduler's rounds, llama.cpp's turns between decode calls, the HTTP engines'
slots), about in proportion to their weights. So a new request of key K waits for K's own
work in flight and, of another key's, at most as much as that key is served while K's work
runs: its weight's share of K's, `(K's tokens + the request's) x weight / K's weight`,
never more than the key has. With one key (or none: every request's tenant "") that is all
the tokens in flight, the queue order of one tenant.
"""

from __future__ import annotations

from openjev.core.types import Share


class FairQueue:
    """Tokens in flight per key (its tenant), with the weight each was admitted at. Lives on
    the event loop."""

    def __init__(self) -> None:
        self._tokens: dict[str, int] = {}
        self._weights: dict[str, int] = {}

    def add(self, share: Share, tokens: int) -> None:
        """`tokens` admitted for `share`'s key (negative: finished or given back)."""
        held = self._tokens.get(share.tenant, 0) + tokens
        if held > 0:
            self._tokens[share.tenant] = held
            self._weights[share.tenant] = max(1, share.weight)
        else:
            self._tokens.pop(share.tenant, None)
            self._weights.pop(share.tenant, None)

    def ahead(self, share: Share, tokens: int) -> int:
        """Tokens served before a new request of `tokens` for `share` is done, itself included."""
        mine = self._tokens.get(share.tenant, 0) + tokens
        weight = max(1, share.weight)
        others = sum(
            min(held, -(-mine * self._weights[key] // weight))
            for key, held in self._tokens.items()
            if key != share.tenant
        )
        return mine + others
