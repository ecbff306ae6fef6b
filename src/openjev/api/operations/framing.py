"""Strict HTTP/1.1 framing, checked on the raw bytes before h11 parses them.

h11 is lenient where a proxy in front of us may not be, and two parsers that split the same
bytes into different requests are what request smuggling needs. So a request is refused
(400 and the connection closed, api/operations/connections.py) when its head or body framing is one
that RFC 9112 lets a server reject and that no honest client sends:

- Content-Length together with Transfer-Encoding (RFC 9112 6.3: a smuggling shape);
- a line that ends in a bare LF, or holds a bare CR (RFC 9112 2.2);
- obsolete line folding, a header line starting with a space or tab (RFC 9112 5.2);
- a chunk-size line that is not hex digits and well-formed extensions (`2 `, `0x2`, `+2`);
- a chunk-size line or trailer that never ends (bounded), and more chunks per body than
  --max-body-chunks (each chunk costs parser work: tiny chunks made 1.8 MB cost 5.3 s).

Every message here is ours, never a quote of the input.

The checks read h11's receive buffer and its chunked reader's state (private attributes of
h11, pinned in requirements.lock): they run before h11 consumes the bytes, and each byte of
a head is looked at once however it is split across reads.
"""

from __future__ import annotations

import re
from typing import Any

import h11
from h11._readers import ChunkedReader

MAX_CHUNK_LINE = 1024  # bytes of a chunk-size line with its extensions (ours; none legitimate are near it)

BARE_LF = "a line of the request ends in a bare LF (HTTP/1.1 lines end in CRLF)"
BARE_CR = "a line of the request holds a bare CR"
OBS_FOLD = "a header line starts with whitespace (obsolete line folding is not accepted)"
CL_AND_TE = (
    "the request has both Content-Length and Transfer-Encoding (RFC 9112 6.3: refused as a request-smuggling shape)"
)
BAD_CHUNK = "malformed chunk-size line in the chunked body (expected hex digits, optional extensions, CRLF)"
WEBSOCKET = "WebSocket upgrades are not served here (this server speaks plain HTTP/1.1)"

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
CHUNK_LINE = re.compile(
    rb"[0-9A-Fa-f]{1,16}(?:[ \t]*;[ \t]*" + _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?)*\r\n"
)


class FramingError(h11.RemoteProtocolError):
    """A request refused for its framing. `public` is what the client is told (never a quote
    of the input); `counter` names the connection metric it counts in."""

    def __init__(self, public: str, status: int = 400, counter: str = "parse_errors") -> None:
        super().__init__(public, error_status_hint=status)
        self.public = public
        self.counter = counter


class LineScanner:
    """Checks a head (or a chunked body's trailer) line by line as its bytes arrive: CRLF
    endings, no bare CR, no obs-fold. `pos` is where the next unchecked line starts, so each
    byte is scanned once however the head is split across reads."""

    def __init__(self, lines: int = 0) -> None:
        self.pos = 0
        self.lines = lines  # non-empty lines seen: a trailer starts after the chunk line, i.e. at 1
        self.done = False

    def scan(self, data: bytearray) -> None:
        """Raise FramingError at the first bad line of `data`; set `done` at the blank line ending it."""
        while not self.done:
            end = data.find(b"\n", self.pos)
            if end < 0:
                return
            if end == 0 or data[end - 1] != 0x0D:
                raise FramingError(BARE_LF)
            if data.find(b"\r", self.pos, end - 1) >= 0:
                raise FramingError(BARE_CR)
            if end - 1 == self.pos:  # an empty line
                if self.lines:
                    self.done = True  # the end of the head (leading empty lines are ignored, RFC 9112 2.2)
            elif self.lines and data[self.pos] in (0x20, 0x09):
                raise FramingError(OBS_FOLD)
            else:
                self.lines += 1
            self.pos = end + 1


def check_head(event: h11.Request) -> None:
    """What only the parsed head tells: CL together with TE; a WebSocket upgrade."""
    names = {name for name, _ in event.headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        raise FramingError(CL_AND_TE)
    if b"upgrade" in names and any(
        name == b"upgrade" and b"websocket" in value.lower() for name, value in event.headers
    ):
        raise FramingError(WEBSOCKET, counter="upgrades_refused")


class BodyFraming:
    """The chunked body of one request: each chunk-size line checked before h11 reads it, and
    the chunks counted against `max_chunks`."""

    def __init__(self, max_chunks: int) -> None:
        self.max_chunks = max_chunks
        self.chunks = 0
        self.trailer: LineScanner | None = None

    def check(self, reader: Any, data: bytearray) -> None:
        if not isinstance(reader, ChunkedReader):
            return
        # After a chunk's data h11 first drops its CRLF, then reads the next chunk-size line
        # in the same call: that line starts after the CRLF still to be dropped.
        start = len(reader._bytes_to_discard)
        if reader._reading_trailer and not start:
            if self.trailer is None:
                self.trailer = LineScanner(lines=1)
            self.trailer.scan(data)
            if not self.trailer.done and len(data) > MAX_CHUNK_LINE * 8:
                raise FramingError("the chunked body's trailer does not end")
            return
        if reader._bytes_in_chunk or reader._reading_trailer:
            return
        end = data.find(b"\n", start, start + MAX_CHUNK_LINE)
        if end < 0:
            if len(data) >= start + MAX_CHUNK_LINE:
                raise FramingError(BAD_CHUNK)
            return  # the line is not complete yet
        if CHUNK_LINE.fullmatch(data, start, end + 1) is None:
            raise FramingError(BAD_CHUNK)
        self.chunks += 1
        if self.chunks > self.max_chunks:
            raise FramingError(
                f"the request body arrives in more than {self.max_chunks} chunks (--max-body-chunks); "
                "send it in fewer, larger chunks or with Content-Length",
                status=413,
            )
