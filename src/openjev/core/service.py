"""DecisionService: one decision request from core types to core answers.

Order of work, so that nothing invalid or over budget reaches the engine:
admission (in-flight cap) -> compile (off the event loop) -> token budgets -> engine run
under a deadline -> scoring.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Callable

from openjev.core import scoring
from openjev.core.ports import Engine, PlanResult
from openjev.core.prompts import CompiledRequest, PromptCompiler, option_texts
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
from openjev.errors import EngineError, EngineTimeout, Overloaded, TokensExceeded


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


class DecisionService:
    def __init__(
        self,
        compiler: PromptCompiler,
        engine: Engine,
        limits: ServiceLimits,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._compiler = compiler
        self._engine = engine
        self._limits = limits
        self._clock = clock
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def decide(self, request: DecisionRequest) -> DecisionResult:
        """Answer every question, in request order.

        Raises Overloaded (cap reached), TokensExceeded (budget; the engine is not called),
        EngineTimeout (deadline), or what the engine raises.
        """
        if self._in_flight >= self._limits.max_in_flight:
            raise Overloaded(
                f"{self._in_flight} evaluations in flight (limit {self._limits.max_in_flight}); retry later",
                retry_after_s=self._limits.retry_after_s,
            )
        self._in_flight += 1
        try:
            return await self._decide(request)
        finally:
            self._in_flight -= 1

    async def _decide(self, request: DecisionRequest) -> DecisionResult:
        t0 = self._clock()
        if _text_chars(request) <= INLINE_COMPILE_CHARS:
            compiled = self._compiler.compile(request)  # well under a millisecond: cheaper than a thread hop
        else:
            compiled = await asyncio.to_thread(self._compiler.compile, request)
        self._check_budgets(request, compiled)
        t1 = self._clock()
        try:
            result = await asyncio.wait_for(self._engine.run(compiled.plan), self._limits.engine_timeout_s)
        except TimeoutError:
            raise EngineTimeout(f"the engine did not answer within {self._limits.engine_timeout_s:g} s") from None
        t2 = self._clock()
        if len(result.branches) != len(compiled.plan.branches):
            raise EngineError(f"engine returned {len(result.branches)} results for {len(compiled.plan.branches)} branches")
        answers = tuple(
            (qid, self._answer(question, branch.logprobs, n))
            for (qid, question), branch, n in zip(request.questions, result.branches, compiled.n_labels)
        )
        timings = {"prepare": (t1 - t0) * 1000, **result.timings_ms, "engine": (t2 - t1) * 1000}
        return DecisionResult(
            answers=answers,
            usage=self._usage(compiled, result),
            prefix_tokens=compiled.plan.shared_prefix_len,
            timings_ms=timings,
        )

    def _check_budgets(self, request: DecisionRequest, compiled: CompiledRequest) -> None:
        plan = compiled.plan
        for (qid, _), branch in zip(request.questions, plan.branches):
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

    def _answer(self, question: Question, logprobs: tuple[float, ...], n: int) -> Answer:
        if len(logprobs) != n:
            raise EngineError(f"engine returned {len(logprobs)} label log-probs, expected {n}")
        try:
            probs = scoring.softmax(logprobs, self._limits.temperature)
        except ValueError as e:
            raise EngineError(f"unusable label log-probs from the engine: {e}") from None
        mass = scoring.label_mass(logprobs)
        assert all(math.isfinite(p) for p in probs)
        if isinstance(question, NoulQuestion):
            return NoulAnswer(p_true=probs[0], label_mass=mass)
        if isinstance(question, ChoiceQuestion):
            names = [o.name for o in question.options]
            return ChoiceAnswer(
                choice=names[scoring.argmax(probs)],
                probabilities=tuple(zip(names, probs)),
                confidence=scoring.choice_confidence(probs),
                label_mass=mass,
            )
        return ScoreAnswer(
            score=scoring.expectation(probs),
            confidence=scoring.score_confidence(probs),
            probabilities=tuple(probs),
            legend=tuple(option_texts(question)),
            label_mass=mass,
        )
