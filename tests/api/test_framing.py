"""Hardening round two, the HTTP layer (issue 16, findings 2, 6 and part of 11), over real
sockets against a real uvicorn on loopback serving the app (the server's own protocol,
api/operations/connections.py), with a fake engine whose recorded plans show what reached it.

Each test asserts the status, a message naming the problem, that nothing reached the
engine, and that the next valid request is answered."""

from __future__ import annotations

import socket
import time

import httpx

from tests.api.test_connections import BODY, connect, metric, parse, read_until_closed, serving
from tests.support.fakes import FakeEngine

BUNDLE = "/static-offline-docs/swagger-ui-bundle.js"
POST_HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"


def refused(port: int, raw: bytes) -> tuple[int, dict[str, str], dict]:
    """Send `raw` whole, read until the server closes: the answer, which must close."""
    s = connect(port)
    s.sendall(raw)
    status, headers, body = parse(read_until_closed(s)[0])
    assert headers["connection"] == "close" and headers["x-typesafe-request-id"].startswith("req_"), headers
    return status, headers, body


def still_served(url: str, engine: FakeEngine, before: int) -> None:
    """The next valid request is answered, and it is the only one that reached the engine."""
    r = httpx.post(url + "/v1/systemone", content=BODY, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text
    assert len(engine.plans) == before + 1


def chunked(body: bytes, size: int) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size))
    return out + b"0\r\n\r\n"


# ---- finding 6: strict framing


def test_content_length_with_transfer_encoding_is_a_400_and_a_close():
    """RFC 9112 6.3. On main the connection stayed open and the smuggled request got its own answer."""
    engine = FakeEngine()
    with serving(engine) as (url, port):
        smuggled = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        body = chunked(BODY.encode(), 64)
        raw = POST_HEAD + b"content-length: %d\r\ntransfer-encoding: chunked\r\n\r\n" % len(body) + body + smuggled
        s = connect(port)
        s.sendall(raw)
        got, _ = read_until_closed(s)
        assert got.count(b"HTTP/1.1 ") == 1, got  # one answer; the smuggled request is never read
        status, headers, answer = parse(got)
        assert status == 400 and headers["connection"] == "close"
        assert answer["detail"]["error_type"] == "invalid_request"
        assert "Content-Length and Transfer-Encoding" in answer["detail"]["message"]
        assert engine.plans == []
        assert metric(url, "openjev_connections_parse_errors_total") == 1
        still_served(url, engine, 0)


def test_obs_fold_bare_lf_bare_cr_and_bad_chunk_sizes_are_400s_that_name_the_problem():
    engine = FakeEngine()
    body = BODY.encode()
    cases = {
        "obsolete line folding": POST_HEAD.replace(b"content-type: application/json\r\n", b"")
        + b"transfer-encoding:\r\n chunked\r\ncontent-type: application/json\r\n\r\n"
        + chunked(body, 64),
        "bare LF": b"POST /v1/systemone HTTP/1.1\nHost: 127.0.0.1\ncontent-type: application/json\n"
        b"content-length: %d\n\n" % len(body) + body,
        "bare CR": POST_HEAD + b"x-a: b\rc\r\ncontent-length: %d\r\n\r\n" % len(body) + body,
        "malformed chunk-size": POST_HEAD + b"transfer-encoding: chunked\r\n\r\n"
        b"%x \r\n%s\r\n0\r\n\r\n" % (len(body), body),
    }
    bad_sizes = [b"0x%x" % len(body), b"+%x" % len(body), b"%x\t" % len(body), b"%x;" % len(body)]
    with serving(engine) as (url, port):
        for name, raw in cases.items():
            status, _, answer = refused(port, raw)
            assert status == 400 and name in answer["detail"]["message"], (name, answer)
        for size in bad_sizes:
            raw = POST_HEAD + b"transfer-encoding: chunked\r\n\r\n" + size + b"\r\n" + body + b"\r\n0\r\n\r\n"
            status, _, answer = refused(port, raw)
            assert status == 400 and "chunk-size" in answer["detail"]["message"], size
        assert engine.plans == []
        assert metric(url, "openjev_connections_parse_errors_total") == len(cases) + len(bad_sizes)
        still_served(url, engine, 0)
        # well-formed chunked bodies (with an extension, in many pieces) are served
        raw = (
            POST_HEAD
            + b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            + chunked(body, 16).replace(b"\r\n", b';ext="v"\r\n', 1)
        )
        s = connect(port)
        s.sendall(raw)
        assert parse(read_until_closed(s)[0])[0] == 200
        assert len(engine.plans) == 2


