"""Behaviour under overload, and memory over time, of a real `openjev serve` on loopback
with the embedded model. JSON lines.

load (default): measure capacity (decisions/s, closed loop, 4 clients, distinct states),
then offer 2x that as an open loop (Poisson arrivals, each request its own connection
slot, nobody waits for anybody) for `--seconds`. Pass: every response is 200, 429 or 529,
every 429/529 carries Retry-After, no connection errors, no 5xx. Reports p50/p99 latency
of the admitted (200) requests and the status counts.

rss (`--rss-minutes N`): one client sends distinct states back to back for N minutes with
`--prefix-cache-bytes` (default 200 MB); the server's RSS and the cache's bytes (from
/metrics) are sampled every 5 s. Reports RSS after the first request, at the end, the
slope over the second half (MB/min), and the cache's bytes: the gap between them is what
the cache bound does not cover (weights, the working set of forwards, allocator slack).

    .venv/bin/python bench/bench_load.py --seconds 60
    .venv/bin/python bench/bench_load.py --rss-minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import TICKET, embedded_serve, machine
from tests.support.net import free_port


def request(tag: int, paragraphs: int = 2, questions: int = 2) -> dict:
    """A distinct ~200-token ticket (per `tag`) with noul + choice questions."""
    qs = {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "Payments and refunds", "shipping": "Delivery", "other": None},
        },
    }
    return {
        "model": "jev-latest",
        "state": " ".join(TICKET.format(n=tag * 10 + i) for i in range(paragraphs)),
        "questions": dict(list(qs.items())[:questions]),
    }


def start(args: list[str], log_path: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        embedded_serve(port, *args),
        stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {open(log_path).read()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError("server not healthy in time")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> int:
    os.kill(proc.pid, signal.SIGTERM)  # the drain: in-flight requests finish, exit 0
    try:
        return proc.wait(180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def gauge(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", timeout=10).text
        return next(
            (s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name), float("nan")
        )
    except (httpx.HTTPError, ValueError):  # a version without /metrics (side-by-side runs)
        return float("nan")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))], 3)


async def capacity(url: str, seconds: float, clients: int = 4, at_least: int = 8) -> float:
    """Decisions/s with `clients` closed-loop clients, over `seconds` or until `at_least`
    answers (a busy machine may serve fewer in the time); a 529 waits its Retry-After."""
    done, tag = 0, [10_000]
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=300) as client:

        async def worker():
            nonlocal done
            while time.monotonic() - t0 < seconds or (done < at_least and time.monotonic() - t0 < 300):
                tag[0] += 1
                r = await client.post(url + "/v1/systemone", json=request(tag[0]))
                if r.status_code in (429, 529):
                    await asyncio.sleep(float(r.headers["retry-after"]))
                    continue
                r.raise_for_status()
                done += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
        return done / (time.monotonic() - t0)


async def open_loop(url: str, rate: float, seconds: float) -> dict:
    results: list[tuple[int | str, float, bool]] = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def one(tag: int):
            t0 = time.monotonic()
            try:
                r = await client.post(url + "/v1/systemone", json=request(tag))
                results.append((r.status_code, time.monotonic() - t0, "retry-after" in r.headers))
            except httpx.HTTPError as e:
                results.append((type(e).__name__, time.monotonic() - t0, False))

        rng = random.Random(7)
        tasks, tag = [], 0
        end = time.monotonic() + seconds
        next_at = time.monotonic()
        while next_at < end:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            tag += 1
            tasks.append(asyncio.create_task(one(tag)))
            next_at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    counts: dict[str, int] = {}
    for status, _, _ in results:
        counts[str(status)] = counts.get(str(status), 0) + 1
    ok = [t for s, t, _ in results if s == 200]
    refused = [(s, h) for s, _, h in results if s in (429, 529)]
    bad = [s for s, _, _ in results if s not in (200, 429, 529)]
    return {
        "offered": len(results),
        "offered_per_s": round(len(results) / seconds, 2),
        "status": counts,
        "admitted_p50_s": pct(ok, 0.5),
        "admitted_p99_s": pct(ok, 0.99),
        "refused_with_retry_after": sum(h for _, h in refused),
        "refused": len(refused),
        "errors_or_5xx": len(bad),
        "pass": not bad and all(h for _, h in refused),
    }


def load_mode(args) -> dict:
    log = "/tmp/openjev-bench-load.log"
    proc, url = start(["--max-tokens-in-flight", str(args.max_tokens_in_flight)], log)
    try:
        asyncio.run(capacity(url, 5, clients=2, at_least=2))  # warm-up
        cap = asyncio.run(capacity(url, args.capacity_seconds))
        result = asyncio.run(open_loop(url, 2 * cap, args.seconds))
    finally:
        code = stop(proc)
    return {
        "bench": "load",
        "machine": machine(),
        "load_avg_1m": os.getloadavg()[0],
        "max_tokens_in_flight": args.max_tokens_in_flight,
        "capacity_per_s": round(cap, 2),
        "seconds": args.seconds,
        **result,
        "exit_status_after_sigterm": code,
    }


def rss_mode(args) -> dict:
    log = f"/tmp/openjev-bench-rss-{os.getpid()}.log"
    proc, url = start(["--prefix-cache-bytes", str(args.prefix_cache_bytes)], log)
    samples: list[tuple[float, float, float]] = []  # (minutes, rss MB, cache MB)
    try:
        client = httpx.Client(timeout=300)
        client.post(url + "/v1/systemone", json=request(1, paragraphs=6)).raise_for_status()
        first = rss_mb(proc.pid)
        t0 = last = time.monotonic()
        tag, served = 1, 1
        while time.monotonic() - t0 < args.rss_minutes * 60:
            tag += 1
            client.post(url + "/v1/systemone", json=request(tag, paragraphs=6)).raise_for_status()
            served += 1
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                samples.append(((last - t0) / 60, rss_mb(proc.pid), gauge(url, "openjev_prefix_cache_bytes") / 2**20))
    finally:
        code = stop(proc)
    half = [s for s in samples if s[0] >= args.rss_minutes / 2]
    slope = statistics.linear_regression([s[0] for s in half], [s[1] for s in half]).slope if len(half) > 2 else None
    return {
        "bench": "rss",
        "machine": machine(),
        "load_avg_1m": os.getloadavg()[0],
        "minutes": args.rss_minutes,
        "requests": served,
        "prefix_cache_bytes_bound_mb": args.prefix_cache_bytes / 2**20,
        "rss_after_first_mb": round(first, 1),
        "rss_end_mb": round(samples[-1][1], 1) if samples else None,
        "rss_max_mb": round(max(s[1] for s in samples), 1) if samples else None,
        "cache_end_mb": round(samples[-1][2], 1) if samples else None,
        "slope_second_half_mb_per_min": None if slope is None else round(slope, 2),
        "samples": [(round(m, 2), round(r, 1), round(c, 1)) for m, r, c in samples],
        "exit_status_after_sigterm": code,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60, help="open-loop duration (load mode)")
    parser.add_argument("--capacity-seconds", type=float, default=20)
    parser.add_argument("--max-tokens-in-flight", type=int, default=4096)
    parser.add_argument("--rss-minutes", type=float, help="run the RSS mode for this long instead")
    parser.add_argument("--prefix-cache-bytes", type=int, default=200 * 2**20)
    args = parser.parse_args()
    out = rss_mode(args) if args.rss_minutes else load_mode(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
