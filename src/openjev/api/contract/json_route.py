"""The JSON routes: every route that takes a body parses it with the strict parser
(api/contract/strict_json.py) before FastAPI or pydantic see it, and every validation error
is answered here, safely.

`WireRoute` applies the parse to every route that takes a body (set as the app's route
class before the routes are added); `validation_error` is the 422 handler: it echoes only
what it can encode, truncated (`loc` parts to 100 characters, `input` to a preview), and
cannot fail.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from openjev.api.contract.format_port import Problem
from openjev.api.contract.responses import ErrorResponse
from openjev.api.contract.strict_json import (
    DEFAULT_MAX_DEPTH,
    MAX_ERRORS,
    THREAD_FROM_BYTES,
    check_media_type,
    parse_json,
    show,
)

log = logging.getLogger(__name__)


class ParsedRequest(Request):
    """A request whose body was read and parsed here: FastAPI's handler asks for it through
    the public `body()` and `json()` and gets it without a second read or parse (`json()`
    may return the validated body model: pydantic does not validate an instance again)."""

    def __init__(self, request: Request, body: bytes, value: Any) -> None:
        super().__init__(request.scope, request.receive)
        self._parsed_body = body
        self._parsed = value

    async def body(self) -> bytes:
        return self._parsed_body

    async def json(self) -> Any:
        return self._parsed


class WireRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by `parse_json` (the app's `max_json_depth`)
    before FastAPI validates it. Routes without a body are untouched; an empty body is left
    to FastAPI (which reports the missing body as a 422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def parse_then_handle(request: Request) -> Response:
            body = await request.body()
            if body:
                check_media_type(request.headers.get("content-type"))
                depth = getattr(request.app.state, "max_json_depth", DEFAULT_MAX_DEPTH)  # set by create_app
                if len(body) <= THREAD_FROM_BYTES:
                    value = parse_json(body, max_depth=depth)
                else:  # up to ~0.6 s for a body near the 2 MiB limit: off the event loop
                    value = await asyncio.to_thread(self._parse_and_validate, body, depth)
                request = ParsedRequest(request, body, value)
            return await handler(request)

        return parse_then_handle

    def _parse_and_validate(self, body: bytes, depth: int) -> Any:
        """Parse, then validate against the route's body model, in a worker thread: a body of
        66,000 chat turns takes ~0.1 s to validate. FastAPI validates again on the loop,
        but a model instance passes through at once (pydantic does not revalidate it)."""
        value = parse_json(body, max_depth=depth)
        field = self.body_field
        params = self.dependant.body_params
        if field is None or len(params) != 1 or getattr(params[0].field_info, "embed", False):
            return value  # only a single, unembedded body model is the body field itself
        validated, errors = field.validate(value, {}, loc=("body",))
        if errors:
            raise RequestValidationError(errors)
        return validated


# ---- answering validation errors


def preview(value: Any, *, depth: int = 0, limit: int = 200) -> Any:
    """A bounded, always-encodable rendering of `value` for an error's `input` or `ctx`:
    strings truncated, at most 10 items per container, 3 levels, non-finite floats and
    unknown objects as text."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= 64 else f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return show(value, limit)
    if isinstance(value, bytes | bytearray):
        return show(bytes(value[: limit * 4]).decode("utf-8", "replace"), limit)
    if isinstance(value, dict | list | tuple):
        if depth >= 3:
            return "…"
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        shown = items[:10]
        if isinstance(value, dict):
            out: dict[str, Any] = {show(str(k), 100): preview(v, depth=depth + 1, limit=limit) for k, v in shown}
            if len(items) > 10:
                out["…"] = f"{len(items) - 10} more keys"
            return out
        seq = [preview(v, depth=depth + 1, limit=limit) for _, v in shown]
        if len(items) > 10:
            seq.append(f"… {len(items) - 10} more items")
        return seq
    try:
        return show(str(value), limit)
    except Exception:  # noqa: BLE001 - an object whose str() fails is shown by its type
        return f"<{type(value).__name__}>"


def safe_errors(errors: Any) -> list[dict[str, Any]]:
    """Validation errors as the contract's detail[] ({loc, msg, type}, plus a bounded
    `input` and `ctx`), every part encodable."""
    out = []
    for err in list(errors)[:MAX_ERRORS]:
        loc = [part if isinstance(part, int) else show(str(part), 100) for part in err.get("loc", ())]
        item: dict[str, Any] = {
            "loc": loc,
            "msg": show(str(err.get("msg", "")), 1000),
            "type": show(str(err.get("type", "")), 100),
        }
        if "input" in err:
            item["input"] = preview(err["input"])
        if isinstance(err.get("ctx"), dict):
            item["ctx"] = {show(str(k), 100): preview(v) for k, v in list(err["ctx"].items())[:10]}
        out.append(item)
    return out


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """The validation handler (a 422 on Jev's routes, rendered by the route's format); echoes
    only what `safe_errors` made safe, and cannot fail."""
    try:
        return ErrorResponse(Problem.invalid(safe_errors(exc.errors())))
    except Exception:  # never a 500 for a bad request: a plain 422 instead
        log.exception("could not render a validation error")
        return ErrorResponse(
            Problem.invalid([{"loc": ["body"], "msg": "the request is invalid", "type": "value_error"}])
        )


def install(app: FastAPI) -> None:
    """Route every body through `parse_json` and answer validation errors with
    `validation_error`. Call before the routes are added (they take the route class then)."""
    app.router.route_class = WireRoute
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
