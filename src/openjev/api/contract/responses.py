"""JSON responses encoded with orjson, several times faster than the stdlib encoder on
answer bodies (bench/bench_api.py measures both). One difference: orjson writes NaN and
infinities as null where Starlette's encoder raises; answers are checked finite in the core
(service.py) before they are encoded, so none reach here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from openjev.api.contract.format_port import Problem
from openjev.api.contract.formats import render_error


class FastJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


# Where an error response leaves its wire `error_type` for the access log and the metrics.
ERROR_TYPE_KEY = "error_type"


class ErrorResponse(JSONResponse):
    """An error answer: its `Problem` (api/contract/format_port.py) rendered, as it is sent, by the
    format of the route it answers (api/contract/formats.py, by the request's path), so that
    no error is made in one format and converted to another. It records its `error_type` in
    the request's state: the access log and the metrics read it there (data), never by
    parsing the body again."""

    def __init__(self, problem: Problem, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(None, status_code=problem.status, headers={**problem.headers, **(headers or {})})
        self.problem = problem
        self.error_type = problem.error_type

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, body = render_error(scope.get("path", ""), self.problem)
        self.status_code = status
        self.body = orjson.dumps(body)
        MutableHeaders(raw=self.raw_headers)["content-length"] = str(len(self.body))
        scope.setdefault("state", {})[ERROR_TYPE_KEY] = self.error_type
        await super().__call__(scope, receive, send)


def error_type_of(scope: Scope) -> str | None:
    """The `error_type` of the error response this request was answered with, if any."""
    return scope.get("state", {}).get(ERROR_TYPE_KEY)
