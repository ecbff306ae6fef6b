"""What each route can answer besides 200, as the OpenAPI document states it: every status
with its real body (the contract's two error shapes), so that clients and the fuzz tests
(tests/api/test_fuzz.py, schemathesis) can hold the server to it. Keep in step with
errors.py (statuses of OpenjevError), api/contract/strict_json.py (415, 422), api/identity/door.py (401, 429), api/server/drain.py (503),
api/identity/hosts.py (400) and api/operations/connections.py (408, 431; its 503 for a connection beyond
--max-connections is answered before any route is known, like the 400 for unparseable HTTP).
"""

from __future__ import annotations

from typing import Any

from openjev.api.contract.jev import schemas
from openjev.api.contract.overrides import TASK_HEADER, TASK_ID_PATTERN
from openjev.core.readouts import READOUT_NAMES

Responses = dict[int | str, dict[str, Any]]


def _error(text: str) -> dict[str, Any]:
    return {"description": text, "model": schemas.ErrorBody}


UNAUTHORIZED: Responses = {
    401: _error("missing or wrong API key (authentication_error), with WWW-Authenticate: Bearer")
}
RATE_LIMITED: Responses = {
    429: _error("this API key is over its requests/min or tokens/min (rate_limit_error); see Retry-After")
}
NOT_READY: Responses = {503: _error("the model is still loading, or loading failed; see Retry-After")}

# Below the routes, on any of them (the connection is closed after each).
CONNECTION_ERRORS: Responses = {
    400: _error("a Host this server does not answer (--allowed-hosts), or a request HTTP cannot parse"),
    408: _error("the request head did not arrive within --head-timeout-s (timeout)"),
    431: _error("the request head is larger than --max-head-bytes"),
}

# POST routes that take a body: what the wire, the schema, the budgets and the engine refuse.
BODY_ERRORS: Responses = {
    **CONNECTION_ERRORS,
    400: _error(
        "a Content-Encoding body that does not decode (corrupt gzip or zstd), a body cut short, "
        "a Host this server does not answer, or a request HTTP cannot parse"
    ),
    408: _error("the request head or body did not arrive within --head-timeout-s / --body-timeout-s (timeout)"),
    **UNAUTHORIZED,
    413: _error("request body too large, before or after decoding (payload_too_large)"),
    415: _error(
        "unsupported Content-Encoding (gzip, zstd or none), or a body not declared JSON "
        "(Content-Type: application/json, UTF-8) (unsupported_encoding, unsupported_media_type)"
    ),
    422: {
        "description": "validation error: detail[] of {loc, msg, type}, loc naming the place (invalid JSON or "
        "UTF-8, NaN/Infinity, repeated keys, lone surrogates, nesting deeper than max_json_depth, schema); "
        "or detail{error_type, message}: a token budget exceeded (tokens_exceeded), an unsupported feature "
        "(unsupported), input that cannot be shown to the model (invalid_request)",
        "model": schemas.UnprocessableBody,
    },
    **RATE_LIMITED,
    502: _error("the engine answered with something unusable (unknown; retryable)"),
    503: _error(
        "model still loading, the engine is down, the server is draining (SIGTERM), or the shared limits store "
        "does not answer (--limits-redis-mode closed); see Retry-After"
    ),
    504: _error("the engine missed its deadline (timeout)"),
    529: _error("too many evaluations or tokens in flight (rate_limit_error); see Retry-After"),
}

DECISION_ERRORS: Responses = {
    **BODY_ERRORS,
    404: _error(
        "unknown model (not_found): use jev-latest, a jev-* alias or the served name; or an x-openjev-task "
        "this key does not have"
    ),
    409: _error(
        "the x-openjev-task named is not fitted yet, or was fitted for another model, readout or question (conflict)"
    ),
}

READ_ERRORS: Responses = {**CONNECTION_ERRORS, **UNAUTHORIZED, **RATE_LIMITED, **NOT_READY}

HEALTH: Responses = {
    **CONNECTION_ERRORS,
    200: {"description": "the model is loaded", "model": schemas.HealthBody},
    503: {
        "description": "loading, loading failed (with the error), draining (with Retry-After), or the engine "
        "server does not answer (engine_unavailable, with the reason)",
        "model": schemas.HealthBody,
    },
}

# The per-request readout headers (api/contract/overrides.py); a bad value is a 422 naming the header.
READOUT_HEADERS: list[dict[str, Any]] = [
    {
        "name": "x-openjev-readout",
        "in": "header",
        "required": False,
        "description": "how questions are read (default: the server's --readout); parallel reads choice "
        "options side by side (order-free), on the in-process engine; other engines read canonical for it "
        "(the options lettered once in an order of their own text: order-free, one reading)",
        "schema": {"type": "string", "enum": list(READOUT_NAMES)},
    },
    {
        "name": "x-openjev-rotations",
        "in": "header",
        "required": False,
        "description": "letters: option orders read and averaged, 1..max_rotations (default: --rotations)",
        "schema": {"type": "integer", "minimum": 1},
    },
    {
        "name": "x-openjev-calibration",
        "in": "header",
        "required": False,
        "description": "none: answer uncalibrated; default: the server's calibration where it has a fit",
        "schema": {"type": "string", "enum": ["default", "none"]},
    },
    {
        "name": TASK_HEADER,
        "in": "header",
        "required": False,
        "description": "a task of this key (/v1/tasks) whose fit and abstain threshold answer the request's "
        "questions of its wording; without it, a ready task of this key with a question's wording applies",
        "schema": {"type": "string", "pattern": TASK_ID_PATTERN},
    },
]
