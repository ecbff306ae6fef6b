"""The llama.cpp engine: GGUF files served as they are, in-process, on the core's Engine port.

A plan's trie is one llama.cpp batch (layout.py): every distinct token computed
once, in every branch's KV sequence below it, at its true position, with logits only where
a branch ends; the batch goes in decode calls of at most `n_batch` tokens. The roots of
recent requests are saved outside the context as KV states (cache.py), bounded by bytes
and namespaced by Plan.cache_namespace; a later root that starts the same way restores the
shared positions and computes only the rest. The context holds one request's cells at a
time, so attention (which llama.cpp runs over every cell in use) sees only the request's.

All llama.cpp work runs on one worker thread, one request at a time (a 2-core CPU is
saturated by one decode; llama.cpp parallelises inside it): in arrival order, or where
several keys wait, the least served key's first (engines/fair_share.py). A cancelled
request (the service's deadline, a client gone) stops at the next decode call: its queued
work is dropped and the sequences it used are cleared.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, Engine, PlanResult
from openjev.engines.fair_share import FairTurns, Want
from openjev.engines.llamacpp.cache import StateCache
from openjev.engines.llamacpp.layout import Layout, layout, leaves
from openjev.engines.llamacpp.lib import Backend
from openjev.engines.memory import release_free_memory
from openjev.engines.prefix_cache import cache_stats
from openjev.engines.worker_inbox import deliverer, post_and_wait
from openjev.errors import EngineError, OpenjevError, TokensExceeded

log = logging.getLogger(__name__)


@dataclass
class _Job:
    plan: Plan
    deliver: Callable[[PlanResult | BaseException], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    t_submit: float = field(default_factory=time.perf_counter)
    want: Want = field(init=False)  # its key and distinct tokens, for the fair order

    def __post_init__(self) -> None:
        self.want = Want(self.plan.share, self.plan.unique_tokens)


# The request's root sequence (the cached positions restored into it, saved from it after);
# its leaves take the sequences after it.
ROOT_SEQ = 0


class _Cancelled(Exception):
    """The job's request went away: nothing is delivered."""


