"""Wire schema <-> core types. The only place that knows both."""

from __future__ import annotations

from typing import Any

from openjev.api.contract.common import text_of
from openjev.api.contract.jev import schemas
from openjev.core import types as core
from openjev.errors import InvalidInput, Unsupported


def _chat_turns(value: Any) -> tuple[core.Turn, ...] | None:
    """Turns if `value` is chat-shaped (schemas.chat_items), else None. The schema refused
    chat-shaped states with other roles or null content (schemas.chat_problem)."""
    items = schemas.chat_items(value)
    if items is None:
        return None
    problem = schemas.chat_problem(value)
    if problem:
        raise InvalidInput(problem)
    return tuple(core.Turn(item["role"], text_of(item["content"])) for item in items)


def state_of(value: Any) -> core.State:
    turns = _chat_turns(value)
    if turns is None:
        turns = (core.Turn("user", text_of(value)),)
    return core.State(turns=turns)


def _opt_text(value: Any) -> str | None:
    return None if value is None else text_of(value)


def question_of(q: schemas.NoulQuestion | schemas.ChoiceQuestion | schemas.ScoreQuestion) -> core.Question:
    if isinstance(q, schemas.NoulQuestion):
        crit = q.criteria
        return core.NoulQuestion(
            instructions=_opt_text(q.instructions),
            true_description=_opt_text(crit.true) if crit else None,
            false_description=_opt_text(crit.false) if crit else None,
        )
    if isinstance(q, schemas.ChoiceQuestion):
        return core.ChoiceQuestion(
            instructions=_opt_text(q.instructions),
            options=tuple(core.Option(name, _opt_text(desc)) for name, desc in q.criteria.items()),
        )
    return core.ScoreQuestion(instructions=_opt_text(q.instructions), levels=tuple(text_of(x) for x in q.criteria))


def question_to_wire(q: core.Question) -> dict[str, Any]:
    """The Jev question object that converts back to `q` (`question_of`): how a question a
    decision asked is kept, whatever format asked it."""
    out: dict[str, Any] = {"type": "noul" if isinstance(q, core.NoulQuestion) else "choice"}
    if q.instructions is not None:
        out["instructions"] = q.instructions
    if isinstance(q, core.NoulQuestion):
        sides = {"true": q.true_description, "false": q.false_description}
        if any(v is not None for v in sides.values()):
            out["criteria"] = sides
    elif isinstance(q, core.ChoiceQuestion):
        out["criteria"] = {o.name: o.description for o in q.options}
    else:
        out["type"], out["criteria"] = "score", list(q.levels)
    return out


def request_of(req: schemas.SystemOneRequest) -> core.DecisionRequest:
    if req.assets:
        raise Unsupported("assets (images) are not supported: the served model reads text only")
    return core.DecisionRequest(
        state=state_of(req.state),
        questions=tuple((qid, question_of(q)) for qid, q in req.questions.items()),
    )


def answer_to_wire(answer: core.Answer) -> dict[str, Any]:
    if isinstance(answer, core.NoulAnswer):
        out = {"type": "noul", "noul": answer.p_true, "x_label_mass": answer.label_mass}
    elif isinstance(answer, core.ChoiceAnswer):
        out = {
            "type": "choice",
            "choice": answer.choice,
            "probabilities": dict(answer.probabilities),
            "confidence": answer.confidence,
            "x_label_mass": answer.label_mass,
        }
    else:
        out = {
            "type": "score",
            "score": answer.score,
            "confidence": answer.confidence,
            "legend": {str(i): text for i, text in enumerate(answer.legend)},
            "probabilities": {str(i): p for i, p in enumerate(answer.probabilities)},
            "x_label_mass": answer.label_mass,
        }
    if answer.order_agreement is not None:
        out["x_order_agreement"] = answer.order_agreement
    if answer.abstain:  # the Jev contract has no refusal: the answer stays, marked (core/abstain.py)
        out["x_abstain"] = True
    return out


def basis_to_wire(basis: core.FitBasis) -> dict[str, Any]:
    """An answer's `x_basis`: which fit answered and what it rests on (core.FitBasis)."""
    if basis.kind == "none":
        return {"kind": "none"}
    if basis.kind != "task":
        return {"kind": basis.kind, "fit": basis.name}
    return {
        "kind": "task",
        "fit": basis.name,
        "examples": basis.examples,
        "outcomes": basis.outcomes,
        "cv_ece": basis.cv_ece,
    }


def result_to_wire(result: core.DecisionResult, model: str) -> dict[str, Any]:
    answers = {qid: answer_to_wire(a) for qid, a in result.answers}
    for (qid, _), basis in zip(result.answers, result.fits, strict=False):  # fits: empty on a bare result
        answers[qid]["x_basis"] = basis_to_wire(basis)
    return {
        "model": model,
        "answers": answers,
        "usage": usage_to_wire(result.usage),
    }


def usage_to_wire(usage: core.Usage) -> dict[str, Any]:
    """The contract's two integers, then what the engine really did (x_, where known)."""
    out: dict[str, Any] = {
        "input_tokens": int(usage.input_tokens),
        "output_tokens": int(usage.output_tokens),
        "x_prompt_tokens": int(usage.prompt_tokens),
    }
    if usage.computed_tokens is not None:
        out["x_computed_tokens"] = int(usage.computed_tokens)
    if usage.cached_tokens is not None:
        out["x_cached_tokens"] = int(usage.cached_tokens)
    return out
