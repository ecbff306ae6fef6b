"""The llama.cpp engine: GGUF files served as they are, in-process, on the core's Engine port.

A plan's trie is one llama.cpp batch (layout.py): every distinct token computed
once, in every branch's KV sequence below it, at its true position, with logits only where
a branch ends; the batch goes in decode calls sized in time (steps.py). The roots of
recent requests are saved outside the context as KV states (cache.py), bounded by bytes
and namespaced by Plan.cache_namespace; a later root that starts the same way restores the
shared positions and computes only the rest. The context holds one request's cells at a
time, so attention (which llama.cpp runs over every cell in use) sees only the request's.

All llama.cpp work runs on one worker thread (a 2-core CPU is saturated by one decode;
llama.cpp parallelises inside it), one decode call at a time. Before each call the keys'
fair order picks whose request goes on (turns.py): a request of another key that should go
first takes the context, the running one's cells saved aside whole (llama.cpp's state of
every sequence) and restored when its turn comes back, so a long prefill delays another
key's small request by about one step. Every call is timed into a cost model
(engines/cost_model.py, shared with the in-process engine), measured once at load
(`warm_up`), which prices plans before admission (`estimate_s`). A cancelled request (the
service's deadline, a client gone) stops at its next decode call; `close` stops every
request at its next one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time

from openjev.core.plan import Plan
from openjev.core.ports import Engine, PlanResult
from openjev.engines.cost_model import CostModel, attended
from openjev.engines.llamacpp.cache import StateCache
from openjev.engines.llamacpp.layout import Item
from openjev.engines.llamacpp.lib import Backend
from openjev.engines.llamacpp.steps import ROOT_SEQ, Cancelled, Executor, Job
from openjev.engines.llamacpp.turns import Turns
from openjev.engines.memory import release_free_memory
from openjev.engines.prefix_cache import cache_stats
from openjev.engines.worker_inbox import deliverer, post_and_wait
from openjev.errors import EngineError, OpenjevError, TokensExceeded

log = logging.getLogger(__name__)

# The warm-up decode at load: short (a 1.5B model computes about 60 tokens/s on 2 cores), from
# no context, so attention is a small share of it.
WARMUP_TOKENS = 64
PAGE_IN_TOKENS = 8  # the untimed first call's
WARMUP_FIRST_ID = 1000  # ordinary tokens, past the special ones most vocabularies open with
SLICE_S = 0.5  # the in-process settings' default --slice-ms


class LlamaCppEngine(Engine):
    """The Engine port over a llama.cpp context. It runs no parallel layouts (the service
    reads those questions another way): a layout's spans would repeat positions within one
    sequence, which llama.cpp's batch refuses."""

    parallel_layouts = False

    def __init__(self, backend: Backend, *, prefix_cache_bytes: int, slice_s: float = SLICE_S) -> None:
        self.backend = backend
        self.cache = StateCache(prefix_cache_bytes)
        self.executor = Executor(backend, self.cache, CostModel(hidden_size=backend.n_embd), slice_s)
        self._inbox: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._stopped = False
        self._turns = Turns()  # whose request goes on before each decode call
        self._saved: list[Job] = []  # started requests set aside, their context saved (worker thread only)
        self.switches = 0
        self._thread = threading.Thread(target=self._loop, name="openjev-llamacpp", daemon=True)
        self._thread.start()

    @property
    def cost(self) -> CostModel:
        return self.executor.cost

    @property
    def decodes(self) -> int:
        """Decode calls made (the warm-up's not counted)."""
        return self.executor.decodes

    @property
    def computed_tokens(self) -> int:
        return self.executor.computed_tokens

    # ---- any thread

    async def run(self, plan: Plan) -> PlanResult:
        self._check_fits(plan)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PlanResult] = loop.create_future()
        job = Job(plan, deliverer(loop, future))
        # a cancelled request: the worker stops at its next decode call
        return await post_and_wait(self._wake, self._inbox, lambda: self._stopped, job, future, job.cancelled.set)

    def estimate_s(self, plan: Plan) -> float | None:
        """Seconds `plan` would take alone, at the cost measured on this engine's decode calls
        (what its namespace's cache holds subtracted); None before anything was measured."""
        return self.cost.estimate_s(plan, self.executor.cached_for(plan))

    def warm_up(self, tokens: int = WARMUP_TOKENS) -> float:
        """One decode of `tokens` tokens from an empty context, timed into the cost model, so
        that the first request is priced (the load calls it before the worker has work);
        its seconds. A short untimed call goes first: llama.cpp's very first call pays for
        the weights' pages and its buffers, which no request pays again."""
        b = self.backend
        tokens = min(tokens, b.n_batch)
        items = [Item((WARMUP_FIRST_ID + i) % b.n_vocab, i, (ROOT_SEQ,)) for i in range(tokens)]
        items[-1] = Item(items[-1].token, items[-1].pos, items[-1].seqs, (0,))
        try:  # before any request is posted: the worker is idle
            # untimed: the first call reads the mapped weights from disk and sizes its buffers
            b.decode(items[:PAGE_IN_TOKENS], [])
            b.clear()
            t0 = time.perf_counter()
            b.decode(items, [(0,)])
            seconds = time.perf_counter() - t0
        finally:
            b.clear()
        self.cost.observe(tokens, attended(0, tokens), seconds)
        return seconds

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
        """Stops every request at its next decode call (each gets EngineError), then frees
        llama.cpp's model and context."""
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
            "engine_forwards": self.executor.decodes,
            **self.cost.stats(),
        }

    # ---- worker thread

    def _loop(self) -> None:
        current: Job | None = None
        dirty = False
        while True:
            if dirty and current is None and not self._saved and not self._inbox:
                # idle: what a request freed (its plan's lists, its states' buffers) stays
                # mapped by glibc until trimmed; a few ms here cost no one anything
                dirty = False
                release_free_memory()
            with self._wake:
                while current is None and not self._saved and not self._inbox and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    self._shut([*([current] if current else []), *self._saved, *self._inbox])
                    return
                self._drop_cancelled()
                if current is not None and current.cancelled.is_set():
                    current = None  # its caller left: its cells go, nothing is delivered
                    self.backend.clear()
                job = self._turns.next(current, self._saved, self._inbox, self.executor.step_tokens(0))
                if job is not None and job.steps is None:
                    self._inbox.remove(job)
            if job is None:
                continue
            dirty = True
            current = self._step(current, job)

    def _shut(self, jobs: list[Job]) -> None:
        for job in jobs:
            job.deliver(EngineError("the engine is shut down"))
        self._inbox.clear()
        self._saved.clear()
        self.backend.clear()

    def _drop_cancelled(self) -> None:
        """Waiting and set-aside requests whose caller left go (their saved context with them)."""
        for queue in (self._inbox, self._saved):
            for job in [j for j in queue if j.cancelled.is_set()]:
                queue.remove(job)

    def _set_aside(self, job: Job) -> None:
        """The running request's context saved whole (every sequence's cells), to go on later."""
        try:
            job.saved = self.backend.save_all()
        except Exception as exc:  # it cannot go on: it fails alone
            log.exception("llama.cpp could not save a context")
            job.deliver(EngineError("the engine failed; retry", detail=f"{type(exc).__name__}: {exc}"))
            return
        self._saved.append(job)
        self.switches += 1

    def _step(self, current: Job | None, job: Job) -> Job | None:
        """`job`'s next decode call, `current` set aside first if it is another; the job in
        the context after it (None once it finished or failed: the context is empty then)."""
        try:
            if job is not current:
                if current is not None:
                    self._set_aside(current)
                self.backend.clear()
                if job.saved is not None:
                    self._saved.remove(job)
                    saved, job.saved = job.saved, None
                    if not self.backend.restore_all(saved):
                        raise EngineError("the engine failed; retry", detail="llama.cpp refused a set-aside context")
            if job.steps is None:
                job.steps = self.executor.steps(job)
            next(job.steps)
            return job
        except StopIteration as done:
            outcome: PlanResult | BaseException | None = done.value
        except Cancelled:
            outcome = None
        except OpenjevError as exc:
            outcome = exc
        except Exception as exc:  # our fault or llama.cpp's: the request gets a 502, the engine lives on
            log.exception("llama.cpp engine failure")
            outcome = EngineError("the engine failed", detail=f"{type(exc).__name__}: {exc}")
        self.backend.clear()  # before the answer: the next request finds the context empty
        if outcome is not None:
            job.deliver(outcome)
        return None
