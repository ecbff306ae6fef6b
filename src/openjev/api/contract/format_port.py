"""What a wire format is to the edge (a plug-in, `WireFormat`), and the one form of an error
before a format renders it (`Problem`).

An error is made once, as a `Problem`, where it happens (an `OpenjevError` raised anywhere,
a validation error, the router's 404/405, a bug's 500), and rendered once, by the format
of the route it answers (`api/contract/formats.py` chooses by path; `ErrorResponse` in
`api/contract/responses.py` renders when it is sent). No body is ever parsed back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openjev.core.types import DecisionRequest, DecisionResult
from openjev.errors import OpenjevError

VALIDATION_ERROR = "validation_error"  # the error_type of a 422 (its detail is a list)


@dataclass(frozen=True)
class Problem:
    """An error answer before its format renders it: status, wire `error_type`, public
    message and headers; `errors` is a validation error's detail[] (already made safe by
    api/contract/json_route.py `safe_errors`), None for every other error."""

    status: int
    error_type: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    errors: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, exc: OpenjevError) -> Problem:
        return cls(exc.status, exc.error_type, exc.message, dict(exc.headers))

    @classmethod
    def invalid(cls, errors: list[dict[str, Any]]) -> Problem:
        return cls(422, VALIDATION_ERROR, "the request is invalid", errors=errors)


Rendered = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class WireFormat:
    """One wire format of the decision routes. The edge's one pipeline
    (api/server/pipeline.py) runs every shared step; a format supplies only what is its own:

    - `paths`: the routes it serves (the first its own name, the others aliases);
    - `body`, `response`: its pydantic request and response models (OpenAPI and validation);
    - `convert(body, max_questions)`: the body as the core's request, the question count
      checked first (cheap), raising the format's own validation error; it may run in a
      worker thread for a large body;
    - `model_of(body)`, `partition(body)`: the model asked for, and the cache partition
      inside the caller's namespace ("" for none);
    - `render(body, result, model)`: the answer's body;
    - `render_error(problem)`: (status, body) of an error on this format;
    - `audit(body)`: log fields about the request (never its text), {} for none;
    - `summary`, `responses`: its OpenAPI summary and documented statuses;
    - `id_header`: a header that repeats the request id where the format's clients read
      it (OpenAI's SDK: `x-request-id`), None for none;
    - `rate_limit_headers`: whether answers carry the caller's key limits as OpenAI's
      `x-ratelimit-*` headers (api/server/conventions.py).
    """

    name: str
    paths: tuple[str, ...]
    body: type
    response: type
    convert: Callable[[Any, int], DecisionRequest]
    model_of: Callable[[Any], str]
    render: Callable[[Any, DecisionResult, str], dict[str, Any]]
    render_error: Callable[[Problem], Rendered]
    summary: str
    responses: dict[int | str, dict[str, Any]]
    partition: Callable[[Any], str] = lambda _body: ""
    audit: Callable[[Any], dict[str, str]] = lambda _body: {}
    # the task the body names, where the format has a field for one (api/server/task_binding.py)
    task_of: Callable[[Any], str | None] = lambda _body: None
    id_header: str | None = None
    rate_limit_headers: bool = False
