"""Connection-level limits, below the ASGI app: uvicorn's h11 protocol with

- a bound on open connections: one beyond it is answered 503 (JSON, Retry-After) at once
  and closed, before anything is read, so refusing costs no more than accepting;
- a time limit on the request head (request line and headers): armed when a connection
  opens and when the first byte of a keep-alive request arrives, cancelled when the head
  is complete; past it a partial head is answered 408 and an idle connection just closed;
- a size limit on the head, complete or not (h11 bounds only an incomplete one): 431;
- a send timeout: a response the client stops reading (the write buffer above its high-water
  mark with no progress for --send-timeout-s) drops the connection, counted as a slow
  reader; so does a closed connection whose unread answer is still buffered after it;
- strict framing (api/operations/framing.py): smuggling shapes, bare LF, obs-fold, malformed chunk
  sizes and too many chunks are answered 400 (413) and the connection closed; a WebSocket
  upgrade is refused the same way (nothing of it reaches the app);
- a lingering close: when the server closes a connection whose client may still be
  sending (a 431, 408 or 413 answered before the request was read), it shuts its own
  side, then reads and drops what still arrives for a moment before closing. Closing a
  socket with unread input makes the kernel send a reset, which destroys the answer
  the client had not read yet (a 256 KB header used to end in "connection reset").

uvicorn has no head timeout of its own (`timeout_keep_alive` covers only idle
keep-alive connections), and its `limit_concurrency` answers 503 only once a complete
head arrived, so it does not bound connections that never send one. The body's time
limit sits in api/operations/middleware.py (BodyMiddleware), where the body is read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from openjev.api.operations.clients import PerClient
from openjev.api.operations.framing import FramingError
from openjev.api.operations.h11_parts import (
    WARN_EVERY_S,
    ConnectionLimits,
    LingeringTransport,
    StrictConnection,
    raw_response,
    reset,
)

log = logging.getLogger(__name__)

# How much a closing connection reads (and drops) of what its client still sends.
LINGER_BYTES = 1 << 20

# Per server, since start (exposed as openjev_connections_<name>_total; open as a gauge).
COUNTS = ("refused", "head_timeouts", "heads_too_large", "slow_readers", "parse_errors", "upgrades_refused")


class BoundedH11Protocol(H11Protocol):
    limits: ConnectionLimits  # set per server by http_protocol()
    refusing: int  # connections being refused right now (lingering), per server
    warned_at: float
    counts: dict[str, int]
    per_client: PerClient  # open connections by peer address
    open_connections = 0

    @classmethod
    def stats(cls) -> dict[str, float]:
        """For /metrics (api/server/operator_state.py reads it at scrape time, once handed over by uvicorn_config)."""
        return {"connections_open": cls.open_connections, **{f"connections_{k}": v for k, v in cls.counts.items()}}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h11 = StrictConnection(self.limits.max_head_bytes, self.limits.max_body_chunks, self._head_complete)
        self.conn = self.h11
        self.raw: asyncio.Transport | None = None
        self.closing = False
        self.awaiting_head = True
        self.shutting_down = False
        self.head_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None
        self.send_timer: asyncio.TimerHandle | None = None
        self.dropped = 0
        self.counted_refusal = False
        self.counted_open = False
        self.counted_host: str | None = None  # the peer address counted in per_client

    # ---- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.raw = transport
        proxy: Any = LingeringTransport(transport, self)
        if len(self.connections) >= self.limits.max_connections:
            self._refuse(proxy, f"the server has {self.limits.max_connections} connections open (its limit)")
            return
        admitted, self.counted_host = self.per_client.enter(transport.get_extra_info("peername"))
        if not admitted:
            self._refuse(proxy, f"this client has {self.limits.max_per_client} connections open (its limit)")
            return
        super().connection_made(proxy)
        type(self).open_connections += 1
        self.counted_open = True
        self._arm_head_timer()

    def _refuse(self, proxy: Any, why: str) -> None:
        if self.raw is None:  # connection_made sets it before calling here
            return
        cls = type(self)
        self.transport = proxy  # what connection_lost closes; the refused one is never counted
        cls.counts["refused"] += 1
        if cls.refusing >= self.limits.max_connections:  # a flood: no answer, no linger
            self.closing = True
            self.raw.close()
            return
        cls.refusing += 1
        self.counted_refusal = True
        now = self.loop.time()
        if now - cls.warned_at >= WARN_EVERY_S:  # a flood must not flood the log too
            cls.warned_at = now
            log.warning(
                "connections refused: %s (--max-connections, --max-connections-per-client), %d refused so far",
                why,
                cls.counts["refused"],
            )
        self.raw.write(
            raw_response(
                503,
                "overloaded",
                f"{why}; retry shortly",
                (("retry-after", "1"),),
            )
        )
        self.linger_close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted_open:
            type(self).open_connections -= 1
            self.counted_open = False
        self.per_client.leave(self.counted_host)
        self.counted_host = None
        self._cancel_head_timer()
        self._cancel_send_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None
        if self.counted_refusal:
            type(self).refusing -= 1
            self.counted_refusal = False
        self.closing = True
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.closing:  # lingering: drop what the client still sends
            self.dropped += len(data)
            if self.dropped > LINGER_BYTES and self.raw is not None:
                self.raw.close()
            return
        if self.awaiting_head and self.head_timer is None:
            self._arm_head_timer()  # the first byte of a keep-alive request
        super().data_received(data)

    def on_response_complete(self) -> None:
        self.awaiting_head = True  # before super(): it may parse a pipelined head at once
        super().on_response_complete()
        if self.awaiting_head and self.head_timer is None and not self.closing and self.conn.trailing_data[0]:
            self._arm_head_timer()  # part of the next head is already here

    def shutdown(self) -> None:
        self.shutting_down = True  # idle connections at shutdown: no lingering
        if self.closing:  # answered by us (h11 may be mid-request): just close
            if self.raw is not None:
                self.raw.close()
            return
        super().shutdown()

    # ---- the head

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_complete(self) -> None:
        self.awaiting_head = False
        self._cancel_head_timer()

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.closing or not self.awaiting_head or self.raw is None or self.raw.is_closing():
            return
        self.counts["head_timeouts"] += 1
        if not self.conn.trailing_data[0]:  # nothing sent: nothing to answer, nothing unread
            self.closing = True
            self.raw.close()
            return
        log.debug("request head not complete within %g s: 408, connection closed", self.limits.head_timeout_s)
        self.raw.write(
            raw_response(408, "timeout", f"the request head did not arrive within {self.limits.head_timeout_s:g} s")
        )
        self.linger_close()

    def timeout_keep_alive_handler(self) -> None:
        """An idle keep-alive connection: closed at once (nothing unread, no answer to protect)."""
        if self.raw is not None and not self.raw.is_closing() and not self.closing:
            self.closing = True
            self._close_raw()

    def send_400_response(self, msg: str) -> None:  # noqa: ARG002 - uvicorn's signature; our own message is sent
        """h11 (or our framing check) refused the request: a JSON answer that names the
        problem without quoting the input, then a lingering close."""
        error = self.h11.error
        if self.raw is None:  # no transport: nothing to answer on
            return
        if error is not None and error.error_status_hint == 431:
            self.counts["heads_too_large"] += 1
            response = raw_response(
                431,
                "invalid_request",
                f"the request head (request line and headers) exceeds {self.limits.max_head_bytes} bytes",
            )
        elif isinstance(error, FramingError):
            self.counts[error.counter] += 1
            status = error.error_status_hint
            kind = "payload_too_large" if status == 413 else "invalid_request"
            response = raw_response(status, kind, error.public)
        else:  # h11's message may quote the input: not echoed
            self.counts["parse_errors"] += 1
            response = raw_response(400, "invalid_request", "invalid HTTP request")
        log.debug("request refused by the HTTP parser: %s", response.split(b"\r\n", 1)[0].decode("latin-1"))
        self.raw.write(response)
        self.linger_close()

    # ---- the response: slow readers

    def pause_writing(self) -> None:
        """The write buffer passed its high-water mark: the client must read within the send timeout."""
        if self.flow is not None:  # None on a refused connection (never handed to uvicorn)
            super().pause_writing()
        if self.send_timer is None and not self.closing:
            self.send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_timed_out)

    def resume_writing(self) -> None:
        self._cancel_send_timer()
        if self.flow is not None:
            super().resume_writing()

    def _cancel_send_timer(self) -> None:
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _send_timed_out(self) -> None:
        """The client read nothing of what we sent for the send timeout: dropped (abort: the
        unread answer is discarded, not kept for a reader that does not read)."""
        self.send_timer = None
        raw = self.raw
        if raw is None:
            return
        self.counts["slow_readers"] += 1
        log.info("response not read within %g s (--send-timeout-s): connection dropped", self.limits.send_timeout_s)
        self.closing = True
        reset(raw)

    def _close_raw(self) -> None:
        """Close; an answer still buffered (the client is not reading it) gets the send timeout
        to leave, then the connection is dropped (close() alone would wait for it for ever)."""
        raw = self.raw
        if raw is None:
            return
        raw.close()
        if raw.get_write_buffer_size() and self.send_timer is None:
            self.send_timer = self.loop.call_later(self.limits.send_timeout_s, self._send_timed_out)

    # ---- closing

    def linger_close(self) -> None:
        """Close our side, read and drop what the client still sends for a moment, then close."""
        raw = self.raw
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        if raw is None or raw.is_closing() or self.linger_timer is not None:
            self.closing = True
            return
        self.closing = True
        if self.shutting_down or not raw.can_write_eof():
            self._close_raw()
            return
        try:
            raw.write_eof()
            raw.resume_reading()
        except (OSError, RuntimeError):
            self._close_raw()
            return
        self.linger_timer = self.loop.call_later(self.limits.linger_s, self._close_raw)
