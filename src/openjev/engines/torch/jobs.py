"""A request's plan on its way through the in-process scheduler (scheduler.py): its
state, its packed tokens and the KV computed so far, its reads, and the one outcome it
delivers."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, PlanResult
from openjev.engines.torch.kv import KVChain
from openjev.engines.torch.packing import PackedPlan
from openjev.errors import EngineError


class JobState(enum.Enum):
    QUEUED = "queued"  # submitted, not yet packed (in the inbox)
    RUNNING = "running"  # packed and admitted: slices computed round by round
    DONE = "done"  # every branch read; the result was delivered
    FAILED = "failed"  # an error was delivered (engine failure, shutdown)
    CANCELLED = "cancelled"  # the awaiting request went away; nothing is delivered


@dataclass
class Job:
    """One request's plan on its way through the scheduler.

    States move QUEUED -> RUNNING -> DONE | FAILED, or to CANCELLED from either of the first
    two (set by the request's thread through `cancel`, seen by the worker at the next round).
    Exactly one outcome is delivered for a job that ends DONE or FAILED, none for CANCELLED.
    """

    plan: Plan
    deliver: Callable[[PlanResult | BaseException], None]
    state: JobState = JobState.QUEUED
    cancelled: threading.Event = field(default_factory=threading.Event)
    packed: PackedPlan | None = None  # set on admission (RUNNING)
    chain: KVChain = field(default_factory=KVChain)  # KV of packed tokens [0, cursor)
    cursor: int = 0
    next_read: int = 0
    results: list[BranchResult | None] = field(default_factory=list)
    cached: int = 0
    computed: int = 0
    t_submit: float = field(default_factory=time.perf_counter)
    t_start: float | None = None
    t_root: float | None = None

    @property
    def packing(self) -> PackedPlan:
        """The packed plan of an admitted job."""
        if self.packed is None:
            raise EngineError(f"the engine failed: a {self.state.value} job has no packed plan")
        return self.packed

    @property
    def remaining(self) -> int:
        return len(self.packing.tokens) - self.cursor

    @property
    def all_read(self) -> bool:
        return self.next_read == len(self.packing.reads)

    @property
    def active(self) -> bool:
        """Still wants rounds: admitted, not finished, failed or cancelled."""
        if self.state is JobState.RUNNING and self.cancelled.is_set():
            self.state = JobState.CANCELLED
        return self.state is JobState.RUNNING

    def cancel(self) -> None:
        self.cancelled.set()  # an Event: set from the request's thread, read by the worker

    def fail(self, error: BaseException) -> None:
        if self.state in (JobState.QUEUED, JobState.RUNNING):
            self.state = JobState.FAILED
            self.deliver(error)

    def succeed(self, result: PlanResult) -> None:
        if self.state is JobState.RUNNING:
            self.state = JobState.DONE
            self.deliver(result)

    def finish(self) -> None:
        """Deliver the result once every branch was read (a branch never read fails the job)."""
        now = time.perf_counter()
        start = self.t_start or now
        root = self.t_root or start
        branches = tuple(r for r in self.results if r is not None)
        if len(branches) != len(self.results):
            self.fail(EngineError("the engine failed: a branch was never read"))
            return
        self.succeed(
            PlanResult(
                branches=branches,
                computed_tokens=self.computed,
                cached_tokens=self.cached,
                timings_ms={
                    "queue": (start - self.t_submit) * 1000,
                    "prefill": (root - start) * 1000,
                    "branches": (now - root) * 1000,
                },
            )
        )
