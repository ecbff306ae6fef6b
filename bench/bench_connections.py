"""Slow clients against a running server: how long half-sent heads, silent connections,
trickled bodies and readers that never read are held, whether connections beyond the bound
are refused at once, and whether a normal client is still served meanwhile. One JSON line.

    openjev serve --port 8000 &            # or any build to compare (e.g. an older commit)
    .venv/bin/python bench/bench_connections.py --url http://127.0.0.1:8000 [--clients 200] [--hold-s 60]
    openjev serve --port 8000 --max-connections 40 &
    .venv/bin/python bench/bench_connections.py --clients 40 --kinds reader --hold-s 30
    .venv/bin/python bench/bench_connections.py --tiny-chunks-mb 1.8   # one body in 1-byte chunks: server CPU

Each slow client is a raw socket: `head` sends half a request head and waits, `silent`
connects and sends nothing, `body` sends a head announcing 1000 bytes and then one byte per
second, `reader` (a 4 KB receive buffer) pipelines four GETs of the 1.5 MB docs bundle and
never reads a byte. A connection is counted closed when the server closes it (or answers
and closes; for `reader`, seen in the socket's TCP state, without reading); one still open
after --hold-s is reported as held for at least that long.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
from urllib.parse import urlsplit

READER_GET = b"GET /static-offline-docs/swagger-ui-bundle.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
TCP_ESTABLISHED = 1  # tcpi_state, the first byte of TCP_INFO (Linux)


async def slow_reader(host: str, port: int, hold_s: float) -> tuple[str, float, bytes]:
    """Pipelines GETs of a large file and never reads; closed when the TCP state leaves ESTABLISHED."""
    t0 = time.monotonic()
    loop = asyncio.get_running_loop()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.setblocking(False)
    try:
        await loop.sock_connect(s, (host, port))
        await loop.sock_sendall(s, READER_GET * 4)
        while time.monotonic() - t0 < hold_s:
            if s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != TCP_ESTABLISHED:
                return "reader", time.monotonic() - t0, b"(dropped by the server)"
            await asyncio.sleep(0.25)
        return "reader", hold_s, b"still open"
    except OSError as e:
        return "reader", time.monotonic() - t0, f"[{type(e).__name__}]".encode()
    finally:
        s.close()


async def slow_client(host: str, port: int, kind: str, hold_s: float) -> tuple[str, float, bytes]:
    if kind == "reader":
        return await slow_reader(host, port, hold_s)
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        return kind, time.monotonic() - t0, f"connect failed: {e}".encode()
    if kind == "head":
        writer.write(b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
    elif kind == "body":
        writer.write(b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 1000\r\n\r\n{")
    got = b""
    deadline = t0 + hold_s
    try:
        while time.monotonic() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 1.0)
            except TimeoutError:
                if kind == "body":
                    writer.write(b" ")
                continue
            if not chunk:
                break
            got += chunk
        else:
            return kind, hold_s, b"still open"
    except (ConnectionError, OSError) as e:
        got += f" [{type(e).__name__}]".encode()
    finally:
        writer.close()
    return kind, time.monotonic() - t0, got.split(b"\r\n", 1)[0]


async def normal_client(host: str, port: int, stop: asyncio.Event, times: list[float]) -> list[float | str]:
    """A new connection and GET /health every half second while the slow clients hold on
    (`times`: when each request started, seconds from the first)."""
    out: list[float | str] = []
    start = time.monotonic()
    while not stop.is_set():
        t0 = time.monotonic()
        times.append(round(t0 - start, 2))
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            line = await asyncio.wait_for(reader.readline(), 10)
            writer.close()
            out.append(round(time.monotonic() - t0, 3) if b" 200 " in line else line.decode().strip())
        except (OSError, TimeoutError) as e:
            out.append(type(e).__name__)
        await asyncio.sleep(0.5)
    return out


async def main(url: str, clients: int, hold_s: float, kinds: list[str]) -> dict:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stop = asyncio.Event()
    t_start = time.monotonic()
    slow = [asyncio.create_task(slow_client(host, port, kinds[i % len(kinds)], hold_s)) for i in range(clients)]
    await asyncio.sleep(0.5)  # the slow clients connect first, as an attacker's would
    started: list[float] = []
    normal = asyncio.create_task(normal_client(host, port, stop, started))
    results = await asyncio.gather(*slow)
    await asyncio.sleep(max(0.0, t_start + hold_s - time.monotonic()))  # the normal client runs the whole hold
    stop.set()
    served = await normal
    report: dict = {"url": url, "clients": clients, "hold_s": hold_s}
    for kind in kinds:
        times = [t for k, t, _ in results if k == kind]
        answers: dict[str, int] = {}
        for k, _, first in results:
            if k == kind:
                answers[first.decode("latin-1")[:40] or "(closed, no answer)"] = (
                    answers.get(first.decode("latin-1")[:40] or "(closed, no answer)", 0) + 1
                )
        report[kind] = {
            "held_s_median": round(statistics.median(times), 2),
            "held_s_max": round(max(times), 2),
            "answers": answers,
        }
    ok = [x for x in served if isinstance(x, float)]
    report["normal_client"] = {
        "requests": len(served),
        "served": len(ok),
        "p50_s": round(statistics.median(ok), 3) if ok else None,
        "first_served_at_s": next((t for t, x in zip(started, served, strict=False) if isinstance(x, float)), None),
        "failures": sorted({str(x) for x in served if not isinstance(x, float)}),
    }
    return report


async def server_cpu_s(host: str, port: int) -> float:
    """The server's process_cpu_seconds_total (/metrics, open on loopback)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode("latin-1")
    writer.close()
    for line in text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    raise RuntimeError("no process_cpu_seconds_total in /metrics")


async def tiny_chunks(url: str, megabytes: float) -> dict:
    """One POST whose body comes in 1-byte chunks (6 wire bytes each): the server's CPU
    seconds and the time until its answer."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    chunks = int(megabytes * 1e6 / 6)
    cpu0 = await server_cpu_s(host, port)
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    sent = 0
    try:
        while sent < chunks:
            n = min(10_000, chunks - sent)
            writer.write(b"1\r\nx\r\n" * n)
            await writer.drain()
            sent += n
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, OSError):
        pass  # refused while sending: the answer is already there
    try:
        line = await asyncio.wait_for(reader.readline(), 300)
    except (ConnectionError, OSError, TimeoutError) as e:
        line = type(e).__name__.encode()
    took = time.monotonic() - t0
    writer.close()
    await asyncio.sleep(0.5)
    return {
        "url": url,
        "chunks_sent": sent,
        "wire_mb_sent": round(sent * 6 / 1e6, 2),
        "answer": line.decode("latin-1").strip(),
        "answer_s": round(took, 2),
        "server_cpu_s": round(await server_cpu_s(host, port) - cpu0, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--kinds", default="head,silent,body", help="comma-separated: head, silent, body, reader")
    parser.add_argument(
        "--tiny-chunks-mb", type=float, default=0.0, help="instead: one body of this many MB in 1-byte chunks"
    )
    args = parser.parse_args()
    if args.tiny_chunks_mb:
        print(json.dumps(asyncio.run(tiny_chunks(args.url, args.tiny_chunks_mb))))
    else:
        print(json.dumps(asyncio.run(main(args.url, args.clients, args.hold_s, args.kinds.split(",")))))
