"""Exception handlers: every error the routes raise becomes one `Problem`
(api/contract/format_port.py), rendered by the format of the route it answers (Jev's
`{"detail": {"error_type", "message"}}` unless the route speaks another)."""

from __future__ import annotations

import logging
from typing import cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from openjev.api.contract.format_port import Problem
from openjev.api.contract.responses import ErrorResponse
from openjev.api.operations import disclosure
from openjev.api.operations.middleware import INTERNAL, REQUEST_ID_HEADER, error_response, request_id_of
from openjev.errors import OpenjevError

log = logging.getLogger(__name__)


async def _openjev_error(request: Request, exc: Exception) -> JSONResponse:
    public = disclosure.public(cast(OpenjevError, exc))  # registered for OpenjevError only
    disclosure.remember(request.scope, public)  # the detail goes to the access log only
    return error_response(public)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    exc = cast(StarletteHTTPException, exc)  # registered for StarletteHTTPException only
    kind = "not_found" if exc.status_code == 404 else "invalid_request" if exc.status_code < 500 else "unknown"
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":  # the router's: say what was not found
        message = "no route at this path (the routes are listed at /openapi.json)"
    elif exc.status_code == 405 and message == "Method Not Allowed":
        allowed = (getattr(exc, "headers", None) or {}).get("Allow") or (getattr(exc, "headers", None) or {}).get(
            "allow"
        )
        message = f"method {request.method} is not allowed on this route" + (
            f" (allowed: {allowed})" if allowed else ""
        )
    return ErrorResponse(Problem(exc.status_code, kind, message, dict(getattr(exc, "headers", None) or {})))


async def _unexpected(request: Request, _exc: Exception) -> JSONResponse:
    # Runs outside our middleware (Starlette's ServerErrorMiddleware), so add the id here.
    log.exception("unexpected error")
    return ErrorResponse(INTERNAL, headers={REQUEST_ID_HEADER: request_id_of(request.scope) or ""})


def install(app: FastAPI) -> None:
    app.add_exception_handler(OpenjevError, _openjev_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
