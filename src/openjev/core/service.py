"""DecisionService: one decision request from core types to core answers.

Order of work, so that nothing invalid or over budget reaches the engine, all of it for
the caller it is given (core/caller.py; never ambient):
the caller's slot (its share, then the in-flight cap) -> prepare: compile (off the event
loop) and token budgets, for the request and its content-free twin (the questions whose fit
divides one out and whose reading is not cached: core/content_free.py) -> admit: every plan
it will run, admitted for the caller as one (priced, charged) -> run them under one
deadline -> readout (branch log-probs -> option probabilities) -> calibration -> answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from openjev.core import calibration as calib
from openjev.core.abstain import AbstainRule
from openjev.core.answers import answer_of
from openjev.core.caller import ANONYMOUS, Caller
from openjev.core.combine import combine_all
from openjev.core.compile_size import compiles_inline
from openjev.core.content_free import ContentFreeReadings
from openjev.core.distinct import refuse_ties
from openjev.core.ports import Admission, AdmitAll, Engine, PlanResult
from openjev.core.prompts import CompiledRequest, PromptCompiler
from openjev.core.readouts import Readout, ReadoutContext, ReadoutSpec, question_type
from openjev.core.readouts.catalog import PARALLEL_FALLBACK, ReadoutCatalog
from openjev.core.service_limits import ServiceLimits
from openjev.core.task_apply import TaskCalibration
from openjev.core.types import (
    DecisionRequest,
    DecisionResult,
    FitBasis,
    Usage,
)
from openjev.errors import EngineTimeout, Overloaded, TokensExceeded


class DecisionService:
    """`readout` is the default readout; `calibration` (bound to this model and prompt by
    the caller) is applied to each question whose readout and type it has a fit for;
    `abstain` marks the answers it declines (`abstain=True`; default: declines none).

    `parallel_layouts`: whether the engine runs parallel layouts (core/plan.py); where it
    does not, the parallel readout is read as `parallel_fallback`, and results say so."""

    def __init__(
        self,
        compiler: PromptCompiler,
        engine: Engine,
        limits: ServiceLimits,
        clock: Callable[[], float] = time.perf_counter,
        *,
        readout: ReadoutSpec | None = None,
        calibration: calib.Calibration | None = None,
        abstain: AbstainRule | None = None,
        parallel_layouts: bool = False,
        parallel_fallback: ReadoutSpec = PARALLEL_FALLBACK,
        admission: Admission | None = None,
    ) -> None:
        self._compiler = compiler
        # The engine is run through the admission's gate (measured); every decision enters
        # the caller's `slot`, then has its plans admitted as one (core/ports.py `Admission`).
        self._admission = admission if admission is not None else AdmitAll()
        self._engine = self._admission.gate(engine)
        self._limits = limits
        self._clock = clock
        self._in_flight = 0
        labels = compiler.labels
        context = ReadoutContext(
            labels.texts, labels.ids, compiler.yes_no, limits.temperature, limits.rotation_max_options
        )
        self.readouts = ReadoutCatalog(context, parallel_layouts=parallel_layouts, parallel_fallback=parallel_fallback)
        self.default_readout = readout = self.resolve(readout if readout is not None else ReadoutSpec())
        self.calibration = calibration
        self.abstain = abstain if abstain is not None else AbstainRule()
        self.content_free = ContentFreeReadings()  # per question, where a fit divides one out
        self.readout(readout)  # an unavailable default readout fails at startup, not per request

    def resolve(self, spec: ReadoutSpec) -> ReadoutSpec:
        """The readout this engine reads for `spec` (ReadoutCatalog.resolve)."""
        return self.readouts.resolve(spec)

    def readouts_offered(self, rotations: int) -> dict[str, str]:
        """Per readout name this model can be read with: what is read for it (described)."""
        return self.readouts.offered(rotations)

    def readout(self, spec: ReadoutSpec) -> Readout:
        """The readout object for `spec` (as resolved); Unsupported where this model cannot be read so."""
        return self.readouts.readout(spec)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def prepare(self, request: DecisionRequest, readout: ReadoutSpec | None = None) -> CompiledRequest:
        """Compile under `readout` (default: the service's) and check the token budgets
        (TokensExceeded); no admission, no engine work. A batch prepares every item first,
        to check its own token total before any item runs."""
        ro = self.readout(readout or self.default_readout)  # resolved: parallel may fall back
        if compiles_inline(request, ro):
            return self.prepare_now(request, ro)  # well under a millisecond: cheaper than a thread hop
        return await asyncio.to_thread(self.prepare_now, request, ro)

    def prepare_now(
        self, request: DecisionRequest, readout: Readout, part_cache: dict[str, tuple[int, ...]] | None = None
    ) -> CompiledRequest:
        """prepare() in the calling thread: compile under the limits, check the budgets.
        `part_cache`: see PromptCompiler.compile (a batch's items asking the same questions)."""
        refuse_ties(request)  # before any work: the same rule on every route
        compiled = self._compiler.compile(request, readout, self._limits.compile_limits(), part_cache)
        self._check_budgets(request, compiled)
        return compiled

    async def decide(
        self,
        request: DecisionRequest,
        compiled: CompiledRequest | None = None,
        *,
        caller: Caller = ANONYMOUS,
        readout: ReadoutSpec | None = None,
        calibrate: bool = True,
        tasks: Mapping[str, TaskCalibration] | None = None,
    ) -> DecisionResult:
        """Answer every question, in request order, for `caller` (whose slot, admission and
        charge it is), with `readout` (default: the service's)
        and, unless `calibrate` is false, the calibration where it has a fit; `tasks`: by
        question id, a task's fit and abstain rule in their place (api/server/task_binding.py
        checked them against this readout and model; applied even where `calibrate` is
        false, since the caller named them). `compiled`:
        what prepare() returned for this request under the same readout, so it is not
        compiled twice.

        Raises Overloaded (cap reached), Unsupported (a readout this model cannot do),
        TokensExceeded (budget; the engine is not called), EngineTimeout (deadline), or
        what the engine and the admission raise.
        """
        async with self._admission.slot(caller):
            if self._in_flight >= self._limits.max_in_flight:
                raise Overloaded(  # how busy others keep the server is theirs to know: numbers to the log
                    "the server is full; retry after Retry-After",
                    retry_after_s=self._limits.retry_after_s,
                    detail=f"{self._in_flight} evaluations in flight (limit {self._limits.max_in_flight})",
                )
            self._in_flight += 1
            try:
                spec = self.resolve(readout or self.default_readout)
                return await self._decide(request, compiled, spec, calibrate, tasks or {}, caller)
            finally:
                self._in_flight -= 1

    async def _decide(
        self,
        request: DecisionRequest,
        compiled: CompiledRequest | None,
        spec: ReadoutSpec,
        calibrate: bool,
        tasks: Mapping[str, TaskCalibration],
        caller: Caller,
    ) -> DecisionResult:
        t0 = self._clock()
        readout = self.readout(spec)
        if compiled is None:
            compiled = await self.prepare(request, spec)
        cal = self.calibration if calibrate and self.calibration is not None and self.calibration.covers(spec) else None
        fits = {
            qid: cal.fit_for(spec.for_type(question_type(q)), question_type(q)) if cal is not None else None
            for qid, q in request.questions
        }
        wanted = [(qid, q) for qid, q in request.questions if qid not in tasks and (f := fits[qid]) and f.content_free]
        twin = self.content_free.missing(request, spec, wanted)
        twin_compiled = await self.prepare(twin, spec) if twin is not None else None
        t1 = self._clock()
        result, twin_result = await self._run(caller, compiled, twin_compiled)
        t2 = self._clock()
        if twin is not None and twin_compiled is not None and twin_result is not None:
            self.content_free.store(
                request, spec, twin.questions, combine_all(readout, twin, twin_compiled, twin_result)
            )
        free = self.content_free.answers(request, spec, wanted)
        answers, applied = [], []
        combined_all = combine_all(readout, request, compiled, result)
        for (qid, question), combined in zip(request.questions, combined_all, strict=True):
            fit, task = fits[qid], tasks.get(qid)
            applied.append(task.basis if task is not None else basis_of(cal if fit is not None else None))
            rule = task.abstain if task is not None else self.abstain
            got = answer_of(question, combined, task.fit if task is not None else fit, rule, free.get(qid))
            answers.append((qid, got))
        timings = {"prepare": (t1 - t0) * 1000, **result.timings_ms, "engine": (t2 - t1) * 1000}
        return DecisionResult(
            answers=tuple(answers),
            usage=self._usage(compiled, result, twin_compiled, twin_result),
            prefix_tokens=compiled.plan.shared_prefix_len,
            timings_ms=timings,
            readout=used_readout(spec, compiled).describe(),
            calibration=",".join(dict.fromkeys(a.name for a in applied if a.name))
            or (cal.id if cal is not None else None),
            readings=tuple(combined_all),
            fits=tuple(applied),
        )

    async def run_admitted(self, compiled: CompiledRequest, *, caller: Caller) -> PlanResult:
        """`compiled`'s plan alone, admitted for `caller` as a decision's plans are (priced,
        charged to its account where it has one) and run under the same deadline, outside
        any decision (no evaluation slot: a task's fit reading an example). Raises what the
        admission and the engine raise, EngineTimeout at the deadline."""
        result, _ = await self._run(caller, compiled, None)
        return result

    async def _run(
        self, caller: Caller, compiled: CompiledRequest, twin: CompiledRequest | None
    ) -> tuple[PlanResult, PlanResult | None]:
        """The request's plan, and its content-free twin's beside it, admitted for `caller`
        as one and run, under one deadline."""
        plans = [compiled.plan] + ([twin.plan] if twin is not None else [])
        try:
            async with asyncio.timeout(self._limits.engine_timeout_s):
                async with self._admission.admit(caller, plans):
                    return await self._run_both(compiled, twin)
        except TimeoutError:
            raise EngineTimeout(f"the engine did not answer within {self._limits.engine_timeout_s:g} s") from None

    async def _run_both(
        self, compiled: CompiledRequest, twin: CompiledRequest | None
    ) -> tuple[PlanResult, PlanResult | None]:
        if twin is None:
            return await self._engine.run(compiled.plan), None
        try:  # a task group: one failing cancels the other, and a cancelled request cancels both
            async with asyncio.TaskGroup() as group:
                main = group.create_task(self._engine.run(compiled.plan))
                free = group.create_task(self._engine.run(twin.plan))
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return main.result(), free.result()

    def _check_budgets(self, request: DecisionRequest, compiled: CompiledRequest) -> None:
        plan = compiled.plan
        for (qid, _), (start, count) in zip(request.questions, compiled.spans, strict=True):
            longest = max(len(b) for b in plan.branches[start : start + count])
            limits = self._limits.compile_limits()
            if longest > limits.max_branch_tokens:
                raise TokensExceeded(
                    f"question {qid!r}: the state and this question take {longest} tokens "
                    f"(limit {limits.max_branch_tokens} {limits.branch_limit})"
                )
        if plan.unique_tokens > self._limits.max_request_tokens:
            exc = TokensExceeded(
                f"the request takes {plan.unique_tokens} distinct tokens "
                f"(limit {self._limits.max_request_tokens} per request)"
            )
            exc.work_tokens = plan.unique_tokens
            raise exc

    @staticmethod
    def _usage(
        compiled: CompiledRequest, result: PlanResult, twin: CompiledRequest | None, twin_result: PlanResult | None
    ) -> Usage:
        """The request's tokens, and its content-free twin's where one was read (charged alike)."""
        parts = [(compiled, result)] + ([(twin, twin_result)] if twin is not None and twin_result is not None else [])
        return Usage(
            input_tokens=sum(c.plan.unique_tokens for c, _ in parts),
            prompt_tokens=sum(c.plan.prompt_tokens for c, _ in parts),
            computed_tokens=_total([r.computed_tokens for _, r in parts]),
            cached_tokens=_total([r.cached_tokens for _, r in parts]),
        )


def basis_of(cal: calib.Calibration | None) -> FitBasis:
    """The basis of an answer the global fit `cal` gave (None: the raw reading)."""
    return FitBasis("global", cal.id) if cal is not None else FitBasis("none")


def _total(counts: list[int | None]) -> int | None:
    """The sum, or None where an engine did not say (unknown stays unknown)."""
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def used_readout(spec: ReadoutSpec, compiled: CompiledRequest) -> ReadoutSpec:
    """`spec` with the rotations this request was really read in: the most orderings any of
    its questions got (a question reads min(rotations, options) orders, a scale at most 2,
    one past --rotation-max-options). Under letters each ordering is one branch of the
    question's span. What calibration applies still follows `spec`, the configuration."""
    if spec.name != "letters" or spec.per_type or not compiled.spans:
        return spec  # a per-type readout is described as configured
    return ReadoutSpec(spec.name, max(count for _, count in compiled.spans))