def test_a_body_in_more_chunks_than_the_bound_is_refused_while_it_arrives():
    """Tiny chunks cost parser work per chunk (1.8 MB in 1-byte chunks took 5.3 s of CPU)."""
    engine = FakeEngine()
    with serving(engine, max_body_chunks=100) as (url, port):
        s = connect(port)
        s.sendall(POST_HEAD + b"transfer-encoding: chunked\r\n\r\n")
        got = b""
        s.settimeout(5)
        try:
            for _ in range(20_000):  # 1-byte chunks until the server answers; far fewer are read
                s.sendall(b"1\r\n \r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        got, _ = read_until_closed(s)
        status, headers, answer = parse(got)
        assert status == 413 and answer["detail"]["error_type"] == "payload_too_large", answer
        assert "more than 100 chunks" in answer["detail"]["message"] and headers["connection"] == "close"
        assert engine.plans == []
        still_served(url, engine, 0)
        # 100 chunks are within the bound
        raw = (
            POST_HEAD
            + b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            + chunked(BODY.encode(), 1 + len(BODY) // 100)
        )
        s = connect(port)
        s.sendall(raw)
        assert parse(read_until_closed(s)[0])[0] == 200


# ---- finding 2: slow readers


def _slow_reader(port: int, requests: int = 4) -> socket.socket:
    """A client that pipelines GETs of the largest static file and never reads."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {BUNDLE} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode() * requests)
    return s


def test_a_normal_client_is_served_while_slow_readers_hold_every_connection():
    """40 sockets pipeline four GETs of a 1.5 MB file each and never read, with
    --max-connections 40. On main every other client got 503 for as long as they held on."""
    engine = FakeEngine()
    with serving(engine, max_connections=40, send_timeout_s=1.0) as (url, port):
        readers = [_slow_reader(port) for _ in range(40)]
        try:
            t0 = time.monotonic()
            statuses = []
            while time.monotonic() - t0 < 20:
                try:
                    r = httpx.get(url + "/health", timeout=5)
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        break
                    assert r.status_code == 503 and r.json()["detail"]["error_type"] == "overloaded"
                except httpx.TransportError as e:
                    statuses.append(type(e).__name__)
                time.sleep(0.2)
            took = time.monotonic() - t0
            assert statuses[-1] == 200, statuses
            assert took < 10, took  # the send timeout (1 s) plus margin for a loaded machine
            with httpx.Client(base_url=url, timeout=10) as client:
                for _ in range(100):  # every reader dropped, each counted once
                    if metric(url, "openjev_connections_slow_readers_total", client) >= 40:
                        break
                    time.sleep(0.1)
                assert metric(url, "openjev_connections_slow_readers_total", client) == 40
                # dropped with a reset: the kernel's unsent copy is gone too (the TCP state, read without reading)
                assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != 1 for s in readers)
                assert metric(url, "openjev_connections_open", client) == 1  # this client's own
                assert client.get("/v1/limits").json()["send_timeout_s"] == 1.0
            assert engine.plans == []
            still_served(url, engine, 0)
        finally:
            for s in readers:
                s.close()


def test_a_reader_that_reads_slowly_but_steadily_is_served_in_full():
    """The send timeout bounds a stall, not the length of a download."""
    with serving(send_timeout_s=1.0) as (url, port):
        s = _slow_reader(port, requests=1)
        s.settimeout(10)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
        length = int(parse(got.split(b"\r\n\r\n")[0] + b"\r\n\r\n")[1]["content-length"])
        need = len(got.split(b"\r\n\r\n", 1)[0]) + 4 + length
        while len(got) < need:  # 64 KB every 0.3 s: slow, but never stalled for the timeout
            chunk = s.recv(65536)
            assert chunk, f"closed after {len(got)} of {need} bytes"
            got += chunk
            time.sleep(0.3 * len(chunk) / 65536)
        assert len(got) == need
        assert metric(url, "openjev_connections_slow_readers_total") == 0


def test_docs_assets_need_the_key_on_a_keyed_server():
    """The largest responses the server has were open to anyone, key or not."""
    with serving(api_keys=("k1",)) as (url, _):
        r = httpx.get(url + BUNDLE)
        assert r.status_code == 401 and r.json()["detail"]["error_type"] == "authentication_error"
        assert httpx.get(url + BUNDLE, headers={"authorization": "Bearer k1"}).status_code == 200
    with serving(api_keys=("k1",), docs="public") as (url, _):
        assert httpx.get(url + BUNDLE).status_code == 200


# ---- finding 11: upgrades, bodies nobody reads, HEAD


def test_a_websocket_upgrade_is_refused_without_leaking_the_connection_gauge():
    """On main uvicorn took the connection over (wsproto): the gauge never came down and the
    Host check was skipped (the app saw a "websocket" scope, which our middleware passes)."""
    engine = FakeEngine()
    with serving(engine) as (url, port):
        with httpx.Client(base_url=url, timeout=10) as client:
            before = metric(url, "openjev_connections_open", client)
            for host in (b"127.0.0.1", b"evil.example"):
                status, _, answer = refused(
                    port,
                    b"GET /v1/systemone HTTP/1.1\r\nHost: " + host + b"\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\n\r\n",
                )
                assert status == 400 and "WebSocket" in answer["detail"]["message"], answer
            for _ in range(50):
                if metric(url, "openjev_connections_open", client) == before:
                    break
                time.sleep(0.1)
            assert metric(url, "openjev_connections_open", client) == before
            assert metric(url, "openjev_connections_upgrades_refused_total", client) == 2
        assert engine.plans == []
        still_served(url, engine, 0)


def test_bodies_on_unknown_paths_and_wrong_methods_are_refused_before_they_are_read():
    """Only the head is sent: the 404/405 comes without the 2 MB body (on main the server
    waited for the body, up to the body timeout)."""
    engine = FakeEngine()
    with serving(engine) as (url, port):
        cases = [
            (b"POST /v1/nope", 404, "no route"),
            (b"POST /health", 405, "method POST is not allowed"),
            (b"PUT /v1/systemone", 405, "method PUT is not allowed"),
            (b"POST /static-offline-docs/swagger-ui.css", 405, "method POST is not allowed"),
        ]
        for line, expected, message in cases:
            s = connect(port)
            s.sendall(line + b" HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 2097152\r\n\r\n" + b"x" * 1000)
            got, took = read_until_closed(s, 5.0)
            status, headers, answer = parse(got)
            assert status == expected and message in answer["detail"]["message"], (line, answer)
            assert headers["connection"] == "close" and took < 4.0, (line, took)
        assert engine.plans == []
        still_served(url, engine, 0)


def test_head_is_answered_wherever_get_is():
    engine = FakeEngine()
    with serving(engine) as (url, _):
        with httpx.Client(base_url=url, timeout=10) as client:
            for path in ("/health", "/health/live", "/v1/models", "/v1/limits", "/metrics", "/", BUNDLE):
                got = client.get(path)
                head = client.head(path)
                assert head.status_code == got.status_code == 200, path
                assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"], path
            assert client.head("/v1/nope").status_code == 404
            assert client.head("/v1/systemone").status_code == 405
        assert engine.plans == []
        still_served(url, engine, 0)


# ---- finding 11: strict gzip and zstd request bodies


def _post_encoded(url: str, body: bytes, encoding: str) -> httpx.Response:
    headers = {"content-type": "application/json", "content-encoding": encoding}
    return httpx.post(url + "/v1/systemone", content=body, headers=headers, timeout=10)


def test_every_gzip_member_and_zstd_frame_is_decoded():
    """On main a second gzip member was dropped (the body read as its first member only)."""
    import gzip

    import zstandard

    body = BODY.encode()
    half = len(body) // 2
    engine = FakeEngine()
    with serving(engine) as (url, _):
        two_members = gzip.compress(body[:half]) + gzip.compress(body[half:])
        assert _post_encoded(url, two_members, "gzip").status_code == 200
        cctx = zstandard.ZstdCompressor()
        two_frames = cctx.compress(body[:half]) + cctx.compress(body[half:])
        assert _post_encoded(url, two_frames, "zstd").status_code == 200
        assert len(engine.plans) == 2
        # a member that splits the JSON elsewhere is still one body: dropping the second would be a 400/422
        r = _post_encoded(url, gzip.compress(body[:10]) + gzip.compress(body[10:]), "gzip")
        assert r.status_code == 200, r.text


def test_trailing_data_and_truncation_are_refused_saying_which():
    """On main trailing garbage was ignored and a truncated zstd frame read as an empty body."""
    import gzip

    import zstandard

    body = BODY.encode()
    gz = gzip.compress(body)
    zs = zstandard.ZstdCompressor().compress(body)
    cases = [
        (gz + b"garbage!", "gzip", "8 bytes of trailing data after its last member"),
        (gz + b"\0\0\0\0", "gzip", "trailing data"),
        (gz[:-6], "gzip", "gzip body is truncated"),
        (zs + b"garbage!", "zstd", "8 bytes of trailing data after its last frame"),
        (zs[:-3], "zstd", "zstd body is truncated"),
        (zs[:6], "zstd", "zstd body is truncated"),
    ]
    engine = FakeEngine()
    with serving(engine) as (url, _):
        for raw, encoding, message in cases:
            r = _post_encoded(url, raw, encoding)
            assert r.status_code == 400, (encoding, message, r.text)
            assert r.json()["detail"]["error_type"] == "invalid_request"
            assert message in r.json()["detail"]["message"], (message, r.json())
        assert engine.plans == []
        still_served(url, engine, 0)


def test_a_zstd_bomb_is_refused_without_decoding_it_whole():
    import zstandard

    bomb = zstandard.ZstdCompressor(level=3).compress(b" " * (64 << 20))  # 64 MiB of spaces, a few KB
    engine = FakeEngine()
    with serving(engine) as (url, _):
        r = _post_encoded(url, bomb, "zstd")
        assert r.status_code == 413 and "decoded request body exceeds" in r.json()["detail"]["message"]
        assert engine.plans == []
        still_served(url, engine, 0)


# ---- finding 11: X-Forwarded-For only from --trusted-proxies


def _metrics_status(port: int, forwarded_for: bytes | None) -> tuple[int, dict]:
    header = b"X-Forwarded-For: " + forwarded_for + b"\r\n" if forwarded_for is not None else b""
    s = connect(port)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + header + b"\r\n")
    raw, _ = read_until_closed(s)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, (__import__("json").loads(body) if status != 200 else {})


def test_forwarded_for_is_believed_only_from_trusted_proxies():
    """On main a loopback peer's X-Forwarded-For was believed (uvicorn trusts 127.0.0.1): a
    same-host proxy passing the header on made any client local, and /metrics open."""
    engine = FakeEngine()
    with serving(engine, api_keys=("k1",)) as (url, port):
        assert _metrics_status(port, None)[0] == 200  # a local client, no proxy
        status, answer = _metrics_status(port, b"127.0.0.1")  # forwarded, by no proxy we trust
        assert status == 401 and answer["detail"]["error_type"] == "authentication_error"
        assert "missing API key" in answer["detail"]["message"]
        assert _metrics_status(port, b"203.0.113.7")[0] == 401
        assert engine.plans == []
    with serving(engine, api_keys=("k1",), trusted_proxies=("127.0.0.1",)) as (url, port):
        assert _metrics_status(port, b"127.0.0.1")[0] == 200  # the proxy forwards for a local client
        assert _metrics_status(port, b"203.0.113.7")[0] == 401
        assert _metrics_status(port, b"127.0.0.1, 203.0.113.7")[0] == 401  # the client is the rightmost untrusted
        assert _metrics_status(port, b"203.0.113.7, 127.0.0.1")[0] == 401  # trusted hops are skipped
        assert _metrics_status(port, b"not-an-address")[0] == 401
        assert _metrics_status(port, None)[0] == 401  # through the proxy, for an unknown client
        assert engine.plans == []
        r = httpx.post(
            url + "/v1/systemone",
            content=BODY,
            headers={"content-type": "application/json", "authorization": "Bearer k1"},
            timeout=10,
        )
        assert r.status_code == 200 and len(engine.plans) == 1


def test_a_body_sent_with_a_get_is_not_read_and_the_connection_closes_after_the_answer():
    engine = FakeEngine()
    with serving(engine) as (url, port):
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 2097152\r\n\r\n" + b"x" * 1000)
        got, took = read_until_closed(s, 5.0)
        status, headers, _ = parse(got)
        assert status == 200 and headers["connection"] == "close" and took < 4.0, (status, took)
        # without a body, a GET keeps its connection
        with httpx.Client(base_url=url, timeout=10) as client:
            r = client.get("/health")
            assert r.status_code == 200 and r.headers.get("connection") != "close"
        still_served(url, engine, 0)


def test_a_flood_of_bad_requests_logs_one_line_not_one_per_request():
    """uvicorn warns once per refused request; on main 20 bad requests were 20 log lines."""
    import logging

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "Invalid HTTP request" in record.getMessage():
                seen.append(record.getMessage())

    engine = FakeEngine()
    handler = Collect()
    with serving(engine) as (url, port):
        logging.getLogger("uvicorn.error").addHandler(handler)
        try:
            for _ in range(20):
                refused(port, b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n")
        finally:
            logging.getLogger("uvicorn.error").removeHandler(handler)
        assert len(seen) <= 1, seen  # one per 10 s (none if another test's came just before)
        assert metric(url, "openjev_connections_parse_errors_total") == 20  # every one counted
        still_served(url, engine, 0)
