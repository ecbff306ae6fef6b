"""Jev's SystemOne format (`POST /v1/systemone`, and the alias other Jev-compatible servers
use): a plug-in of the one decision pipeline (api/contract/format_port.py `WireFormat`). Its errors
are `{"detail": {"error_type", "message"}}`, a validation error `{"detail": [{loc, msg,
type}]}` with status 422 (the canonical shapes of the Jev contract)."""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError

from openjev.api.contract import documented
from openjev.api.contract.format_port import Problem, Rendered, WireFormat
from openjev.api.contract.jev import convert, schemas
from openjev.core.types import DecisionRequest

PATHS = ("/v1/systemone", "/api/alpha/decisions")  # the vendor's name first, then the alias


def too_many(count: int, max_questions: int) -> RequestValidationError:
    return RequestValidationError(
        [
            {
                "loc": ("body", "questions"),
                "type": "too_long",
                "input": None,
                "msg": f"at most {max_questions} questions per request, got {count}",
            }
        ]
    )


def request_of(body: schemas.SystemOneRequest, max_questions: int) -> DecisionRequest:
    """The core request; more questions than `max_questions` is a 422 on `questions`."""
    if len(body.questions) > max_questions:
        raise too_many(len(body.questions), max_questions)
    return convert.request_of(body)


def render_error(problem: Problem) -> Rendered:
    if problem.errors is not None:
        return problem.status, {"detail": problem.errors}
    return problem.status, {"detail": {"error_type": problem.error_type, "message": problem.message}}


def _render(_body: Any, result: Any, model: str) -> dict[str, Any]:
    return convert.result_to_wire(result, model)


JEV = WireFormat(
    name="jev",
    paths=PATHS,
    body=schemas.SystemOneRequest,
    response=schemas.SystemOneResponse,
    convert=request_of,
    model_of=lambda body: body.model,
    render=_render,
    render_error=render_error,
    summary="Answer typed questions about a state",
    responses=documented.DECISION_ERRORS,
    task_of=lambda body: body.x_task,
)
