"""The in-process engine's scheduler: executes many requests' plans in shared forwards.

Each request is a Job over its Plan's trie. A trie node becomes ready once its parent's
KV is known; the worker thread repeatedly builds a round of ready nodes from all jobs and
runs it as a few ragged forwards. Every trie node is computed once (its KV kept when it
has children), branches under a node run batched, and rows from different requests share
forwards. The root is looked up in the prefix cache first and inserted after.

Fairness: a round takes one ready node per job in turn (round-robin, arrival order) while
the round's token budget lasts, and a node longer than what is left is cut into chunks,
so a large request advances in slices and cannot hold small ones back for long.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from openjev.core.plan import Plan, TrieNode
from openjev.core.ports import BranchResult, PlanResult
from openjev.engines.kv import KVChain, RaggedResult, Row, padded_cost
from openjev.engines.prefix_cache import PrefixCache
from openjev.errors import EngineError

log = logging.getLogger(__name__)


class Runner(Protocol):
    def forward(self, rows: Sequence[Row]) -> RaggedResult: ...

    def read(self, hidden, label_ids: Sequence[Sequence[int]]) -> list[tuple[float, ...]]: ...


@dataclass(frozen=True)
class SchedulerLimits:
    batch_tokens: int  # real tokens per forward
    attention_budget: int  # padded query x key positions per forward
    window_s: float  # gathering window after idle


@dataclass
class _Item:
    node: TrieNode
    past: KVChain  # KV of positions [0, node.start + offset)
    offset: int = 0

    @property
    def remaining(self) -> int:
        return len(self.node.tokens) - self.offset


@dataclass
class Job:
    plan: Plan
    deliver: Callable[[PlanResult | BaseException], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    ready: collections.deque = field(default_factory=collections.deque)
    results: list = field(default_factory=list)
    left: int = 0
    cached: int = 0
    computed: int = 0
    t_submit: float = field(default_factory=time.perf_counter)
    t_start: float | None = None
    t_root: float | None = None


class Scheduler:
    def __init__(self, runner: Runner, cache: PrefixCache, limits: SchedulerLimits) -> None:
        self._runner = runner
        self._cache = cache
        self._limits = limits
        self._inbox: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._jobs: list[Job] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="openjev-engine", daemon=True)
        self._thread.start()
        self.forwards = 0

    # ---- any thread

    async def run(self, plan: Plan) -> PlanResult:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(outcome) -> None:
            def settle() -> None:
                if future.done():
                    return
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            loop.call_soon_threadsafe(settle)

        job = Job(plan=plan, deliver=deliver)
        with self._wake:
            if self._stopped:
                raise EngineError("the engine is shut down")
            self._inbox.append(job)
            self._wake.notify()
        try:
            return await future
        except asyncio.CancelledError:
            job.cancelled.set()  # the worker drops its remaining work
            raise

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # ---- worker thread

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._inbox and not self._jobs and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    for job in [*self._jobs, *self._inbox]:
                        job.deliver(EngineError("the engine is shut down"))
                    return
                idle = not self._jobs
            if idle and self._limits.window_s > 0:
                time.sleep(self._limits.window_s)  # let concurrent arrivals join the first round
            with self._wake:
                arrivals = list(self._inbox)
                self._inbox.clear()
            try:
                for job in arrivals:
                    self._admit(job)
                self._jobs = [j for j in self._jobs if not j.cancelled.is_set() and j.left]
                if self._jobs:
                    self._round()
            except Exception as exc:  # a bug here must fail requests, not hang them
                log.exception("scheduler failure")
                for job in [*self._jobs, *arrivals]:
                    job.deliver(EngineError(f"the engine failed: {exc}"))
                self._jobs = []

    def _admit(self, job: Job) -> None:
        plan = job.plan
        job.results = [None] * len(plan.branches)
        job.left = len(plan.branches)
        root = plan.root
        m, chain = self._cache.lookup(root.tokens) if root.tokens else (0, None)
        if root.ends:  # the root's last position must be computed to read it
            m = min(m, len(root.tokens) - 1)
        chain = chain.prefix(m) if chain is not None else KVChain()
        job.cached = m
        if m == len(root.tokens):  # fully cached, nothing to read at the root itself
            job.t_root = time.perf_counter()
            for child in root.children:
                job.ready.append(_Item(child, chain))
        else:
            job.ready.append(_Item(root, chain, offset=m))
        self._jobs.append(job)

    def _round(self) -> None:
        picked: list[tuple[Job, _Item, int]] = []
        tokens = 0
        budget = self._limits.batch_tokens
        progressed = True
        while progressed and tokens < budget:
            progressed = False
            for job in self._jobs:
                if not job.ready or tokens >= budget:
                    continue
                item = job.ready[0]
                if picked and item.remaining > budget - tokens:
                    continue  # would be cut to a sliver: wait for the next round
                job.ready.popleft()
                take = min(item.remaining, budget - tokens)
                # one row alone must also fit the attention budget
                while take > 1 and take * (item.past.length + take) > self._limits.attention_budget:
                    take = max(1, take // 2)
                picked.append((job, item, take))
                tokens += take
                progressed = True
                if job.t_start is None:
                    job.t_start = time.perf_counter()
        for group in self._partition(picked):
            self._forward(group)

    def _partition(self, picked: list[tuple[Job, _Item, int]]) -> list[list[tuple[Job, _Item, int]]]:
        """Forwards of similar lengths (padding stays small) within the attention budget."""
        picked = sorted(picked, key=lambda p: p[2])
        groups: list[list] = []
        for entry in picked:
            if groups:
                group = groups[-1]
                shortest = group[0][2]
                rows = [self._row(*g) for g in group] + [self._row(*entry)]
                if entry[2] <= 2 * shortest + 8 and padded_cost(rows) <= self._limits.attention_budget:
                    group.append(entry)
                    continue
            groups.append([entry])
        return groups

    @staticmethod
    def _row(job: Job, item: _Item, take: int) -> Row:
        tokens = item.node.tokens[item.offset : item.offset + take]
        finished = take == item.remaining
        keep = not finished or bool(item.node.children) or item.node.start == 0
        return Row(past=item.past, tokens=tokens, keep_kv=keep)

    def _forward(self, group: list[tuple[Job, _Item, int]]) -> None:
        live = [g for g in group if not g[0].cancelled.is_set()]
        if not live:
            return
        rows = [self._row(*g) for g in live]
        try:
            result = self._runner.forward(rows)
        except Exception as exc:  # the engine's failure, reported to the requests it hits
            log.exception("forward failed")
            error = exc if isinstance(exc, EngineError) else EngineError(f"the engine failed: {exc}")
            for job in {id(g[0]): g[0] for g in live}.values():
                job.deliver(error)
                job.left = 0
            return
        self.forwards += 1
        reads: list[tuple[Job, int, int]] = []  # (job, branch index, row)
        for r, ((job, item, take), row) in enumerate(zip(live, rows)):
            job.computed += take
            chain = item.past.extend(result.new_chunks[r]) if row.keep_kv else None
            if take < item.remaining:
                job.ready.appendleft(_Item(item.node, chain, item.offset + take))
                continue
            node = item.node
            if node.start == 0:
                job.t_root = time.perf_counter()
                self._cache.insert(node.tokens, chain)
            for child in node.children:
                job.ready.append(_Item(child, chain))
            reads += [(job, i, r) for i in node.ends]
        if reads:
            import torch  # the runner's tensors; imported here to keep the policy above framework-free

            hidden = result.last_hidden[torch.tensor([r for _, _, r in reads])]
            logprobs = self._runner.read(hidden, [job.plan.branches[i].label_ids for job, i, _ in reads])
            for (job, i, _), lp in zip(reads, logprobs):
                job.results[i] = BranchResult(lp)
                job.left -= 1
                if job.left == 0:
                    self._finish(job)

    def _finish(self, job: Job) -> None:
        now = time.perf_counter()
        start = job.t_start or now
        root = job.t_root or now
        job.deliver(PlanResult(
            branches=tuple(job.results),
            computed_tokens=job.computed,
            cached_tokens=job.cached,
            timings_ms={"queue": (start - job.t_submit) * 1000, "prefill": (root - start) * 1000,
                        "branches": (now - root) * 1000},
        ))
