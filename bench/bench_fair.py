"""A fair share of the engine per key (issue 50): a light tenant beside a heavy one, on a real
server with two keys, measured side by side in one run.

The light key sends one small request at a time (a 10-word state, one noul question); the
heavy key keeps either two batches of 10 short states in flight (`batches`) or 16
concurrent single requests (`singles`). Each phase runs `--seconds`: the light key alone,
the heavy key alone, then both together. Reported per heavy mode: the light key's rate
(decisions/s) and p50 latency beside its solo figures, the heavy key's decisions/s beside
its solo figure, the total decisions/s together, and every status other than 200. One
JSON line.

    flock /tmp/openjev-heavy.lock .venv/bin/python bench/bench_fair.py [--seconds 20] [--serve-arg=--engine=llamacpp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine
from tests.integration.conftest import start_server, stop_server
from tests.support.tenants import Tally, heavy_batches, heavy_singles, light

KEYS = "light:light-key-0001\nheavy:heavy-key-0002\n"
LIGHT, HEAVY = "light-key-0001", "heavy-key-0002"
HEAVY_MODES = {"batches": heavy_batches, "singles": heavy_singles}


def figures(tally: Tally, seconds: float) -> dict:
    ms = sorted(x * 1000 for x in tally.latencies_s)
    return {
        "decisions_per_s": round(tally.decisions / seconds, 2),
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "errors": tally.errors,
    }


async def phase(url: str, seconds: float, light_on: bool, heavy: str | None) -> dict:
    until = time.monotonic() + seconds
    tasks = {}
    if light_on:
        tasks["light"] = light(url, LIGHT, until)
    if heavy is not None:
        tasks["heavy"] = HEAVY_MODES[heavy](url, HEAVY, until)
    t0 = time.monotonic()
    tallies = await asyncio.gather(*tasks.values())
    elapsed = time.monotonic() - t0  # the last answers come after `until`
    return {name: figures(t, elapsed) for name, t in zip(tasks, tallies, strict=True)}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


async def measure(url: str, seconds: float, modes: list[str]) -> dict:
    await phase(url, 3, True, modes[0])  # warm-up: first forwards are slow
    out: dict = {"light_solo": (await phase(url, seconds, True, None))["light"]}
    solo_l = out["light_solo"]
    for mode in modes:
        solo_h = (await phase(url, seconds, False, mode))["heavy"]
        both = await phase(url, seconds, True, mode)
        out[mode] = {
            "heavy_solo": solo_h,
            "together": both,
            "light_rate_vs_solo": ratio(both["light"]["decisions_per_s"], solo_l["decisions_per_s"]),
            "light_p50_vs_solo": ratio(both["light"]["p50_ms"], solo_l["p50_ms"]),
            "heavy_rate_vs_solo": ratio(both["heavy"]["decisions_per_s"], solo_h["decisions_per_s"]),
            "total_decisions_per_s": round(both["light"]["decisions_per_s"] + both["heavy"]["decisions_per_s"], 2),
            "total_vs_heavy_solo": ratio(
                both["light"]["decisions_per_s"] + both["heavy"]["decisions_per_s"], solo_h["decisions_per_s"]
            ),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--modes", default="batches,singles", help="heavy modes to run: batches, singles")
    parser.add_argument("--serve-arg", action="append", default=[], help="an extra `openjev serve` argument")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys").write_text(KEYS)
        server = start_server(Path(tmp), "--api-keys-file", str(Path(tmp) / "keys"), *args.serve_arg, env={})
        try:
            result = asyncio.run(measure(server.url, args.seconds, modes))
        finally:
            stop_server(server)
    print(json.dumps({"bench": "fair", "machine": machine(), "seconds": args.seconds, **result}))


if __name__ == "__main__":
    main()
