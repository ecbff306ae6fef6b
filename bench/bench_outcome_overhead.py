"""What recording decisions for /v1/outcomes costs the decision path, side by side in one run.

One process, the embedded model loaded once, two apps on it: `recording` (the default
--outcome-retention, its task store in a temporary directory) and `off` (--outcome-retention
0). Each round sends ROUNDS x PER_ROUND new ~150-token states with 3 questions through each
app's whole HTTP stack (in-process ASGI), CONCURRENCY at a time, the two modes back to back
in alternating order, so drift in the machine's speed falls on both. Reported: each mode's
throughput and p50 latency, the ratios recording / off, and how many decisions the recorder
kept and dropped. One JSON line.

    .venv/bin/python bench/bench_outcome_overhead.py [--rounds 8] [--per-round 16] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, p50, payload

from openjev.api.server.app import create_app
from openjev.config import load_settings
from openjev.engines import load_engine


async def burst(client: httpx.AsyncClient, tags: list[int], concurrency: int) -> tuple[float, list[float]]:
    """(wall seconds, per-request seconds) of one request per tag, `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(tag: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            r = await client.post("/v1/systemone", json=payload(3, tag, paragraphs=2))
            latencies.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {r.text[:300]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(t) for t in tags))
    return time.perf_counter() - t0, latencies


async def main(rounds: int, per_round: int, concurrency: int) -> dict:
    base = {"max_in_flight": 64, "engine_timeout_s": 3600}
    loaded = load_engine(load_settings(base, environ={}))
    with tempfile.TemporaryDirectory() as tmp:
        apps = {
            "recording": create_app(
                load_settings({**base, "tasks_db": f"{tmp}/on.sqlite3"}, environ={}), loader=lambda _: loaded
            ),
            "off": create_app(
                load_settings({**base, "tasks_db": f"{tmp}/off.sqlite3", "outcome_retention": "0"}, environ={}),
                loader=lambda _: loaded,
            ),
        }
        walls = dict.fromkeys(apps, 0.0)
        lat: dict[str, list[float]] = {m: [] for m in apps}
        async with apps["recording"].router.lifespan_context(apps["recording"]):
            async with apps["off"].router.lifespan_context(apps["off"]):
                clients = {
                    m: httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://localhost", timeout=600)
                    for m, a in apps.items()
                }
                for m, c in clients.items():  # loaded, and warm (first compiles, first forwards)
                    while (await c.get("/health")).status_code != 200:
                        await asyncio.sleep(0.1)
                    await burst(c, [10_000_000 + i + (0 if m == "off" else 100) for i in range(4)], concurrency)
                tag = 0
                for r in range(rounds):
                    order = ["recording", "off"] if r % 2 == 0 else ["off", "recording"]
                    for mode in order:
                        tags = list(range(tag, tag + per_round))
                        tag += per_round
                        wall, latencies = await burst(clients[mode], tags, concurrency)
                        walls[mode] += wall
                        lat[mode] += latencies
                outcomes = apps["recording"].state.outcomes
                outcomes.recorder.flush()
                kept = outcomes.recorder.recorded._value.get()
                dropped = outcomes.recorder.dropped._value.get()
                for c in clients.values():
                    await c.aclose()
    n = rounds * per_round
    out = {m: {"req_per_s": round(n / walls[m], 3), "p50_ms": round(p50(lat[m]) * 1000, 1)} for m in apps}
    return {
        **out,
        "throughput_ratio": round(out["recording"]["req_per_s"] / out["off"]["req_per_s"], 4),
        "p50_ratio": round(out["recording"]["p50_ms"] / out["off"]["p50_ms"], 4),
        "requests_per_mode": n,
        "recorded": kept,
        "dropped": dropped,
        "concurrency": concurrency,
        **machine(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-round", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.rounds, a.per_round, a.concurrency))))