class LlamaCppEngine(Engine):
    """The Engine port over a llama.cpp context. It runs no parallel layouts (the service
    reads those questions another way): a layout's spans would repeat positions within one
    sequence, which llama.cpp's batch refuses."""

    parallel_layouts = False

    def __init__(self, backend: Backend, *, prefix_cache_bytes: int) -> None:
        self.backend = backend
        self.cache = StateCache(prefix_cache_bytes)
        self._inbox: collections.deque[_Job] = collections.deque()
        self._wake = threading.Condition()
        self._stopped = False
        self._turns = FairTurns()  # whose request runs next when several keys wait
        self.decodes = 0
        self.computed_tokens = 0
        self._thread = threading.Thread(target=self._loop, name="openjev-llamacpp", daemon=True)
        self._thread.start()

    # ---- any thread

    async def run(self, plan: Plan) -> PlanResult:
        self._check_fits(plan)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PlanResult] = loop.create_future()
        job = _Job(plan, deliverer(loop, future))
        # a cancelled request: the worker stops at its next decode call
        return await post_and_wait(self._wake, self._inbox, lambda: self._stopped, job, future, job.cancelled.set)

    def _check_fits(self, plan: Plan) -> None:
        """A branch past the model's trained length, or a plan larger than the whole KV cache,
        is refused before any work (422)."""
        b = self.backend
        longest = max(len(branch) for branch in plan.branches)
        if longest > b.n_ctx_train:
            raise TokensExceeded(f"a branch of {longest} tokens exceeds the model's context of {b.n_ctx_train}")
        if plan.unique_tokens > b.n_ctx:
            raise TokensExceeded(f"the request's {plan.unique_tokens} distinct tokens exceed the engine's {b.n_ctx}")

    async def close(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        await asyncio.to_thread(self._thread.join, 30)
        if not self._thread.is_alive():
            self.backend.close()

    def stats(self) -> dict[str, float]:
        """For metrics, read without locking (plain numbers written by the worker thread)."""
        return {
            **cache_stats(self.cache),
            "engine_forwards": self.decodes,
        }

    # ---- worker thread

    def _loop(self) -> None:
        dirty = False
        while True:
            if dirty and not self._inbox:
                # idle: what a request freed (its plan's lists, its states' buffers) stays
                # mapped by glibc until trimmed; a few ms here cost no one anything
                dirty = False
                release_free_memory()
            with self._wake:
                while not self._inbox and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    for job in self._inbox:
                        job.deliver(EngineError("the engine is shut down"))
                    self._inbox.clear()
                    return
                job = self._next()
            if job.cancelled.is_set():
                continue
            dirty = True
            try:
                job.deliver(self._execute(job))
            except _Cancelled:
                pass
            except OpenjevError as exc:
                job.deliver(exc)
            except Exception as exc:  # our fault or llama.cpp's: the request gets a 502, the engine lives on
                log.exception("llama.cpp engine failure")
                job.deliver(EngineError("the engine failed", detail=f"{type(exc).__name__}: {exc}"))

    def _next(self) -> _Job:
        """The inbox's next job (the caller holds the lock): the keys' fair order, arrival
        order where one key waits (engines/fair_share.py)."""
        i = self._turns.choose([j.want for j in self._inbox])
        job = self._inbox[i]
        del self._inbox[i]
        return job

    def _execute(self, job: _Job) -> PlanResult:
        """One request in an empty context: its cached root positions restored into the root
        sequence, the rest of its trie computed, the root saved for later requests; every
        cell cleared before the next (the context never holds more than one request)."""
        plan = job.plan
        t_start = time.perf_counter()
        root_tokens = plan.root.tokens
        try:
            m = self._restore(plan)
            n_leaves = min(len(leaves(plan.root)), self.backend.n_seq_max - 1)
            lay = layout(
                plan,
                cached=m,
                root_seq=ROOT_SEQ,
                cache_seq=ROOT_SEQ if m else None,
                free_seqs=list(range(ROOT_SEQ + 1, ROOT_SEQ + 1 + n_leaves)),
            )
            results = self._compute(job, lay)
            if root_tokens and self.cache.max_bytes > 0 and not self.cache.covers(root_tokens, plan.cache_namespace):
                # the root sequence's cells alone (a leaf's own cells are not in it)
                self.cache.insert(root_tokens, self.backend.seq_save(ROOT_SEQ), plan.cache_namespace)
        finally:
            self.backend.clear()
        now = time.perf_counter()
        return PlanResult(
            branches=tuple(BranchResult(lp) for lp in results),
            computed_tokens=lay.computed,
            cached_tokens=m,
            timings_ms={"queue": (t_start - job.t_submit) * 1000, "prefill": (now - t_start) * 1000},
        )

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
            log.warning("llama.cpp refused a cached state of %d bytes: computing the prefix again", len(state))
            self.backend.clear()
            return 0
        self.backend.seq_rm(ROOT_SEQ, m)  # the entry may hold more than this request shares
        return m

    def _compute(self, job: _Job, lay: Layout) -> list[tuple[float, ...]]:
        b = self.backend
        labels = [branch.label_ids for branch in job.plan.branches]
        results: list[tuple[float, ...] | None] = [None] * len(labels)
        for gi, group in enumerate(lay.groups):
            if gi:
                for seq in lay.groups[gi - 1].leaf_seqs:
                    b.seq_rm(seq)
            if group.copy_from is not None:
                for seq in group.copy_into:
                    b.seq_cp(group.copy_from, seq, 0, group.copy_len)
            for at in range(0, len(group.items), b.n_batch):
                if job.cancelled.is_set():
                    raise _Cancelled
                chunk = group.items[at : at + b.n_batch]
                reads = [r for it in chunk for r in it.reads]
                for branch, lp in zip(reads, b.decode(chunk, [labels[r] for r in reads]), strict=True):
                    results[branch] = lp
                self.decodes += 1
                self.computed_tokens += len(chunk)
        if any(r is None for r in results):
            raise EngineError("the engine failed: a branch was never read")
        return [r for r in results if r is not None]
