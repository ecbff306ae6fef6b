"""API overhead: the real app (uvicorn, middleware, validation, the prompt compiler with the
embedded model's real tokenizer, JSON encoding) in front of InstantEngine, a named fake
engine that answers at once. On a GPU a decision takes ~20 ms, so every millisecond of API
work shows. One JSON line:

- `one_client`: p50/p99 latency of sequential requests over one keep-alive connection;
- `clients_64`: requests/s with 64 concurrent connections;
- `in_process`: p50/p99 of the app called directly as ASGI (no HTTP, no client): the
  server's own code;
- `split_us`: the server's steps timed in-process on the same request (median of many):
  JSON parse + validation, wire -> core conversion, compile (tokenize, plan), answer ->
  wire, and JSON encoding with the stdlib and with orjson.

The client is a minimal asyncio HTTP/1.1 client in another process (pre-encoded requests),
so client cost stays small; both share the machine's cores.

    .venv/bin/python bench/bench_api.py [--requests 400] [--concurrent-requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from openjev.config import EMBEDDED_MODEL
from openjev.core.ports import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine

REQUEST = {  # the README's example: a short ticket, 3 questions (one of each type)
    "model": "jev-latest",
    "state": "Hi, I was charged twice for order #1234 and I want my money back today.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "department": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "Payments, charges and refunds", "technical": "Bugs in the app"},
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["Routine", "Urgent", "Emergency"],
        },
    },
}


class InstantEngine(Engine):
    """A fake engine: answers every plan at once with fixed log-probs (no model work)."""

    parallel_layouts = False

    async def run(self, plan):
        from openjev.core.ports import BranchResult, PlanResult

        return PlanResult(
            branches=tuple(BranchResult(tuple(-1.0 - 0.1 * i for i in range(len(b.label_ids)))) for b in plan.branches),
            computed_tokens=plan.unique_tokens,
            cached_tokens=0,
        )

    async def close(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}  # nothing kept between requests


def _loaded_with_instant_engine():
    """The embedded model's real tokenizer and card, with InstantEngine in place of the model."""
    import dataclasses

    from openjev.config import load_settings
    from openjev.engines import load_engine

    loaded = load_engine(load_settings({"engine": "transformers", "model": EMBEDDED_MODEL}, environ={}))
    asyncio.run(loaded.engine.close())
    return dataclasses.replace(loaded, engine=InstantEngine())


def serve(port: int) -> None:
    import uvicorn

    from openjev.api.server.app import create_app
    from openjev.config import load_settings

    loaded = _loaded_with_instant_engine()
    _quiet_logs()
    settings = load_settings({"port": port, "max_in_flight": 4096}, environ={})
    app = create_app(settings, loader=lambda _settings: loaded)
    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False, log_level="warning")


def _quiet_logs() -> None:
    try:
        from openjev.api.operations import logs
    except ImportError:  # a version before api/operations/logs.py (side-by-side runs)
        import logging

        logging.basicConfig(level=logging.WARNING)
        return
    logs.configure("warning", "text")


# ---- the client


