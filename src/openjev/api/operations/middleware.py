"""Pure ASGI middleware: request ids on every response, request bodies bounded and decoded
before anything parses them (and never read for a route that takes none), and HEAD served
wherever GET is."""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib

import zstandard
from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openjev.api.contract.format_port import Problem
from openjev.api.contract.paths import route_of
from openjev.api.contract.responses import ErrorResponse
from openjev.api.operations import disclosure
from openjev.errors import MalformedBody, OpenjevError, PayloadTooLarge, RequestTimeout, UnsupportedEncoding

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-typesafe-request-id"
INTERNAL = Problem(500, "unknown", "internal error")  # a bug: nothing more is said


def error_response(exc: OpenjevError, request_id: str | None = None) -> ErrorResponse:
    """`exc` as an error answer, rendered by the format of the route it answers."""
    return ErrorResponse(Problem.of(exc), headers={REQUEST_ID_HEADER: request_id} if request_id else None)


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


class RequestIdMiddleware:
    """Gives each HTTP request an id (scope["state"]["request_id"]) and puts it on the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = "req_" + uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if REQUEST_ID_HEADER not in headers:
                    headers.append(REQUEST_ID_HEADER, rid)
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyMiddleware:
    """Reads request bodies up to `max_bytes`, before any parsing, chunked or not (413 beyond),
    within `timeout_s` (408 and the connection closed beyond: a client trickling its body
    must not hold a connection and a task for ever), decodes gzip and zstd Content-Encoding
    with the same limit on the decoded bytes, and hands the application the plain body."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("POST", "PUT", "PATCH") or not takes_body(scope):
            # 404/405 from the router (or a GET's answer): a body sent along is never read
            if announces_body(scope):
                await self.app(scope, _no_body(), _closing(send))
            else:
                await self.app(scope, receive, send)
            return
        try:
            try:
                async with asyncio.timeout(self.timeout_s):  # no extra task, unlike wait_for
                    body, encoding = await self._read(scope, receive)
            except TimeoutError:
                raise RequestTimeout(f"the request body did not arrive within {self.timeout_s:g} s") from None
            body = self._decode(body, encoding)
        except OpenjevError as exc:
            disclosure.remember(scope, exc)  # the decoder's text goes to the access log only
            await error_response(exc, request_id_of(scope))(scope, receive, send)
            return
        headers = [
            (k, v)
            for k, v in scope["headers"]
            if k not in (b"content-encoding", b"content-length", b"transfer-encoding")
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        scope = {**scope, "headers": headers}
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnect notices

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> tuple[bytes, str]:
        headers = Headers(scope=scope)
        encoding = headers.get("content-encoding", "identity").strip().lower() or "identity"
        if encoding not in ("identity", "gzip", "x-gzip", "zstd"):
            raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported (use gzip, zstd or none)")
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {self.max_bytes} bytes")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise MalformedBody("client disconnected while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise PayloadTooLarge(f"request body exceeds the limit of {self.max_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), encoding

    def _decode(self, body: bytes, encoding: str) -> bytes:
        if encoding == "identity" or not body:
            return body
        if encoding in ("gzip", "x-gzip"):
            return decode_gzip(body, self.max_bytes)
        return decode_zstd(body, self.max_bytes)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"decoded request body exceeds the limit of {limit} bytes")


def decode_gzip(body: bytes, limit: int) -> bytes:
    """Every gzip member in turn (concatenated members are one body, RFC 1952), at most
    `limit` bytes out; a truncated member or bytes after the last one are refused, saying which."""
    out = bytearray()
    data = body
    members = 0
    while data:
        if members and data[:2] != b"\x1f\x8b":
            raise MalformedBody(f"gzip body has {len(data)} bytes of trailing data after its last member")
        d = zlib.decompressobj(wbits=47)  # gzip or zlib framing, auto-detected
        try:
            out += d.decompress(data, limit + 1 - len(out))
        except zlib.error as e:
            raise MalformedBody("body is not valid gzip", detail=str(e)) from None
        if len(out) > limit:
            raise _too_large(limit)
        if not d.eof:
            raise MalformedBody("gzip body is truncated (its last member does not end)")
        data = d.unused_data
        members += 1
    return bytes(out)


ZSTD_STEP = 128  # input bytes per decompress call: bounds what one call can expand to (~4 MB)


def decode_zstd(body: bytes, limit: int) -> bytes:
    """Every zstd frame in turn, at most `limit` bytes out (plus one step's expansion while
    decoding); a truncated frame or bytes after the last one are refused, saying which."""
    out = bytearray()
    pos = frames = 0
    dctx = zstandard.ZstdDecompressor()
    while pos < len(body):
        obj = dctx.decompressobj()
        try:
            while not obj.eof and pos < len(body):
                piece = body[pos : pos + ZSTD_STEP]
                out += obj.decompress(piece)
                if len(out) > limit:
                    raise _too_large(limit)
                pos += len(piece) - (len(obj.unused_data) if obj.eof else 0)
        except zstandard.ZstdError as e:
            if frames:
                raise MalformedBody(
                    f"zstd body has {len(body) - pos} bytes of trailing data after its last frame", detail=str(e)
                ) from None
            raise MalformedBody("body is not valid zstd", detail=str(e)) from None
        if not obj.eof:
            raise MalformedBody("zstd body is truncated (its last frame does not end)")
        frames += 1
    return bytes(out)


def takes_body(scope: Scope) -> bool:
    """Whether a route of the app (scope["app"], set by Starlette) takes this method on this
    path; anything else is answered 404 or 405 by the router, and its body is not worth reading."""
    router = getattr(scope.get("app"), "router", None)
    for route in getattr(router, "routes", ()):
        if isinstance(route, Route) and route.matches(scope)[0] is Match.FULL:
            return True
    return False


def announces_body(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() not in ("", "0")


def _no_body() -> Receive:
    """An empty body, then nothing: a response that listens for the client leaving (a file,
    a stream) must not pull the unread body through the server's receive."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # cancelled with the response's listener
        raise AssertionError("unreachable")

    return receive


def _closing(send: Send) -> Send:
    """`send` with `connection: close` on the answer: the server then drops the unread body
    with the connection (a lingering close) instead of reading it to keep the connection."""

    async def send_closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message)["connection"] = "close"
        await send(message)

    return send_closing


class HeadMiddleware:
    """HEAD is answered wherever GET is (RFC 9110 9.3.2): the app routes it as GET, and the
    server (uvicorn, which still sees HEAD) sends the head of the answer without its body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


class ErrorMiddleware:
    """Errors raised by the middleware inside it (admission, the drain) and anything nothing
    else handled: an OpenjevError leaves in the contract's shape with its public message
    (its detail kept for the log, api/operations/disclosure.py); any other exception, a bug,
    is a JSON 500 and one log line (type and frames, no message: it may quote input),
    instead of uvicorn's plain-text 500 and its traceback with the message."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        path, method = scope["path"], scope["method"]
        try:
            await self.app(scope, receive, send_tracked)
        except OpenjevError as exc:
            exc = disclosure.public(exc)
            disclosure.remember(scope, exc)
            await error_response(exc, request_id_of(scope))(scope, receive, send_tracked)
        except Exception as exc:  # a bug: answer JSON, log without the message (it may quote input)
            log.error(
                "unexpected error on %s %s",
                method,
                route_of(path),
                exc_info=exc,
                extra={"fields": {"request_id": request_id_of(scope)}},
            )
            if not started:
                await ErrorResponse(INTERNAL)(scope, receive, send_tracked)
