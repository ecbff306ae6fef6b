"""The parts of the bounded h11 protocol (api/operations/connections.py) that stand alone: the
error answer written before any route is known (in Jev's shape: no format applies yet), h11's
connection with the complete-head bound and the strict framing check, the transport whose
close lingers, and the filter that keeps a flood of refused requests out of the log."""

from __future__ import annotations

import asyncio
import http
import ipaddress
import json
import logging
import socket
import struct
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import h11

from openjev.api.operations.clients import Network
from openjev.api.operations.framing import BodyFraming, LineScanner, check_head
from openjev.api.operations.middleware import REQUEST_ID_HEADER
from openjev.config import ConnectionSettings

WARN_EVERY_S = 10.0  # at most one log line per this many seconds about refused connections


def raw_response(status: int, error_type: str, message: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete HTTP/1.1 error response in the contract's shape, closing the connection."""
    body = json.dumps({"detail": {"error_type": error_type, "message": message}}).encode()
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        f"{REQUEST_ID_HEADER}: req_{uuid.uuid4().hex}",
        *(f"{k}: {v}" for k, v in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class StrictConnection(h11.Connection):
    """h11's server side that also bounds a *complete* head (h11 bounds only an incomplete
    one, so a large head arriving in one read passed), checks framing strictly before h11
    reads the bytes (api/operations/framing.py), reports a complete head, and keeps the protocol error
    it raised (uvicorn's handler gets only a message)."""

    def __init__(self, max_head_bytes: int, max_body_chunks: int, on_head: Any) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.max_body_chunks = max_body_chunks
        self.on_head = on_head
        self.error: h11.RemoteProtocolError | None = None
        self.head = LineScanner()
        self.body = BodyFraming(max_body_chunks)

    def next_event(self) -> Any:
        try:
            self._check_framing()
            event = super().next_event()
            if isinstance(event, h11.Request):
                self.on_head()
                size = len(event.method) + len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > self.max_head_bytes:
                    raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
                check_head(event)
                self.head = LineScanner()  # the next head starts where this one's body ends
                self.body = BodyFraming(self.max_body_chunks)
        except h11.RemoteProtocolError as exc:
            self.error = exc
            raise
        return event

    def _check_framing(self) -> None:
        data = self._receive_buffer._data  # h11's own buffer: checked before h11 consumes it
        if self.their_state is h11.IDLE:
            self.head.scan(data)
        elif self.their_state is h11.SEND_BODY:
            self.body.check(self._reader, data)


class LingeringTransport:
    """The transport uvicorn sees: `close()` becomes the protocol's lingering close."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol

    def close(self) -> None:
        self._protocol.linger_close()

    def is_closing(self) -> bool:
        return self._protocol.closing or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class InvalidRequestThrottle(logging.Filter):
    """uvicorn logs a warning for every request h11 (or our framing check) refuses; a flood of
    bad requests must not flood the log: one line per WARN_EVERY_S (the metrics count them all)."""

    MESSAGE = "Invalid HTTP request received."

    def __init__(self) -> None:
        super().__init__()
        self.last = float("-inf")
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.MESSAGE:
            return True
        now = time.monotonic()
        if now - self.last < WARN_EVERY_S:
            self.dropped += 1
            return False
        self.last = now
        if self.dropped:
            record.msg = f"{self.MESSAGE} ({self.dropped} more since the last such line; see openjev_connections_*)"
            self.dropped = 0
        return True


THROTTLE = InvalidRequestThrottle()


def reset(raw: asyncio.Transport) -> None:
    """Drop the connection with a reset: the kernel discards its unsent copy of the answer
    too, rather than keep it for a reader that does not read."""
    sock = raw.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    raw.abort()


# How long a closing connection keeps reading (and dropping) what its client still sends,
# and how much of it, so that the client reads our answer instead of a reset.
LINGER_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    head_timeout_s: float
    max_head_bytes: int
    send_timeout_s: float
    max_body_chunks: int
    linger_s: float = LINGER_S
    max_per_client: int = 0  # open connections from one peer address (0: no bound)
    proxies: tuple[Network, ...] = ()  # peers that bound spares (api/operations/clients.py)

    @classmethod
    def of(cls, settings: ConnectionSettings, trusted_proxies: Iterable[str] = ()) -> ConnectionLimits:
        return cls(
            settings.max_connections,
            settings.head_timeout_s,
            settings.max_head_bytes,
            settings.send_timeout_s,
            settings.max_body_chunks,
            max_per_client=settings.max_connections_per_client,
            proxies=tuple(ipaddress.ip_network(p, strict=False) for p in trusted_proxies),
        )
