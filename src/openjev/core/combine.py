"""An engine's result for a compiled request, read back per question: each question's
branches' label log-probs combined by the readout into one probability per option."""

from __future__ import annotations

from openjev.core.ports import PlanResult
from openjev.core.prompts import CompiledRequest
from openjev.core.readouts import Combined, Readout
from openjev.core.types import DecisionRequest
from openjev.errors import EngineError


def combine_all(
    readout: Readout, request: DecisionRequest, compiled: CompiledRequest, result: PlanResult
) -> list[Combined]:
    """Per question of `request`, in its order, its readings combined. Raises EngineError where
    the engine's result does not fit the plan (a count, a label, unusable log-probs)."""
    if len(result.branches) != len(compiled.plan.branches):
        raise EngineError(f"engine returned {len(result.branches)} results for {len(compiled.plan.branches)} branches")
    out = []
    for (_, question), (start, count) in zip(request.questions, compiled.spans, strict=True):
        branches = compiled.plan.branches[start : start + count]
        logprobs = [r.logprobs for r in result.branches[start : start + count]]
        for branch, lp in zip(branches, logprobs, strict=True):
            if len(lp) != len(branch.label_ids):
                raise EngineError(f"engine returned {len(lp)} label log-probs, expected {len(branch.label_ids)}")
        try:
            out.append(readout.combine(question, logprobs))
        except ValueError as e:
            raise EngineError("unusable label log-probs from the engine", detail=str(e)) from None
    return out
