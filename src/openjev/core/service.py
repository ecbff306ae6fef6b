"""DecisionService: one decision request from core types to core answers.

Order of work, so that nothing invalid or over budget reaches the engine:
admission (in-flight cap) -> compile (off the event loop) -> token budgets -> engine run
under a deadline -> readout (branch log-probs -> option probabilities) -> calibration ->
answers.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from openjev.core import calibration as calib
from openjev.core import scoring
from openjev.core.abstain import AbstainRule
from openjev.core.ports import Engine, PlanResult
from openjev.core.prompts import CompiledRequest, PromptCompiler
from openjev.core.readouts import Combined, LettersReadout, Readout, ReadoutSpec, YesNoReadout
from openjev.core.types import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    DecisionRequest,
    DecisionResult,
    NoulAnswer,
    NoulQuestion,
    Question,
    ScoreAnswer,
    Usage,
)
from openjev.core.wording import option_texts
from openjev.errors import EngineError, EngineTimeout, Overloaded, TokensExceeded, Unsupported

# Requests with at most this much text compile on the event loop (a few hundred microseconds
# of tokenizing); larger ones in a thread, so the loop keeps serving (bench/bench_api.py).
INLINE_COMPILE_CHARS = 4096


def _text_chars(request: DecisionRequest) -> int:
    return sum(len(t.content) for t in request.state.turns) + sum(len(repr(q)) for _, q in request.questions)


@dataclass(frozen=True)
class ServiceLimits:
    max_branch_tokens: int
    max_request_tokens: int
    max_in_flight: int
    engine_timeout_s: float
    retry_after_s: int
    temperature: float = 1.0
    rotation_max_options: int = 26


def question_type(question: Question) -> str:
    return (
        "noul" if isinstance(question, NoulQuestion) else "choice" if isinstance(question, ChoiceQuestion) else "score"
    )


class DecisionService:
    """`readout` is the default readout; `calibration` (bound to this model and prompt by
    the caller) is applied to each question whose readout and type it has a fit for;
    `abstain` marks the answers it declines (`abstain=True`; default: declines none)."""

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
    ) -> None:
        self._compiler = compiler
        self._engine = engine
        self._limits = limits
        self._clock = clock
        self._in_flight = 0
        self.default_readout = readout = readout if readout is not None else ReadoutSpec()
        self.calibration = calibration
        self.abstain = abstain if abstain is not None else AbstainRule()
        self._readouts: dict[ReadoutSpec, Readout] = {}
        self.readout(readout)  # an unavailable default readout fails at startup, not per request

    def readout(self, spec: ReadoutSpec) -> Readout:
        """The readout object for `spec`; raises Unsupported where this model cannot be read so."""
        found = self._readouts.get(spec)
        if found is None:
            t = self._limits.temperature
            if spec.name == "yesno":
                if self._compiler.yes_no is None:
                    raise Unsupported(
                        "the yesno readout is unavailable for this model: 'Yes'/'No' are not "
                        "single tokens after its answer cue"
                    )
                found = YesNoReadout(*self._compiler.yes_no, temperature=t)
            else:
                labels = self._compiler.labels
                found = LettersReadout(
                    labels.texts,
                    labels.ids,
                    rotations=spec.rotations,
                    temperature=t,
                    max_rotated_options=self._limits.rotation_max_options,
                )
            self._readouts[spec] = found
        return found

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def prepare(self, request: DecisionRequest, readout: ReadoutSpec | None = None) -> CompiledRequest:
        """Compile under `readout` (default: the service's) and check the token budgets
        (TokensExceeded); no admission, no engine work. A batch prepares every item first,
        to check its own token total before any item runs."""
        ro = self.readout(readout or self.default_readout)
        if _text_chars(request) <= INLINE_COMPILE_CHARS:
            compiled = self._compiler.compile(request, ro)  # well under a millisecond: cheaper than a thread hop
        else:
            compiled = await asyncio.to_thread(self._compiler.compile, request, ro)
        self._check_budgets(request, compiled)
        return compiled

    async def decide(
        self,
        request: DecisionRequest,
        compiled: CompiledRequest | None = None,
        *,
        readout: ReadoutSpec | None = None,
        calibrate: bool = True,
    ) -> DecisionResult:
        """Answer every question, in request order, with `readout` (default: the service's)
        and, unless `calibrate` is false, the calibration where it has a fit. `compiled`:
        what prepare() returned for this request under the same readout, so it is not
        compiled twice.

        Raises Overloaded (cap reached), Unsupported (a readout this model cannot do),
        TokensExceeded (budget; the engine is not called), EngineTimeout (deadline), or
        what the engine raises.
        """
        if self._in_flight >= self._limits.max_in_flight:
            raise Overloaded(  # how busy others keep the server is theirs to know: numbers to the log
                "the server is full; retry after Retry-After",
                retry_after_s=self._limits.retry_after_s,
                detail=f"{self._in_flight} evaluations in flight (limit {self._limits.max_in_flight})",
            )
        self._in_flight += 1
        try:
            return await self._decide(request, compiled, readout or self.default_readout, calibrate)
        finally:
            self._in_flight -= 1

    async def _decide(
        self, request: DecisionRequest, compiled: CompiledRequest | None, spec: ReadoutSpec, calibrate: bool
    ) -> DecisionResult:
        t0 = self._clock()
        readout = self.readout(spec)
        if compiled is None:
            compiled = await self.prepare(request, spec)
        t1 = self._clock()
        try:
            result = await asyncio.wait_for(self._engine.run(compiled.plan), self._limits.engine_timeout_s)
        except TimeoutError:
            raise EngineTimeout(f"the engine did not answer within {self._limits.engine_timeout_s:g} s") from None
        t2 = self._clock()
        if len(result.branches) != len(compiled.plan.branches):
            raise EngineError(
                f"engine returned {len(result.branches)} results for {len(compiled.plan.branches)} branches"
            )
        cal = self.calibration if calibrate and self.calibration is not None and self.calibration.covers(spec) else None
        answers = []
        for (qid, question), (start, count) in zip(request.questions, compiled.spans, strict=True):
            branches = compiled.plan.branches[start : start + count]
            logprobs = [r.logprobs for r in result.branches[start : start + count]]
            for branch, lp in zip(branches, logprobs, strict=True):
                if len(lp) != len(branch.label_ids):
                    raise EngineError(f"engine returned {len(lp)} label log-probs, expected {len(branch.label_ids)}")
            try:
                combined = readout.combine(question, logprobs)
            except ValueError as e:
                raise EngineError("unusable label log-probs from the engine", detail=str(e)) from None
            fit = cal.fit_for(spec, question_type(question)) if cal is not None else None
            answers.append((qid, self._answer(question, combined, fit, self.abstain)))
        timings = {"prepare": (t1 - t0) * 1000, **result.timings_ms, "engine": (t2 - t1) * 1000}
        return DecisionResult(
            answers=tuple(answers),
            usage=self._usage(compiled, result),
            prefix_tokens=compiled.plan.shared_prefix_len,
            timings_ms=timings,
            readout=used_readout(spec, compiled).describe(),
            calibration=cal.id if cal is not None else None,
        )

    def _check_budgets(self, request: DecisionRequest, compiled: CompiledRequest) -> None:
        plan = compiled.plan
        for (qid, _), (start, count) in zip(request.questions, compiled.spans, strict=True):
            branch = max(plan.branches[start : start + count], key=lambda b: len(b.input_ids))
            if len(branch.input_ids) > self._limits.max_branch_tokens:
                raise TokensExceeded(
                    f"question {qid!r}: the state and this question take {len(branch.input_ids)} tokens "
                    f"(limit {self._limits.max_branch_tokens} per branch)"
                )
        if plan.unique_tokens > self._limits.max_request_tokens:
            raise TokensExceeded(
                f"the request takes {plan.unique_tokens} distinct tokens "
                f"(limit {self._limits.max_request_tokens} per request)"
            )

    @staticmethod
    def _usage(compiled: CompiledRequest, result: PlanResult) -> Usage:
        return Usage(
            input_tokens=compiled.plan.unique_tokens,
            prompt_tokens=compiled.plan.prompt_tokens,
            computed_tokens=result.computed_tokens,
            cached_tokens=result.cached_tokens,
        )

    @staticmethod
    def _answer(question: Question, combined: Combined, fit: calib.TypeFit | None, rule: AbstainRule) -> Answer:
        probs = combined.probs if fit is None else calib.apply(fit, combined.probs)
        if not all(math.isfinite(p) for p in probs):
            raise EngineError("the engine's log-probabilities gave non-finite probabilities")
        mass, agreement = combined.label_mass, combined.order_agreement
        abstain = rule.refuses(mass, agreement)
        if isinstance(question, NoulQuestion):
            return NoulAnswer(p_true=probs[0], label_mass=mass, order_agreement=agreement, abstain=abstain)
        if isinstance(question, ChoiceQuestion):
            names = [o.name for o in question.options]
            return ChoiceAnswer(
                choice=names[scoring.argmax(probs)],
                probabilities=tuple(zip(names, probs, strict=True)),
                confidence=scoring.choice_confidence(probs),
                label_mass=mass,
                order_agreement=agreement,
                abstain=abstain,
            )
        return ScoreAnswer(
            score=scoring.expectation(probs),
            confidence=scoring.score_confidence(probs),
            probabilities=tuple(probs),
            legend=tuple(option_texts(question)),
            label_mass=mass,
            order_agreement=agreement,
            abstain=abstain,
        )


def used_readout(spec: ReadoutSpec, compiled: CompiledRequest) -> ReadoutSpec:
    """`spec` with the rotations this request was really read in: the most orderings any of
    its questions got (a question reads min(rotations, options) orders, a scale at most 2,
    one past --rotation-max-options). Under letters each ordering is one branch of the
    question's span. What calibration applies still follows `spec`, the configuration."""
    if spec.name != "letters" or not compiled.spans:
        return spec
    return ReadoutSpec(spec.name, max(count for _, count in compiled.spans))
