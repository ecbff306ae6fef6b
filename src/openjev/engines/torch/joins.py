"""Requests that join a prefix already being computed (the in-process scheduler's).

Concurrent requests on one document (an SDK's `abatch` or `gather` asking different
questions of one state) arrive before the first has computed the state, so the prefix
cache cannot serve them yet, and each would compute the whole state. Instead a request
whose shared prefix (its trie's root, the state) overlaps a prefix that a running request
of the same cache namespace is still computing, by more than the cache already holds,
waits (parked) until that leader's root is computed and in the cache; it is then admitted
again and served the prefix from the cache, computing only its own part.

A leader that fails or is cancelled releases its followers just the same: they are
admitted again and compute for themselves (or follow another). Never across namespaces:
a tenant never waits on, or learns of, another's work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from openjev.engines.prefix_cache import common_prefix_len

# A join saves less than this many tokens of prefill: not worth the wait.
MIN_JOIN_TOKENS = 32


class PrefixJoins:
    """Parked jobs, each behind its leader (jobs are the scheduler's; duck-typed here:
    `plan.cache_namespace`, `packing.tokens`, `packing.root_len`, `cursor`, `active`,
    `cancelled`)."""

    def __init__(self) -> None:
        self._parked: list[tuple[Any, Any]] = []  # (follower, leader)

    def __len__(self) -> int:
        return len(self._parked)

    def followers(self) -> list[Any]:
        return [f for f, _ in self._parked]

    def park(self, job: Any, running: Iterable[Any], root: Sequence[int], cached: int) -> bool:
        """Park `job` (its root tokens `root`, of which `cached` come from the cache) behind
        the running job of its namespace still computing the longest overlapping root; False
        (not parked) where none saves MIN_JOIN_TOKENS or more."""
        ns = job.plan.cache_namespace
        best, gain = None, MIN_JOIN_TOKENS - 1
        for other in running:
            p = other.packing
            if other.plan.cache_namespace != ns or not other.active or other.cursor >= p.root_len:
                continue
            shared = common_prefix_len(p.tokens[: p.root_len], root)
            if shared - cached > gain:
                best, gain = other, shared - cached
        if best is None:
            return False
        self._parked.append((job, best))
        return True

    def ready(self) -> list[Any]:
        """The followers to admit again now: their leader's root is computed (and in the
        cache), or the leader ended; cancelled followers are dropped from the list too (the
        caller's admission sees the cancellation)."""
        out, kept = [], []
        for follower, leader in self._parked:
            if follower.cancelled.is_set() or not leader.active or leader.cursor >= leader.packing.root_len:
                out.append(follower)
            else:
                kept.append((follower, leader))
        self._parked = kept
        return out
