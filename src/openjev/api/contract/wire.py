"""Where the wire becomes safe: every JSON request body is parsed here, strictly, before
FastAPI or pydantic see it, and every validation error is answered here, safely.

The parse (`parse_json`) refuses, each with a 422 in the contract's `detail[]` shape whose
`loc` names the place:
- a body that is not UTF-8 (RFC 8259: JSON on the wire is UTF-8);
- invalid JSON (the position and line/column);
- NaN, Infinity, -Infinity, and numbers that overflow a double (`1e999`): JSON has no
  such values, and the model would read the text "NaN";
- integers longer than Python's integer-string limit (4300 digits);
- a key repeated in one object (the last one would silently win);
- a lone UTF-16 surrogate (`"\\ud800"`): it is not text, no encoder can send it on;
- arrays and objects nested deeper than `max_json_depth` (64 by default).

A body without a JSON media type (`application/json` or `application/*+json`) is a 415;
JSON is UTF-8, so a `charset` other than utf-8 is a 415 too.

`WireRoute` applies the parse to every route that takes a body (set as the app's route
class before the routes are added); `validation_error` is the 422 handler: it echoes only
what it can encode, truncated (`loc` parts to 100 characters, `input` to a preview), and
cannot fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import sys
from collections.abc import Callable, Coroutine
from email.message import Message
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from openjev.api.contract.face import Problem
from openjev.api.contract.responses import ErrorResponse
from openjev.config import LimitSettings
from openjev.errors import UnsupportedMediaType

log = logging.getLogger(__name__)

DEFAULT_MAX_DEPTH = LimitSettings.max_json_depth  # the setting's default (config/sections.py)
THREAD_FROM_BYTES = 64 * 1024  # larger bodies are parsed in a worker thread
MAX_ERRORS = 10  # problems reported per body; the first ones say what to fix

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # the only way a surrogate gets into decoded UTF-8
_INT_DIGITS = sys.get_int_max_str_digits() or 4300


# ---- parsing


class _Bad:
    """Stands in for a value the parse refuses, so that the walk can name where it was."""

    __slots__ = ("reason", "text")

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason


class _Repeated(dict):
    """An object with repeated keys (only ever seen by the walk, which refuses it)."""

    repeated: list[str]


def _decoder(suspect: list[bool]) -> json.JSONDecoder:
    """A stdlib decoder whose hooks leave a _Bad or a _Repeated where the value is refused,
    and set `suspect` so that only such bodies pay for the walk that names the places."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        suspect.append(True)
        out = _Repeated(obj)
        seen: set[str] = set()
        out.repeated = [k for k, _ in items if k in seen or seen.add(k)]  # type: ignore[func-returns-value]
        return out

    def constant(name: str) -> _Bad:
        suspect.append(True)
        return _Bad(name, "non_finite")

    def number(text: str) -> float | _Bad:
        value = float(text)
        if math.isfinite(value):
            return value
        suspect.append(True)
        return _Bad(text, "non_finite")

    def integer(text: str) -> int | _Bad:
        if len(text) <= _INT_DIGITS:
            return int(text)
        suspect.append(True)
        return _Bad(text, "int_too_long")

    return json.JSONDecoder(object_pairs_hook=pairs, parse_constant=constant, parse_float=number, parse_int=integer)


def _deeper_than(value: Any, max_depth: int, depth: int = 1) -> bool:
    """Whether containers nest deeper than `max_depth` (`value` at `depth`); containers only."""
    if depth > max_depth:
        return True
    items = value.values() if isinstance(value, dict) else value
    return any(isinstance(item, dict | list) and _deeper_than(item, max_depth, depth + 1) for item in items)


def show(text: str, limit: int = 60) -> str:
    """`text` safe to put in a message or a `loc`: lone surrogates written as escapes,
    at most `limit` characters (the rest counted)."""
    if _SURROGATE.search(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text) - limit} more characters)"
    return text


def _error(loc: tuple[str | int, ...], kind: str, msg: str, **ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"loc": ("body", *loc), "msg": msg, "type": kind}
    if ctx:
        out["ctx"] = ctx
    return out


