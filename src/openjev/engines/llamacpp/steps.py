"""One request's work on the llama.cpp context, in steps of one decode call each.

`Executor.steps(job)` is a generator: it restores the request's cached root positions, lays
its trie out (layout.py) and computes it one decode call per step, yielding between calls,
and returns the PlanResult; the engine's worker (engine.py) drives it, and between two steps
may put another request first (the context saved aside whole and restored after, turns.py).
A step is sized in time: as many tokens as the measured cost (engines/cost_model.py) fits in
`slice_s`, within [MIN_STEP, n_batch]; every call is measured into that cost model, which
prices plans before they are admitted (`LlamaCppEngine.estimate_s`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, PlanResult
from openjev.engines.cost_model import CostModel, attended
from openjev.engines.fair_share import Want
from openjev.engines.llamacpp.cache import SavedState, StateCache
from openjev.engines.llamacpp.layout import Item, Layout, layout, leaves
from openjev.engines.llamacpp.lib import Backend
from openjev.errors import EngineError

# The request's root sequence (the cached positions restored into it, saved from it after);
# its leaves take the sequences after it.
ROOT_SEQ = 0
# The fewest tokens of a decode call when the engine has a choice: a smaller call pays
# llama.cpp's per-call work (the graph, the weights streamed once per call) for too few tokens
# (the 1.5B model on 2 cores: 0.61x its best prefill rate in calls of 32, 0.78x at 64, 0.95x at 128).
MIN_STEP = 128


class Cancelled(Exception):
    """The job's request went away: nothing is delivered."""


@dataclass
class Job:
    plan: Plan
    deliver: Callable[[PlanResult | BaseException], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    t_submit: float = field(default_factory=time.perf_counter)
    remaining: int = field(init=False)  # tokens left to compute (the plan's distinct ones before it starts)
    steps: Generator[None, None, PlanResult] | None = None  # set once started
    saved: SavedState | None = None  # its context while another request has it

    def __post_init__(self) -> None:
        self.remaining = self.plan.unique_tokens

    def want(self, step_tokens: int) -> Want:
        """Its next step, for the keys' fair order: its key and the tokens the step computes."""
        return Want(self.plan.share, max(1, min(self.remaining, step_tokens)))


class Executor:
    """Runs jobs' steps on one backend (the worker thread's), measuring each decode call."""

    def __init__(self, backend: Backend, cache: StateCache, cost: CostModel, slice_s: float) -> None:
        self.backend = backend
        self.cache = cache
        self.cost = cost
        self.slice_s = slice_s
        self.decodes = 0
        self.computed_tokens = 0

    def step_tokens(self, context: int) -> int:
        """Tokens of the next decode call continuing `context` cells: about `slice_s` of work."""
        most = self.backend.n_batch
        return self.cost.tokens_within(self.slice_s, context, least=min(MIN_STEP, most), most=most)

    def decode(self, items: Sequence[Item], labels: Sequence[Sequence[int]], context: int) -> list[tuple[float, ...]]:
        """One decode call, timed into the cost model (`context`: the cells in use before it)."""
        t0 = time.perf_counter()
        out = self.backend.decode(items, labels)
        self.cost.observe(len(items), attended(context, len(items)), time.perf_counter() - t0)
        self.decodes += 1
        self.computed_tokens += len(items)
        return out

    def steps(self, job: Job) -> Generator[None, None, PlanResult]:
        """The job's request in the context (empty when it starts): its cached root positions
        restored into the root sequence, the rest of its trie computed a decode call per
        step, the root saved for later requests. The caller clears the context after."""
        plan = job.plan
        t_start = time.perf_counter()
        m = self._restore(plan)
        n_leaves = min(len(leaves(plan.root)), self.backend.n_seq_max - 1)
        lay = layout(
            plan,
            cached=m,
            root_seq=ROOT_SEQ,
            cache_seq=ROOT_SEQ if m else None,
            free_seqs=list(range(ROOT_SEQ + 1, ROOT_SEQ + 1 + n_leaves)),
        )
        job.remaining = lay.computed
        results = yield from self._compute(job, lay, m)
        root = plan.root.tokens
        if root and self.cache.max_bytes > 0 and not self.cache.covers(root, plan.cache_namespace):
            # the root sequence's cells alone (a leaf's own cells are not in it)
            self.cache.insert(root, self.backend.seq_save(ROOT_SEQ), plan.cache_namespace)
        now = time.perf_counter()
        return PlanResult(
            branches=tuple(BranchResult(lp) for lp in results),
            computed_tokens=lay.computed,
            cached_tokens=m,
            timings_ms={"queue": (t_start - job.t_submit) * 1000, "prefill": (now - t_start) * 1000},
        )

    def cached_for(self, plan: Plan) -> int:
        """Root positions the cache would serve `plan`, read from any thread (no LRU move)."""
        root = plan.root.tokens
        if not root or self.cache.max_bytes <= 0:
            return 0
        return max(0, min(self.cache.peek(root, plan.cache_namespace), min(len(b) for b in plan.branches) - 1))

    def _restore(self, plan: Plan) -> int:
        """The cached root positions usable by `plan` (never a position that is read), put
        into the root sequence; 0 where none is cached (or llama.cpp refused the state:
        then the request computes everything)."""
        root = plan.root.tokens
        if not root or self.cache.max_bytes <= 0:
            return 0
        m, state = self.cache.lookup(root, plan.cache_namespace)
        m = min(m, len(root), min(len(b) for b in plan.branches) - 1)
        if m <= 0 or state is None:
            return 0
        if not self.backend.seq_restore(state, ROOT_SEQ):
            self.backend.clear()
            return 0
        self.backend.seq_rm(ROOT_SEQ, m)  # the entry may hold more than this request shares
        return m

    def _compute(self, job: Job, lay: Layout, cached: int) -> Generator[None, None, list[tuple[float, ...]]]:
        b = self.backend
        labels = [branch.label_ids for branch in job.plan.branches]
        results: list[tuple[float, ...] | None] = [None] * len(labels)
        root_len = len(job.plan.root.tokens)
        started = False
        for gi, group in enumerate(lay.groups):
            if gi:
                for seq in lay.groups[gi - 1].leaf_seqs:
                    b.seq_rm(seq)
            if group.copy_from is not None:
                for seq in group.copy_into:
                    b.seq_cp(group.copy_from, seq, 0, group.copy_len)
            cells = cached if gi == 0 else root_len  # what the group's first token attends over
            at = 0
            while at < len(group.items):
                if started:
                    yield  # between two calls (never after the last: the answer goes out in the same step)
                started = True
                if job.cancelled.is_set():
                    raise Cancelled
                chunk = group.items[at : at + self.step_tokens(cells + at)]
                reads = [r for it in chunk for r in it.reads]
                for branch, lp in zip(reads, self.decode(chunk, [labels[r] for r in reads], cells + at), strict=True):
                    results[branch] = lp
                at += len(chunk)
                job.remaining -= len(chunk)
        if any(r is None for r in results):
            raise EngineError("the engine failed: a branch was never read")
        return [r for r in results if r is not None]
