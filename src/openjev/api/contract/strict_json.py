"""The strict JSON parser: every JSON request body is parsed here, strictly, before FastAPI
or pydantic see it (api/contract/json_route.py applies it to every route with a body).

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
"""

from __future__ import annotations

import json
import math
import re
import sys
from email.message import Message
from typing import Any

from fastapi.exceptions import RequestValidationError

from openjev.config import LimitSettings
from openjev.errors import UnsupportedMediaType

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
    value = _decode(text, suspect, max_depth)
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


def _decode(text: str, suspect: list[bool], max_depth: int) -> Any:
    """The text decoded (`suspect` marks values the walk must name), or the decode's error."""
    try:
        return _decoder(suspect).decode(text)
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