def _walk(value: Any, path: tuple[str | int, ...], max_depth: int, errors: list[dict[str, Any]]) -> None:
    """Every problem the parse left in `value` (up to MAX_ERRORS), with its path."""
    if len(errors) >= MAX_ERRORS:
        return
    if isinstance(value, str):
        if _SURROGATE.search(value):
            errors.append(_lone_surrogate(path, value))
        return
    if isinstance(value, _Bad):
        errors.append(_bad_number(path, value))
        return
    if isinstance(value, dict | list) and len(path) >= max_depth:
        errors.append(
            _error(
                path,
                "json_too_deep",
                f"arrays and objects may nest at most {max_depth} levels deep (the whole body counted); "
                "flatten the structure or send the deep part as a string",
                max_depth=max_depth,
            )
        )
        return
    if isinstance(value, dict):
        _walk_object(value, path, max_depth, errors)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, (*path, i), max_depth, errors)


def _walk_object(value: dict, path: tuple[str | int, ...], max_depth: int, errors: list[dict[str, Any]]) -> None:
    """`_walk` of an object: its repeated keys, its keys' lone surrogates, then its values."""
    if isinstance(value, _Repeated):
        for key in value.repeated:
            errors.append(
                _error(
                    (*path, show(key, 100)),
                    "json_duplicate_key",
                    f"the key {show(key)!r} appears more than once in this object; keys must be unique "
                    "(JSON parsers disagree on which one wins)",
                )
            )
    for key, item in value.items():
        if _SURROGATE.search(key):
            errors.append(_lone_surrogate((*path, show(key, 100)), key))
        _walk(item, (*path, show(key, 100)), max_depth, errors)


def _bad_number(path: tuple[str | int, ...], value: _Bad) -> dict[str, Any]:
    if value.reason == "non_finite":
        msg = f"{show(value.text)} is not a JSON number: NaN and infinities (or numbers beyond ±1.8e308) are not allowed; send a finite number or a string"
    else:
        msg = f"an integer of {len(value.text)} digits is too long (at most {_INT_DIGITS}); send it as a string"
    return _error(path, "json_invalid_number", msg)


def _lone_surrogate(path: tuple[str | int, ...], text: str) -> dict[str, Any]:
    at = _SURROGATE.search(text)
    where = at.start() if at else 0
    return _error(
        path,
        "string_lone_surrogate",
        f"the string holds a lone UTF-16 surrogate (\\u{ord(text[where]):04x} at character {where}), which is "
        "not text; escape a character outside the BMP as a surrogate pair or send it as UTF-8",
    )


def parse_json(body: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """The body as JSON, or RequestValidationError naming each problem (see the module doc)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestValidationError(
            [
                _error(
                    (e.start,),
                    "utf8_invalid",
                    f"the body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start}: {e.reason}); "
                    "JSON must be sent as UTF-8",
                )
            ]
        ) from None
    suspect: list[bool] = []
    try:
        value = _decoder(suspect).decode(text)
    except json.JSONDecodeError as e:
        raise RequestValidationError(
            [
                _error(
                    (e.pos,),
                    "json_invalid",
                    f"JSON decode error: {e.msg} (line {e.lineno}, column {e.colno})",
                    error=e.msg,
                )
            ]
        ) from None
    except RecursionError:
        raise RequestValidationError(
            [
                _error(
                    (),
                    "json_too_deep",
                    f"arrays and objects may nest at most {max_depth} levels deep; this body nests far deeper",
                    max_depth=max_depth,
                )
            ]
        ) from None
    if not (
        suspect
        or _ESCAPED_SURROGATE.search(text)
        or (isinstance(value, dict | list) and _deeper_than(value, max_depth))
    ):
        return value  # the common case: nothing to name, no walk
    errors: list[dict[str, Any]] = []
    _walk(value, (), max_depth, errors)
    if errors:
        raise RequestValidationError(errors)
    return value


def check_media_type(content_type: str | None) -> None:
    """415 unless the body is declared JSON (RFC 8259: UTF-8)."""
    if not content_type:
        raise UnsupportedMediaType(
            "the request has no Content-Type; send the JSON body with Content-Type: application/json"
        )
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        raise UnsupportedMediaType(
            f"Content-Type {show(content_type)!r} is not JSON; send the body with Content-Type: application/json"
        )
    charset = message.get_param("charset")
    if isinstance(charset, str) and charset.strip().lower() not in ("utf-8", "utf8"):
        raise UnsupportedMediaType(f"JSON bodies are UTF-8; charset={show(charset)!r} is not supported")


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
