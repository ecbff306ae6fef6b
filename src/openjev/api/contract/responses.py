"""JSON responses encoded with orjson, several times faster than the stdlib encoder on
answer bodies (bench/bench_api.py measures both). One difference: orjson writes NaN and
infinities as null where Starlette's encoder raises; answers are checked finite in the core
(service.py) before they are encoded, so none reach here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


# Where an error response leaves its wire `error_type` for the access log and the metrics.
ERROR_TYPE_KEY = "error_type"
VALIDATION_ERROR = "validation_error"  # the error_type of a 422 (its detail is a list)


class ErrorResponse(JSONResponse):
    """An error answer in the contract's shape, which records its `error_type` in the
    request's state as it is sent: the access log and the metrics read it there (data),
    never by parsing the body again. Validation errors (a `detail[]` list) are
    "validation_error"."""

    def __init__(
        self, content: Any, *, status_code: int, error_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers)
        self.error_type = error_type

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})[ERROR_TYPE_KEY] = self.error_type
        await super().__call__(scope, receive, send)


def error_type_of(scope: Scope) -> str | None:
    """The `error_type` of the error response this request was answered with, if any."""
    return scope.get("state", {}).get(ERROR_TYPE_KEY)
