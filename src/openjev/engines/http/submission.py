"""Submission strategies for engines with a radix (prefix) cache, planned on the trie.

An engine like SGLang caches the KV of every prefix it has computed, but branches sent at
the same moment all start before any of them has cached the shared prefix, and each pays
for it. The strategies order submissions so that the shared part is computed once:

- all:    every branch at once (right when the prefix is already cached, or short);
- warmup: the shared prefix alone first (one extra call), then every branch (seed one);
- staged: one real branch per group first, then the rest of the group, recursively down
          the trie; what may go at the same moment goes in one stage (the rest of a
          group beside the other groups' seeds: seed two); no extra call;
- auto:   per request: `all` when there is one branch, the shared prefix is short, it was
          sent recently (likely still cached), one batched call computes it about once
          anyway (the server's chunked prefill admits the other branches once the first
          has cached it: one_batch_extra_tokens), or the server's measured costs
          (CallCosts) say that computing what one call computes again takes less time than
          a second round trip (a cheap forward, as on a GPU); otherwise `staged`.

The planner is pure: it drives two awaitables, `branches(indices)` (a stage: branches
submitted together, which the engine may send in one call) and `prefix(tokens)`.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from openjev.core.plan import Plan, TrieNode
from openjev.errors import OpenjevError

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


class CallCosts:
    """What one call to the engine server costs, learned from the calls made:
    seconds = fixed + per_token x computed tokens, fitted by least squares over the last
    `window` calls whose computed tokens the server reported. `fixed` is the round trip
    (HTTP both ways, scheduling and detokenizing), `per_token` the forward.

    Only calls that ran alone are learned from (`begin`/`end`: no other call of this engine
    in flight at any time between them): a call that waited behind another's forward would
    count that wait as its own round trip, and under load the fit would see a large fixed
    cost and cheap tokens, and send a CPU's cold prefixes in one batch that computes them
    again. Thread-safe."""

    def __init__(self, window: int = 256, min_calls: int = 16) -> None:
        self._calls: deque[tuple[int, float]] = deque(maxlen=window)
        self._min = min_calls
        self._lock = threading.Lock()
        self._started = 0  # calls begun, ever
        self._active = 0  # calls in flight

    def begin(self) -> tuple[int, bool]:
        """A call starts; its ticket for `end`."""
        with self._lock:
            ticket = (self._started, self._active == 0)
            self._started += 1
            self._active += 1
            return ticket

    def end(self, ticket: tuple[int, bool], computed_tokens: int | None, seconds: float) -> None:
        """The call of `ticket` ended (answered, or failed: `computed_tokens` None); learned
        from where it was answered and ran alone."""
        with self._lock:
            self._active -= 1
            alone = ticket[1] and self._started == ticket[0] + 1
        if alone and computed_tokens is not None:
            self.record(computed_tokens, seconds)

    def record(self, computed_tokens: int, seconds: float) -> None:
        """One call that ran alone: its computed tokens and its seconds."""
        with self._lock:
            self._calls.append((computed_tokens, seconds))

    def estimate(self) -> tuple[float, float] | None:
        """(fixed seconds per call, seconds per computed token), or None until `min_calls`
        calls of different sizes were seen (a fit needs the spread). Both clamped at 0:
        a noisy window must not make a call or a token look free of cost below nothing."""
        with self._lock:
            calls = list(self._calls)
        if len(calls) < self._min:
            return None
        n = len(calls)
        mean_t = sum(t for t, _ in calls) / n
        mean_s = sum(s for _, s in calls) / n
        var = sum((t - mean_t) ** 2 for t, _ in calls)
        if var == 0:
            return None
        per_token = max(0.0, sum((t - mean_t) * (s - mean_s) for t, s in calls) / var)
        return max(0.0, mean_s - per_token * mean_t), per_token


def choose(
    strategy: str,
    plan: Plan,
    recent: RecentPrefixes,
    *,
    warmup_min_tokens: int,
    batched: bool = False,
    step_tokens: int | None = None,
    stage_min_tokens: int = 32,
    costs: tuple[float, float] | None = None,
) -> str:
    """The concrete strategy for this plan. `batched`: every branch of a stage goes in one
    call; then `step_tokens`, the most the server prefills per scheduling step (None where
    it does not say), and `costs`, CallCosts.estimate() of the server (None until known).

    The same comparison holds with other calls in flight: a call's fixed cost is mostly the
    server's own work per call (its HTTP front end, scheduling, detokenizing), which those
    calls wait for as they wait for tokens computed again; staging them all while busy
    doubled the calls where the forward is cheap (a tiny model over SGLang, as on a GPU:
    0.60-0.76x SGLang's own decisions/s at 8 clients, 0.83-0.87x deciding by the costs;
    docs/engines-sglang.md)."""
    if strategy != "auto":
        return strategy
    if len(plan.branches) == 1 or plan.shared_prefix_len < warmup_min_tokens:
        return "all"
    if recent.seen(plan.root.tokens, plan.cache_namespace):  # cached in this plan's namespace
        return "all"
    if batched:
        extra = one_batch_extra_tokens(plan, step_tokens)
        if extra <= stage_min_tokens * (len(plan.branches) - 1):
            return "all"  # one call computes about what staged's two do
        if costs is not None and costs[1] * extra <= costs[0]:
            return "all"  # computing them again takes less time than a second round trip
    return "staged"


def one_batch_extra_tokens(plan: Plan, step_tokens: int | None) -> int:
    """How many tokens more than the plan's distinct tokens one batched call of every
    branch computes, on a server that prefills at most `step_tokens` per scheduling step in
    the items' order (SGLang's chunked prefill) and caches a prefix once the branch that
    computed it is done (or, chunk by chunk, while a longer one is chunked).

    - The first branch longer than a step: its earlier chunks are cached before the others
      are admitted beside its last one, so each other branch computes only what of the
      shared prefix those chunks do not cover (nothing if they cover it all: measured on
      SGLang 0.5.23, docs/engines-sglang.md).
    - Otherwise the branches that fit in the first step beside the first compute the prefix
      side by side (the next is chunked into what is left of the step and computes that much
      of it); the rest are admitted once the first is done and find the prefix cached.
    - No step known: every branch may be admitted at once and compute the prefix (the worst).

    Deeper shared runs (a question's readings) are counted once per branch on top."""
    shared, first, rest = plan.shared_prefix_len, len(plan.branches[0]), plan.branches[1:]
    deeper = first + sum(len(b) - shared for b in rest) - plan.unique_tokens
    if step_tokens is None:
        return deeper + shared * len(rest)
    if first > step_tokens:
        covered = step_tokens * ((first - 1) // step_tokens)
        return deeper + max(0, shared - covered) * len(rest)
    budget, again = step_tokens - first, 0
    for b in rest:
        if budget <= 0:
            break
        again += min(budget, shared)
        budget -= len(b)
    return deeper + again


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
    """Precondition: the path down to `node` is cached iff `seed` (a branch below it) is done.

    Once `seed` is done, everything that may go goes in ONE stage: the branches whose runs
    below the cached path are too short to be worth a round trip (or are cached by then),
    and one seed for each group below that shares a run worth staging; each such group's
    rest follows once that stage is done, the groups side by side. One stage rather than a
    call per group: a server admits one call's items in the same scheduling step, where
    calls sent side by side may land a step apart (and each costs its round trip)."""
    if seed is None:
        seed = node.branch_indices()[0]
        await branches([seed])
    now: list[int] = []
    groups: list[TrieNode] = []
    _ready(node, seed, stage_min, now, groups)
    seeds = [group.branch_indices()[0] for group in groups]
    if now or seeds:
        await branches(now + seeds)
    await together([_staged(group, s, branches, stage_min) for group, s in zip(groups, seeds, strict=True)])


def _ready(node: TrieNode, seed: int, stage_min: int, now: list[int], groups: list[TrieNode]) -> None:
    """Below `node`, once `seed` is done: the branches that may go now (into `now`) and the
    groups that need a seed of their own first (into `groups`)."""
    now += [i for i in node.ends if i != seed]
    for child in node.children:
        below = child.branch_indices()
        if seed in below:
            _ready(child, seed, stage_min, now, groups)
        elif len(below) > 1 and len(child.tokens) >= stage_min:
            groups.append(child)
        else:  # one branch, or a run too short to be worth a round trip
            now += below


async def together(aws: list[Coroutine[Any, Any, None]]) -> None:
    """Run `aws` concurrently; the first failure cancels the rest (an ExceptionGroup)."""
    if not aws:
        return
    async with asyncio.TaskGroup() as group:
        for aw in aws:
            group.create_task(aw)


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to report for a failed request: ours if any, else the first."""
    flat: list[BaseException] = []

    def walk(g: BaseExceptionGroup) -> None:
        for e in g.exceptions:
            walk(e) if isinstance(e, BaseExceptionGroup) else flat.append(e)

    walk(group)
    return next((e for e in flat if isinstance(e, OpenjevError)), flat[0])
