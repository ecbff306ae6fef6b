"""Submission strategies for engines with a radix (prefix) cache, planned on the trie.

An engine like SGLang caches the KV of every prefix it has computed, but branches sent at
the same moment all start before any of them has cached the shared prefix, and each pays
for it. The strategies order submissions so that the shared part is computed once:

- all:    every branch at once (right when the prefix is already cached, or short);
- warmup: the shared prefix alone first (one extra call), then every branch (seed one);
- staged: one real branch per group first, then the rest of the group, recursively down
          the trie; independent groups run together (seed two); no extra call;
- auto:   per request: `all` when there is one branch, the shared prefix is short, it was
          sent recently (likely still cached), or one batched call computes it once anyway
          (the server's chunked prefill serializes the first branch); otherwise `staged`.

The planner is pure: it drives two awaitables, `branches(indices)` (a stage: branches
submitted together, which the engine may send in one call) and `prefix(tokens)`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from openjev.core.plan import Plan, TrieNode

STRATEGIES = ("all", "warmup", "staged", "auto")


class RecentPrefixes:
    """Which shared prefixes were sent lately (bounded LRU of their hashes)."""

    def __init__(self, size: int = 4096) -> None:
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._size = size

    def seen(self, tokens: Sequence[int], namespace: str = "") -> bool:
        return hash((namespace, tuple(tokens))) in self._seen

    def add(self, tokens: Sequence[int], namespace: str = "") -> None:
        key = hash((namespace, tuple(tokens)))
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self._size:
            self._seen.popitem(last=False)


def choose(
    strategy: str,
    plan: Plan,
    recent: RecentPrefixes,
    *,
    warmup_min_tokens: int,
    step_tokens: int | None = None,
    stage_min_tokens: int = 32,
) -> str:
    """The concrete strategy for this plan. `step_tokens`: the most the server prefills per
    scheduling step, when every branch of a stage goes in one batched call (else None)."""
    if strategy != "auto":
        return strategy
    if len(plan.branches) == 1 or plan.shared_prefix_len < warmup_min_tokens:
        return "all"
    if recent.seen(plan.root.tokens, plan.cache_namespace):  # cached in this plan's namespace
        return "all"
    if step_tokens and one_batch_computes_the_prefix_once(plan, step_tokens, stage_min_tokens):
        return "all"
    return "staged"


def one_batch_computes_the_prefix_once(plan: Plan, step_tokens: int, slack: int) -> bool:
    """Whether one batched call of every branch computes each shared token once anyway.

    SGLang prefills at most `step_tokens` per step, chunking a longer request and caching
    each chunk as it goes; the first item of a batch then fills every step until its last
    one, and the others, admitted only then, find what its earlier chunks cached. So if
    those chunks cover the shared prefix, one call does what `staged` does in two (measured
    on SGLang 0.5.23: docs/engines-sglang.md). Deeper shared runs are computed per branch in
    one batch: allowed up to `slack` tokens per branch (staged sends such short runs together
    too)."""
    first = len(plan.branches[0])
    if step_tokens * ((first - 1) // step_tokens) < plan.shared_prefix_len:
        return False  # the first branch fits in fewer steps: the others start beside it
    cost = first + sum(len(b) - plan.shared_prefix_len for b in plan.branches[1:])
    return cost - plan.unique_tokens <= slack * (len(plan.branches) - 1)


async def execute(
    strategy: str,
    plan: Plan,
    branches: Callable[[Sequence[int]], Coroutine[Any, Any, None]],
    prefix: Callable[[Sequence[int]], Coroutine[Any, Any, None]],
    *,
    stage_min_tokens: int,
) -> None:
    """Submit every branch of `plan` exactly once, in the order `strategy` prescribes.

    Each `branches(indices)` is one stage (its branches may go in one call); stages that
    do not depend on each other run concurrently; the first failure cancels the rest.
    """
    every = list(range(len(plan.branches)))
    if strategy == "all" or len(every) == 1:
        await branches(every)
    elif strategy == "warmup":
        if plan.root.tokens:
            await prefix(plan.root.tokens)
        await branches(every)
    elif strategy == "staged":
        await _staged(plan.root, None, branches, stage_min_tokens)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")


async def _staged(
    node: TrieNode, seed: int | None, branches: Callable[[Sequence[int]], Coroutine[Any, Any, None]], stage_min: int
) -> None:
    """Precondition: the path down to `node` is cached iff `seed` (a branch below it) is done."""
    if seed is None:
        seed = node.branch_indices()[0]
        await branches([seed])
    now = [i for i in node.ends if i != seed]  # ready now: one stage
    work = []
    for child in node.children:
        below = child.branch_indices()
        if seed in below:
            work.append(_staged(child, seed, branches, stage_min))
        elif len(below) > 1 and len(child.tokens) >= stage_min:
            work.append(_staged(child, None, branches, stage_min))
        else:  # one branch, or a run too short to be worth a round trip
            now += below
    if now:
        work.append(branches(now))
    await together(work)


async def together(aws: list[Coroutine[Any, Any, None]]) -> None:
    """Run `aws` concurrently; the first failure cancels the rest (an ExceptionGroup)."""
    if not aws:
        return
    async with asyncio.TaskGroup() as group:
        for aw in aws:
            group.create_task(aw)
