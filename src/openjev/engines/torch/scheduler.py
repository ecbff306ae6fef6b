"""The in-process engine's scheduler: executes many requests' plans in shared forwards.

Each request is a Job over its plan packed as a token tree (packing.py): every distinct
token is computed once, in as few forwards as the budgets allow. The root is looked up in
the prefix cache first (its cached positions are not computed) and inserted once known.

A worker thread runs rounds: one slice of each waiting job's packed sequence, round-robin
in arrival order while the round's token budget lasts (with several keys waiting, in their
fair order: about one quantum of tokens per key and weight, engines/fair_share.py), then the
slices as a few ragged forwards of similar lengths. A large request thus advances slice by slice and cannot hold
small ones back for long (fairness); concurrent requests share forwards (throughput).

Each request's slice is also bounded in time: what the measured cost per token allows in
`slice_s` (the first, before any measurement, is kept short). A round boundary is where a
cancelled request stops and where a newly arrived one joins, so on hardware where 2048
tokens take seconds (CPUs) a long prefill reaches one every `slice_s` or so; small
concurrent requests still share a round's forwards up to `batch_tokens`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, PlanResult
from openjev.engines.cost_model import CostModel, attended
from openjev.engines.fair_share import QUANTUM, FairRounds, Want
from openjev.engines.memory import release_free_memory
from openjev.engines.prefix_cache import PrefixCache
from openjev.engines.torch.jobs import Job, JobState
from openjev.engines.torch.joins import PrefixJoins
from openjev.engines.torch.kv import Chunk, KVChain, Row, padded_cost
from openjev.engines.torch.packing import pack
from openjev.engines.worker_inbox import deliverer, post_and_wait
from openjev.errors import EngineError

log = logging.getLogger(__name__)


class Runner(Protocol):
    def forward(self, rows: Sequence[Row]) -> tuple[object, list[Chunk]]:
        """(hidden states (B, S, H), each row's new KV chunk)."""
        ...

    def read(
        self, hidden: Any, picks: Sequence[tuple[int, int]], label_ids: Sequence[Sequence[int]]
    ) -> list[tuple[float, ...]]:
        """Label log-probs at hidden[row, position] for each pick."""
        ...


@dataclass(frozen=True)
class SchedulerLimits:
    batch_tokens: int  # real tokens per round
    attention_budget: int  # padded query x key positions per forward
    window_s: float  # gathering window after idle
    slice_s: float  # target duration of one request's slice
    fair_quantum: int = QUANTUM  # tokens per weight per round while several keys wait (engines/fair_share.py)


# Before any forward was measured, a round takes at most this many tokens; and however slow
# the hardware, a round takes at least MIN_SLICE: each forward has fixed costs (per-layer
# dispatch, copying the past KV) that small rounds pay again and again on a busy CPU.
FIRST_SLICE = 512
MIN_SLICE = 512

# Slices share a forward while the longest is at most RATIO x the shortest + SLACK tokens:
# every row of a forward is padded to its longest, so unlike lengths waste compute.
GROUP_LENGTH_RATIO = 2
GROUP_LENGTH_SLACK = 8


class Scheduler:
    def __init__(self, runner: Runner, cache: PrefixCache, limits: SchedulerLimits, cost: CostModel | None = None):
        self._runner = runner
        self.cost = cost if cost is not None else CostModel(hidden_size=1024)  # measured on the forwards
        self._cache = cache
        self._limits = limits
        self._inbox: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._jobs: list[Job] = []
        self._joins = PrefixJoins()  # jobs waiting for a running job's prefix (engines/torch/joins.py)
        self._fair = FairRounds(limits.fair_quantum)  # which keys' slices go in a round (engines/fair_share.py)
        self._stopped = False
        self.forwards = 0
        self.computed_tokens = 0
        self._s_per_token: float | None = None  # measured forward cost, smoothed
        self._dirty = False  # forwards ran since the allocator last gave memory back
        self._thread = threading.Thread(target=self._loop, name="openjev-engine", daemon=True)
        self._thread.start()

    # ---- any thread

    async def run(self, plan: Plan) -> PlanResult:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PlanResult] = loop.create_future()
        job = Job(plan=plan, deliver=deliverer(loop, future))
        # a cancelled request: the worker drops its remaining work
        return await post_and_wait(self._wake, self._inbox, lambda: self._stopped, job, future, job.cancel)

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # ---- worker thread

    def _loop(self) -> None:
        while True:
            if self._dirty and not self._jobs and not self._inbox:
                self._dirty = False
                # idle: a few ms here cost nobody anything. A forward's working set (attention
                # scores, activations: up to hundreds of MB with large slices) is freed after it,
                # but stays mapped until trimmed (bench/bench_load.py --rss-minutes)
                release_free_memory()
            with self._wake:
                while not self._inbox and not self._jobs and not self._joins and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    for job in [*self._jobs, *self._inbox, *self._joins.followers()]:
                        job.fail(EngineError("the engine is shut down"))  # a finished job is left alone
                    return
                idle = not self._jobs
            if idle and self._limits.window_s > 0:
                time.sleep(self._limits.window_s)  # let concurrent arrivals join the first round
            with self._wake:
                arrivals = list(self._inbox)
                self._inbox.clear()
            try:
                for job in [*self._joins.ready(), *arrivals]:  # followers whose prefix is now cached first
                    self._admit(job)
                self._jobs = [j for j in self._jobs if j.active]
                if self._jobs:
                    self._round()
            except Exception as exc:
                log.exception("scheduler failure")
                for job in [*self._jobs, *arrivals]:
                    job.fail(EngineError("the engine failed", detail=f"{type(exc).__name__}: {exc}"))
                self._jobs = []

    def _admit(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.state = JobState.CANCELLED
            return
        packed = job.packed = job.packed or pack(job.plan)  # a follower admitted again keeps its packing
        root, ns = packed.tokens[: packed.root_len], job.plan.cache_namespace  # only its own namespace's cache
        m, chain = self._cache.lookup(root, ns) if packed.root_len else (0, None)
        m = min(m, packed.reads[0][1])  # a position that is read must be computed
        # A join waits for the leader's root to reach the cache: with the cache off there is
        # nothing to wait for, and the request shares the leader's forwards instead.
        if self._cache.max_bytes > 0 and self._joins.park(job, self._jobs, root, m):
            return  # admitted again once the running job's prefix is in the cache
        job.state, job.results = JobState.RUNNING, [None] * len(job.plan.branches)
        job.chain = chain.prefix(m) if chain is not None else KVChain()
        job.cursor = job.cached = m
        self._jobs.append(job)

    def slice_tokens(self) -> int:
        """The longest slice of one request: --batch-tokens, or fewer where that would take
        longer than slice_s at the measured cost (never below MIN_SLICE)."""
        cap = self._limits.batch_tokens
        if self._s_per_token is None:
            return min(cap, FIRST_SLICE)
        return max(min(cap, MIN_SLICE), min(cap, int(self._limits.slice_s / self._s_per_token)))

    def _round(self) -> None:
        picked: list[tuple[Job, int]] = []
        # Each request's slice is bounded in time; the round as a whole in tokens, so small
        # concurrent requests still share forwards.
        tokens, budget, longest = 0, self._limits.batch_tokens, self.slice_tokens()
        wants = [Want(job.plan.share, min(job.remaining, longest)) for job in self._jobs]
        # one slice each, in the keys' fair order (one key: arrival order, older jobs first)
        for i in self._fair.pick(wants, budget):
            job = self._jobs[i]
            take = min(wants[i].tokens, budget - tokens)
            # a slice must also fit the attention budget alone
            while take > 1 and take * (job.cursor + take) > self._limits.attention_budget:
                take = max(1, take // 2)
            picked.append((job, take))
            tokens += take
            if job.t_start is None:
                job.t_start = time.perf_counter()
        # the next round starts with whoever went last, so no job is always served first
        if len(self._jobs) > 1:
            self._jobs.append(self._jobs.pop(0))
        for group in self._partition(picked):
            if self._stopped:  # shutting down: the loop fails every job next
                return
            self._forward(group)

    def _row(self, job: Job, take: int) -> Row:
        p, c = job.packing, job.cursor
        return Row(
            past=job.chain,
            tokens=p.tokens[c : c + take],
            positions=p.positions[c : c + take],
            visible=p.visibility(c, c + take),
        )

    def _partition(self, picked: list[tuple[Job, int]]) -> list[list[tuple[Job, int, Row]]]:
        """Forwards of similar lengths (padding stays small) within the attention budget."""
        groups: list[list[tuple[Job, int, Row]]] = []
        for job, take in sorted(picked, key=lambda p: p[1]):
            row = self._row(job, take)
            if groups:
                group = groups[-1]
                if (
                    take <= GROUP_LENGTH_RATIO * group[0][1] + GROUP_LENGTH_SLACK
                    and padded_cost([g[2] for g in group] + [row]) <= self._limits.attention_budget
                ):
                    group.append((job, take, row))
                    continue
            groups.append([(job, take, row)])
        return groups

    def _forward(self, group: list[tuple[Job, int, Row]]) -> None:
        group = [g for g in group if g[0].active]
        if not group:
            return
        t0 = time.perf_counter()
        try:
            hidden, chunks = self._runner.forward([row for _, _, row in group])
        except Exception as exc:
            log.exception("forward failed")
            error = (
                exc
                if isinstance(exc, EngineError)
                else EngineError("the engine failed", detail=f"{type(exc).__name__}: {exc}")
            )
            for job, _, _ in group:
                job.fail(error)  # FAILED: dropped next round
            return
        self._measured(group, time.perf_counter() - t0)
        picks, labels, owners, inserts = _advance(group, chunks)
        if picks:
            for (job, branch), lp in zip(owners, self._runner.read(hidden, picks, labels), strict=True):
                job.results[branch] = BranchResult(lp)
            for job in {id(j): j for j, _ in owners}.values():
                if job.all_read:
                    job.finish()
        # After the answers are out: the insert copies the root's KV into one tensor, which
        # no answer of this forward waits for.
        for job, root in inserts:
            self._cache.insert(job.packing.tokens[: job.packing.root_len], root, job.plan.cache_namespace)

    def _measured(self, group: list[tuple[Job, int, Row]], elapsed: float) -> None:
        """A forward of `group` took `elapsed` s: counted, and learned by the cost model."""
        self.forwards += 1
        self._dirty = True
        real = sum(take for _, take, _ in group)
        self.computed_tokens += real
        self.cost.observe(real, sum(attended(job.cursor, take) for job, take, _ in group), elapsed)
        per_token = elapsed / real
        self._s_per_token = per_token if self._s_per_token is None else 0.7 * self._s_per_token + 0.3 * per_token


def _advance(
    group: list[tuple[Job, int, Row]], chunks: list[Chunk]
) -> tuple[list[tuple[int, int]], list[tuple[int, ...]], list[tuple[Job, int]], list[tuple[Job, KVChain]]]:
    """Each job of a forward moved past its slice: the reads that fell in it (row and
    position, labels, the job and branch they answer) and the states whose KV is complete
    now (to enter the prefix cache)."""
    picks: list[tuple[int, int]] = []
    labels: list[tuple[int, ...]] = []
    owners: list[tuple[Job, int]] = []
    inserts: list[tuple[Job, KVChain]] = []
    now = time.perf_counter()
    for r, ((job, take, _), chunk) in enumerate(zip(group, chunks, strict=True)):
        start = job.cursor
        job.chain = job.chain.extend(chunk)
        job.cursor += take
        job.computed += take
        p = job.packing
        if start < p.root_len <= job.cursor:
            job.t_root = now
            inserts.append((job, job.chain.prefix(p.root_len)))
        while job.next_read < len(p.reads) and p.reads[job.next_read][1] < job.cursor:
            branch, index = p.reads[job.next_read]
            picks.append((r, index - start))
            labels.append(job.plan.branches[branch].label_ids)
            owners.append((job, branch))
            job.next_read += 1
    return picks, labels, owners, inserts