def _raw_request(body: bytes) -> bytes:
    return (
        b"POST /v1/systemone HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def _exchange(reader, writer, raw: bytes) -> int:
    writer.write(raw)
    status_line = await reader.readline()
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return int(status_line.split()[1])


async def one_client(port: int, n: int) -> dict:
    raw = _raw_request(json.dumps(REQUEST).encode())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    for i in range(n + 50):
        t0 = time.perf_counter()
        status = await _exchange(reader, writer, raw)
        assert status == 200, status
        if i >= 50:  # warm-up excluded
            times.append((time.perf_counter() - t0) * 1000)
    writer.close()
    times.sort()
    return {
        "requests": n,
        "p50_ms": round(statistics.median(times), 3),
        "p99_ms": round(times[int(0.99 * (len(times) - 1))], 3),
    }


async def many_clients(port: int, clients: int, total: int) -> dict:
    raw = _raw_request(json.dumps(REQUEST).encode())
    left = [total]

    async def client():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while left[0] > 0:
            left[0] -= 1
            assert await _exchange(reader, writer, raw) == 200
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return {"clients": clients, "requests": total, "requests_per_s": round(total / (time.perf_counter() - t0), 1)}


# ---- the app in-process (no HTTP, no client): what the server's own code costs


def in_process(n: int = 400) -> dict:
    from openjev.api.server.app import create_app
    from openjev.config import load_settings

    loaded = _loaded_with_instant_engine()
    app = create_app(load_settings({"max_in_flight": 4096}, environ={}), loader=lambda _settings: loaded)
    body = json.dumps(REQUEST).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/systemone",
        "raw_path": b"/v1/systemone",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }

    async def call() -> None:
        sent, pending = [], [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if pending:
                return pending.pop()
            await asyncio.sleep(3600)  # no disconnect

        async def send(message):
            sent.append(message)

        await app(dict(scope), receive, send)
        assert sent[0]["status"] == 200, sent

    async def run() -> list[float]:
        async with app.router.lifespan_context(app):
            while app.state.runtime.service is None:
                await asyncio.sleep(0.01)
            for _ in range(50):
                await call()
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                await call()
                times.append((time.perf_counter() - t0) * 1000)
            return sorted(times)

    times = asyncio.run(run())
    return {"requests": n, "p50_ms": round(statistics.median(times), 3), "p99_ms": round(times[int(0.99 * (n - 1))], 3)}


# ---- the split, in-process


def split(n: int = 300) -> dict:
    import orjson
    from starlette.responses import JSONResponse

    from openjev.api.contract.jev import convert, schemas

    try:
        from openjev.api.contract.responses import FastJSONResponse
    except ImportError:  # measuring a version before it: orjson as it would be used

        class FastJSONResponse(JSONResponse):
            def render(self, content):
                return orjson.dumps(content)

    from openjev.api.server.assembly import service_limits
    from openjev.config import MAX_CHOICE_OPTIONS, load_settings
    from openjev.core.prompts import PromptCompiler
    from openjev.core.service import DecisionService

    loaded = _loaded_with_instant_engine()
    compiler = PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)
    settings = load_settings({"max_in_flight": 64}, environ={})
    service = DecisionService(compiler, loaded.engine, service_limits(settings.quality, settings.limits))
    body = json.dumps(REQUEST).encode()
    steps = {}

    def timed(name, fn):
        fn()
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        steps[name] = round(statistics.median(samples), 1)

    wire = schemas.SystemOneRequest.model_validate(json.loads(body))
    decision = convert.request_of(wire)
    result = asyncio.run(service.decide(decision))
    out = convert.result_to_wire(result, "m")
    timed("parse_and_validate", lambda: schemas.SystemOneRequest.model_validate(json.loads(body)))
    timed("convert", lambda: convert.request_of(wire))
    timed("compile", lambda: compiler.compile(decision))
    timed("answers_to_wire", lambda: convert.result_to_wire(result, "m"))
    timed("encode_stdlib_json", lambda: JSONResponse(out))
    timed("encode_orjson", lambda: FastJSONResponse(out))
    steps["orjson_bytes_equal_json"] = orjson.loads(FastJSONResponse(out).body) == json.loads(JSONResponse(out).body)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=400, help="sequential requests for one client")
    parser.add_argument("--concurrent-requests", type=int, default=2000, help="requests spread over 64 clients")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    _quiet_logs()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.net import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "server not healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        single = asyncio.run(one_client(port, args.requests))
        concurrent = asyncio.run(many_clients(port, 64, args.concurrent_requests))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    print(
        json.dumps(
            {
                "bench": "api",
                "machine": machine(),
                "load_avg_1m": os.getloadavg()[0],
                "one_client": single,
                "clients_64": concurrent,
                "in_process": in_process(),
                "split_us": split(),
            }
        )
    )


if __name__ == "__main__":
    main()
