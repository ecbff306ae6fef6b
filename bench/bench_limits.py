"""What one admission costs in the per-key limits' store: the in-memory default against a
real redis-server on loopback (--limits-redis-url), side by side in one run. One JSON line.

Each round times, for each store, the calls a decision request makes to it: the door's one
step (`KeyLimits.admit`: the key's debt, one of its requests/min and the body's
reservation), the gate's (`take_tokens`: the reservation handed back, the request's
tokens taken) and, on Redis, the in-flight lease and its release (`FleetShare`). Rounds
alternate the stores so drift on a shared machine hits both alike; the figures are the
p50 and p90 over every call, in microseconds, and the Redis p50 less the memory p50.

    .venv/bin/python bench/bench_limits.py [--calls 2000] [--rounds 5]

It starts its own redis-server (Debian's package) on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

from openjev.api.identity.caller import caller_for  # noqa: E402
from openjev.api.identity.fleet_share import FleetShare  # noqa: E402
from openjev.api.identity.key_limits import KeyLimits  # noqa: E402
from openjev.api.identity.keys import KeyEntry, digest_of  # noqa: E402
from openjev.api.identity.shared import RedisBuckets, RedisStore  # noqa: E402

BIG = 10**12  # limits nobody reaches: every call is admitted, so each is timed doing its whole work


async def timed(calls: int, step) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await step()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def round_of(limits: KeyLimits, entry: KeyEntry, calls: int, share: FleetShare | None) -> dict[str, list[float]]:
    out = {
        "door": await timed(calls, lambda: limits.admit(entry, reserve=250)),
        "gate": await timed(calls, lambda: limits.take_tokens(entry, 300, refund=250)),
    }
    if share is not None:
        caller = caller_for(entry, limits.allowance(entry))

        async def lease() -> None:
            async with share(caller):
                pass

        out["lease_and_release"] = await timed(calls, lease)
    return out


def summary(us: list[float]) -> dict[str, float]:
    q = statistics.quantiles(us, n=10)
    return {"p50_us": round(statistics.median(us), 1), "p90_us": round(q[8], 1)}


async def main(calls: int, rounds: int) -> dict:
    server = RedisServer("redis-server")
    server.start()
    try:
        entry = KeyEntry("bench", digest_of("bench-key"), requests_per_min=BIG, tokens_per_min=BIG)
        store = RedisStore(server.url, "closed", 0.25, 1)  # closed: a failed call would raise, never be timed
        stores = {
            "memory": (KeyLimits(0, 0), None),
            "redis": (KeyLimits(0, 0, buckets=RedisBuckets(store)), FleetShare(BIG, 1.0, 1, store, 60.0)),
        }
        times: dict[str, dict[str, list[float]]] = {name: {} for name in stores}
        for _ in range(rounds):
            for name, (limits, share) in stores.items():
                for step, us in (await round_of(limits, entry, calls, share)).items():
                    times[name].setdefault(step, []).extend(us)
        await store.close()
    finally:
        server.stop()
    out = {name: {step: summary(us) for step, us in steps.items()} for name, steps in times.items()}
    out["redis_adds_p50_us"] = {
        step: round(out["redis"][step]["p50_us"] - out["memory"][step]["p50_us"], 1) for step in ("door", "gate")
    }
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    return {"calls": calls, "rounds": rounds, "redis_server": version, **out, "machine": machine()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.calls, args.rounds))))
