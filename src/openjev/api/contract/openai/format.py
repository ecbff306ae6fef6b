"""OpenAI's Decisions format (`POST /v1/decisions`): a plug-in of the one decision pipeline
(api/contract/format_port.py `WireFormat`), converted by api/contract/openai/convert.py.

Its errors: `{"error": {"message", "type", "param", "code"}}`, and a validation error is a
400 `invalid_request_error` whose `param` names the field (`questions[0].choices`), because
OpenAI answers 400 where Jev answers 422. Statuses the SDK reads (400, 401, 404, 413, 415,
429, 503, 504, 529 ...) and headers (Retry-After, WWW-Authenticate, the request ids) are
kept. The error is rendered from its `Problem`, never from another format's body.
"""

from __future__ import annotations

from typing import Any

from openjev.api.contract import documented
from openjev.api.contract.format_port import Problem, Rendered, WireFormat
from openjev.api.contract.openai import answers
from openjev.api.contract.openai import convert as oc
from openjev.api.contract.openai import items as oi
from openjev.api.contract.openai import schemas as oa

PATHS = ("/v1/decisions",)

# Jev's error_type -> OpenAI's (type, code); statuses other than 422 stay as they are.
_TYPES: dict[str, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication_error": ("authentication_error", "invalid_api_key"),
    "not_found": ("invalid_request_error", "model_not_found"),
    "payload_too_large": ("invalid_request_error", "payload_too_large"),
    "unsupported_encoding": ("invalid_request_error", "unsupported_encoding"),
    "unsupported_media_type": ("invalid_request_error", "unsupported_media_type"),
    "tokens_exceeded": ("invalid_request_error", "context_length_exceeded"),
    "unsupported": ("invalid_request_error", "unsupported"),
    "rate_limit_error": ("rate_limit_error", "rate_limit_exceeded"),
    "timeout": ("timeout_error", "timeout"),
    "client_closed_request": ("invalid_request_error", "client_closed_request"),
}
_SERVER: dict[int, tuple[str, str | None]] = {
    504: ("timeout_error", "timeout"),
    529: ("overloaded_error", "server_overloaded"),
    503: ("service_unavailable_error", "service_unavailable"),
}

# pydantic names the member of a union it tried in `loc`: a discriminated union's tag
# (questions[0] -> "choice") or a plain union's type ("str", "list[...]"). Not fields.
_TAGS = frozenset(
    {"predicate", "choice", "score", "input_text", "input_image", "input_json", "output_text", "refusal", *oi.ITEM_TAGS}
)
_TYPE_NAMES = frozenset({"str", "bool", "int", "float", "dict", "list", "none", "is-instance", "tagged-union"})


def _type_part(part: str) -> bool:
    return part in _TYPE_NAMES or "[" in part or part.startswith(("function-", "constrained-", "lax-", "strict-"))


def param_of(loc: list[Any]) -> str | None:
    """OpenAI's `param` for a validation `loc`: `["body", "questions", 0, "choice", "choices"]`
    -> `questions[0].choices`; a header's name for `["header", name]`; None for the body."""
    if not loc:
        return None
    where, rest = loc[0], list(loc[1:])
    if where == "header":
        return str(rest[0]) if rest else None
    out = ""
    prev: Any = None
    for part in rest:
        if isinstance(part, int) and not out:
            return None  # a position in the body's text (invalid JSON or UTF-8): no field
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (_type_part(part) or (isinstance(prev, int) and part in _TAGS)):
            pass  # a union member's label, not a field (a tag only ever directly follows an index)
        else:
            out += f".{part}" if out else str(part)
        prev = part
    return out or None


def _invalid(errors: list[dict[str, Any]]) -> Rendered:
    """A validation error: 400, naming the first field. A union's errors come one per member
    it tried; the deepest names the real place (input[0].content, not input "should be a
    valid string")."""
    first = max(errors, key=lambda d: len(param_of(list(d.get("loc") or [])) or ""), default={})
    message = str(first.get("msg") or "the request is invalid").removeprefix("Value error, ")
    param = param_of(list(first.get("loc") or []))
    if param and len(param) > 120:  # deep nesting: the place is the message's to tell
        param = None
    if param and param not in message:
        message = f"{param}: {message}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    code = first.get("type") if first.get("type") in ("unsupported", "too_long") else None
    return 400, _body(message, "invalid_request_error", param, code)


def render_error(problem: Problem) -> Rendered:
    if problem.errors is not None:
        return _invalid(problem.errors)
    if problem.status >= 500:
        kind, code = _SERVER.get(problem.status, ("server_error", None))
    else:
        kind, code = _TYPES.get(problem.error_type, ("invalid_request_error", problem.error_type or None))
    param = "model" if problem.error_type == "not_found" else None
    return (400 if problem.status == 422 else problem.status), _body(problem.message, kind, param, code)


def _body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _audit(body: oa.DecisionCreate) -> dict[str, str]:
    if body.safety_identifier is None:  # the value itself is never logged
        return {}
    return {"safety_identifier_hmac": oc.pseudonym(body.safety_identifier)}


def _error_doc(text: str) -> dict[str, Any]:
    return {"description": text, "model": answers.DecisionErrorBody}


# The statuses documented.DECISION_ERRORS lists, in OpenAI's shape; validation is a 400 here.
RESPONSES: dict[int | str, dict[str, Any]] = {
    code: _error_doc(spec["description"]) for code, spec in documented.DECISION_ERRORS.items() if code != 422
}
RESPONSES[400] = _error_doc(
    "invalid_request_error, `param` naming the field: the body's schema, a Jev-shaped body (send it to "
    "/v1/systemone), more questions than --max-questions, choices or levels that read the same, an "
    "input_image, a tool output without its call, a token budget exceeded (context_length_exceeded), invalid "
    "JSON, NaN, repeated keys, lone surrogates, nesting deeper than max_json_depth, a bad x-openjev-* header; "
    "also a corrupt gzip/zstd body or a refused Host"
)
# Any other client error (405, 408, 431 ...) leaves in the same shape; OpenAI has no 422.
RESPONSES["4XX"] = _error_doc(
    "any other client error the app answers (e.g. 405), in the same shape (the 408 and 431 of a slow or "
    "oversized request head come from the connection layer, before any route is known, in Jev's shape)"
)

OPENAI = WireFormat(
    name="openai",
    paths=PATHS,
    body=oa.DecisionCreate,
    response=answers.Decision,
    convert=oc.request_of,
    model_of=lambda body: body.model,
    render=oc.result_to_wire,
    render_error=render_error,
    summary="Answer typed questions about an input (OpenAI's Decisions format)",
    responses=RESPONSES,
    partition=lambda body: oc.cache_partition(body.prompt_cache_key),
    audit=_audit,
    id_header="x-request-id",
    rate_limit_headers=True,
)
