"""Admission of a decision's work, for its caller: how much work gets in (who gets in at
all, and the key's requests and reservation, are decided at the door: api/identity/door.py).

- `EngineAdmission`, the core's `Admission` port, given the caller by the service: each
  key's share of the evaluation slots (`slot`, `KeyShare`), then every plan the decision
  will run, the request's and its content-free twin's, admitted as one (`admit`,
  `GatedEngine.admit`): priced against the engine's deadline, a server-wide bound on
  distinct tokens in flight (529 beyond, Retry-After from the measured drain rate) and the
  caller's tokens/min bucket (429 beyond) (a refused request's work is charged by
  api/identity/caller.py `charge_refused`).
- `GatedEngine`, the engine the service runs the admitted plans on: it measures them (the
  drain rate, the engine's calls and failures).

Admission sees the plans after the compile and the per-request budgets and before any
engine work. Fairness between the admitted requests stays inside the engine (the
in-process scheduler serves them slice by slice, round-robin).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence

from openjev.api.identity.caller import account_of, entry_of
from openjev.api.identity.fair_queue import FairQueue
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.operations.metrics import Metrics
from openjev.core.caller import Caller
from openjev.core.plan import Plan
from openjev.core.ports import Admission, Engine, PlanResult
from openjev.core.types import Share
from openjev.errors import OpenjevError, Overloaded, RateLimited, TokensExceeded

MAX_RETRY_AFTER_S = 60


class DrainRate:
    """Distinct tokens the engine serves per second of *busy* time (at least one request in
    flight), measured over the last `window_s` of served requests.

    It keeps its memory: once anything was measured, the rate stays known across idle time
    (the window empties, the last measurement stands) and across failures (a request that
    failed, timed out or was cancelled served no tokens, so it is no measurement of the
    engine's speed: its busy time is not counted either). Forgetting it turned an overload
    after a quiet minute into a wall of 504s, admitted with no rate to refuse them by.
    None only until a first request was served.
    """

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window_s
        self._clock = clock
        self._done: collections.deque[tuple[float, int, float]] = collections.deque()  # (t, tokens, busy s)
        # their sums, kept as entries come and go: per_second runs twice per request, and
        # summing a busy minute's entries (thousands) each time was a visible share of it
        self._tokens = 0
        self._busy = 0.0
        self._active = 0
        self._mark: float | None = None  # start of the busy time not yet attributed
        self._last: float | None = None  # the latest measurement, kept when the window empties

    def started(self) -> None:
        if self._active == 0:
            self._mark = self._clock()
        self._active += 1

    def finished(self, tokens: int) -> None:
        """One request left the engine, having served `tokens` (0 if it failed or was cancelled)."""
        now = self._clock()
        busy = now - self._mark if self._mark is not None else 0.0
        self._mark = now
        self._active -= 1
        if self._active == 0:
            self._mark = None
        if tokens > 0:  # a failure measured nothing; its share of the busy time is dropped
            self._done.append((now, tokens, busy))
            self._tokens += tokens
            self._busy += busy
            self.per_second()  # remembered now, whenever it is next asked

    def per_second(self) -> float | None:
        now = self._clock()
        while self._done and self._done[0][0] < now - self._window:
            _, tokens, busy = self._done.popleft()
            self._tokens -= tokens
            self._busy -= busy
        if not self._done:
            self._busy = 0.0  # no rounding left over from the entries gone
        if self._tokens and self._busy > 0:
            self._last = self._tokens / self._busy
        return self._last


class KeyShare:
    """At most `share` evaluations in flight per API key: a key's decisions beyond it wait
    (up to `max_wait_s`, then 429 with Retry-After) for the key's own earlier ones, before
    they take a server slot, so one key flooding (two batches at once, or many single
    requests) leaves the other slots to the other keys. No bound without keys (one tenant)."""

    def __init__(self, share: int, max_wait_s: float, retry_after_s: int) -> None:
        self.share = share
        self.max_wait_s = max_wait_s
        self.retry_after_s = retry_after_s
        self._slots: dict[str, asyncio.Semaphore] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, caller: Caller) -> AsyncIterator[None]:
        entry = entry_of(caller)
        if entry is None or self.share <= 0:
            yield
            return
        slots = self._slots.setdefault(entry.name, asyncio.Semaphore(self.share))
        try:
            await asyncio.wait_for(slots.acquire(), self.max_wait_s)
        except TimeoutError:
            raise RateLimited(
                f"API key {entry.name!r} has {self.share} evaluations in flight, its share of the server; retry after "
                "Retry-After",
                retry_after_s=self.retry_after_s,
            ) from None
        try:
            yield
        finally:
            slots.release()


class GatedEngine(Engine):
    """The Engine port, gated. `in_flight_tokens` counts admitted plans' distinct tokens."""

    def __init__(
        self,
        inner: Engine,
        *,
        max_tokens_in_flight: int,
        max_wait_s: float,
        key_limits: KeyLimits,
        metrics: Metrics,
        retry_after_s: int,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.deadline_s = deadline_s
        self.parallel_layouts = inner.parallel_layouts  # a capability passes the gate
        self.max_tokens = max_tokens_in_flight
        self.max_wait_s = max_wait_s
        self.in_flight_tokens = 0
        self.queue = FairQueue()  # the same tokens by key, for the wait a new request faces
        self.rate = DrainRate(clock=clock)
        self._keys = key_limits
        self._metrics = metrics
        self._retry_after_s = retry_after_s

    def retry_after(self, excess_tokens: int) -> int:
        """Seconds until `excess_tokens` have drained at the measured rate (the configured
        --retry-after-s before anything was measured)."""
        rate = self.rate.per_second()
        if not rate:
            return self._retry_after_s
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(excess_tokens / rate)))

    def refuse_past_deadline(self, plans: Sequence[Plan]) -> None:
        """TokensExceeded (422) where the plans together (a request and its content-free twin)
        could not finish before the engine's deadline at the cost the engine measured on its
        own forwards (`estimate_s`; None over HTTP, where per-request latency would refuse
        what a GPU serves in seconds): refused before any work rather than computed until a
        504. A 4xx, not a 529: the request is too large for this server by itself (retrying
        cannot help; smaller, it is served). Nothing is refused before a first measurement."""
        if not self.deadline_s:
            return
        estimates = [self.inner.estimate_s(plan) for plan in plans]
        seconds = None if any(e is None for e in estimates) else sum(e for e in estimates if e is not None)
        if seconds is not None and seconds > self.deadline_s:
            tokens = sum(plan.unique_tokens for plan in plans)
            raise TokensExceeded(
                f"the request's {tokens} distinct tokens would take about {seconds:.0f} s of engine "
                f"work on this server by themselves, past its {self.deadline_s:g} s deadline: refused before any "
                "work; send a shorter state, fewer questions or fewer rotations"
            )

    def refuse_past_queue(self, share: Share, n: int) -> None:
        """Overloaded (529) where `n` more distinct tokens would pass the bound on tokens in
        flight, or could not be reached within max_wait_s at the measured rate. The engines
        serve keys in their fair order, so what is ahead of them is `share`'s own work and, of
        every other key's, as much as that key's share while this one runs
        (api/identity/fair_queue.py). Alone, any request within --max-request-tokens is
        admitted: a bound below one request's size must not refuse it forever."""
        if self.max_tokens and self.in_flight_tokens and self.in_flight_tokens + n > self.max_tokens:
            excess = self.in_flight_tokens + n - self.max_tokens
            raise Overloaded(  # other keys' load is not this caller's to see: numbers to the log
                "too many tokens in flight; retry after Retry-After",
                retry_after_s=self.retry_after(excess),
                detail=f"{self.in_flight_tokens} tokens in flight, this request needs {n} (limit {self.max_tokens})",
            )
        # What is admitted must finish before its deadline: refuse (529, retryable) what the
        # engine, at its measured rate, could not reach within max_wait_s, rather than
        # admit it into a queue that ends in a 504.
        rate = self.rate.per_second()
        ahead = self.queue.ahead(share, n)
        if rate and self.max_wait_s and self.in_flight_tokens and ahead / rate > self.max_wait_s:
            raise Overloaded(
                "the queue is too long to serve this in time; retry after Retry-After",
                retry_after_s=self.retry_after(ahead - int(rate * self.max_wait_s)),
                detail=f"{ahead - n} tokens in flight ahead of it would take {(ahead - n) / rate:.0f} s",
            )

    @contextlib.asynccontextmanager
    async def admit(self, caller: Caller, plans: Sequence[Plan]) -> AsyncIterator[None]:
        """`plans`, every plan of one decision, admitted as one for `caller`: priced together
        (the deadline, the queue), their distinct tokens taken from the caller's bucket in
        one step (the door's reservation handed back in it), and held in flight until exit."""
        n = sum(plan.unique_tokens for plan in plans)
        self.refuse_past_deadline(plans)
        self.refuse_past_queue(caller.share, n)
        account = account_of(caller)
        self.in_flight_tokens += n  # held while the key's bucket is asked, so no one else passes on it
        self.queue.add(caller.share, n)
        try:
            if account is not None:  # after the server-wide check: a 529 costs the key nothing
                await self._keys.take_tokens(account.entry, n, refund=account.claim())
            yield
        finally:
            self.in_flight_tokens -= n
            self.queue.add(caller.share, -n)

    async def run(self, plan: Plan) -> PlanResult:
        """`plan` on the engine (admitted already: `admit`), measured."""
        self.rate.started()
        self._metrics.engine_calls.inc()
        served = 0
        try:
            result = await self.inner.run(plan)
            served = plan.unique_tokens
        except OpenjevError as e:
            self._metrics.engine_failures.labels(e.error_type).inc()
            raise
        except asyncio.CancelledError:  # deadline or client gone: not the engine's failure
            raise
        except Exception:
            self._metrics.engine_failures.labels("unknown").inc()
            raise
        finally:
            self.rate.finished(served)
        return result

    async def close(self) -> None:
        await self.inner.close()

    def estimate_s(self, plan: Plan) -> float | None:
        return self.inner.estimate_s(plan)

    def stats(self) -> dict[str, float]:
        out = dict(self.inner.stats())
        out["tokens_in_flight"] = self.in_flight_tokens
        out["tokens_in_flight_limit"] = self.max_tokens
        out["drain_rate_tokens_per_second"] = self.rate.per_second() or 0.0
        return out


class EngineAdmission(Admission):
    """The edge's admission as the core's `Admission` port: `gate` wraps the engine in the
    `GatedEngine` that `make_gate` builds (kept as `gated`, for /metrics); `slot` is the
    caller's share of the evaluation slots (`share`); `admit` admits a decision's plans for
    the caller as one (`GatedEngine.admit`)."""

    def __init__(self, make_gate: Callable[[Engine], GatedEngine], share: KeyShare) -> None:
        self._make_gate = make_gate
        self.share = share
        self.gated: GatedEngine | None = None

    def gate(self, engine: Engine) -> GatedEngine:
        self.gated = self._make_gate(engine)
        return self.gated

    def slot(self, caller: Caller) -> contextlib.AbstractAsyncContextManager[None]:
        return self.share(caller)

    def admit(self, caller: Caller, plans: Sequence[Plan]) -> contextlib.AbstractAsyncContextManager[None]:
        if self.gated is None:
            raise RuntimeError("admit before gate: the service gates its engine when it is built")
        return self.gated.admit(caller, plans)
