"""The face of a request: which wire format its errors leave in, chosen by route path.

Errors are made in several places (the body reader, the key check and limits in api/identity/admission.py,
the Host check, the strict JSON parse and its validation handler in api/contract/wire.py, the routes'
handlers), all in Jev's shape: `{"detail": {"error_type", "message"}}` or, for validation,
`{"detail": [{loc, msg, type}]}`. That stays the one canonical form. A route of another face
gets its errors converted here, once, on the way out, like its answers are converted by its
own converter: one renderer per face, and no error path that can forget it (a new one added
anywhere inside this middleware is converted too).

OpenAI's face (`/v1/decisions`): `{"error": {"message", "type", "param", "code"}}`, and a
validation error is a 400 `invalid_request_error` whose `param` names the field
(`questions[0].choices`), because OpenAI answers 400 where Jev answers 422. Statuses the SDK
reads (400, 401, 404, 413, 415, 429, 503, 504, 529 ...) and headers (Retry-After,
WWW-Authenticate, the request id) are kept. Answers (2xx) pass untouched.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openjev.api.contract.openai_schemas import ITEM_TAGS

log = logging.getLogger(__name__)

OPENAI_PATHS = frozenset({"/v1/decisions"})
MAX_ERROR_BODY = 1 << 20  # error bodies are small; a larger one is passed on as it is


def face_of(path: str) -> str:
    """ "openai" for OpenAI's routes, else "jev" (the canonical shape, never rewritten)."""
    return "openai" if path in OPENAI_PATHS else "jev"


# Jev's error_type -> OpenAI's (type, code); statuses other than 422 stay as they are.
_OPENAI_TYPES: dict[str, tuple[str, str | None]] = {
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

# pydantic names the member of a union it tried in `loc`: a discriminated union's tag
# (questions[0] -> "choice") or a plain union's type ("str", "list[...]"). Not fields.
_TAGS = frozenset(
    {
        "predicate",
        "choice",
        "score",
        "input_text",
        "input_image",
        "input_json",
        "output_text",
        "refusal",
        *ITEM_TAGS,
    }
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


def openai_error(status: int, canonical: Any) -> tuple[int, dict[str, Any]]:
    """(status, body) on OpenAI's face for a canonical (Jev-shaped) error body."""
    detail = canonical.get("detail") if isinstance(canonical, dict) else None
    if isinstance(detail, list):  # validation: OpenAI answers 400 and names the first field
        # A union's errors come one per member it tried; the deepest names the real place
        # (input[0].content, not input "should be a valid string").
        items = [d for d in detail if isinstance(d, dict)]
        first = max(items, key=lambda d: len(param_of(list(d.get("loc") or [])) or ""), default={})
        message = str(first.get("msg") or "the request is invalid").removeprefix("Value error, ")
        param = param_of(first.get("loc") or [])
        if param and len(param) > 120:  # deep nesting: the place is the message's to tell
            param = None
        if param and param not in message:
            message = f"{param}: {message}"
        if len(detail) > 1:
            message += f" (and {len(detail) - 1} more problem{'s' if len(detail) > 2 else ''})"
        code = first.get("type") if first.get("type") in ("unsupported", "too_long") else None
        return 400, _body(message, "invalid_request_error", param, code)
    if isinstance(detail, dict):
        error_type, message = str(detail.get("error_type") or ""), str(detail.get("message") or "")
    else:
        error_type, message = "", "the request failed"
    if status >= 500:
        kind, code = ("timeout_error", "timeout") if status == 504 else ("server_error", None)
        if status == 529:
            kind, code = "overloaded_error", "server_overloaded"
        elif status == 503:
            kind, code = "service_unavailable_error", "service_unavailable"
    else:
        kind, code = _OPENAI_TYPES.get(error_type, ("invalid_request_error", error_type or None))
    param = "model" if error_type == "not_found" else None
    return (400 if status == 422 else status), _body(message, kind, param, code)


def _body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class FaceMiddleware:
    """Renders the error responses of OpenAI's routes on OpenAI's face (see the module doc).
    Sits outside the middleware that make errors (ops, body, Host) and inside the request-id
    one, so the access log and metrics still see the canonical error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or face_of(scope["path"]) == "jev":
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_face(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if message["status"] < 400:
                    await send(message)
                else:
                    start = message  # held until the body is complete
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            await self._send_error(start, b"".join(chunks), send)

        await self.app(scope, receive, send_face)

    @staticmethod
    async def _send_error(start: Message, body: bytes, send: Send) -> None:
        status = start["status"]
        try:
            canonical = json.loads(body) if body and len(body) <= MAX_ERROR_BODY else None
            status, face = openai_error(status, canonical)
            out = json.dumps(face, ensure_ascii=False).encode()
        except Exception:
            log.exception("could not render an error on OpenAI's face")
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        headers = MutableHeaders(raw=list(start.get("headers", [])))
        headers["content-length"] = str(len(out))
        headers["content-type"] = "application/json"
        await send({**start, "status": status, "headers": headers.raw})
        await send({"type": "http.response.body", "body": out})
