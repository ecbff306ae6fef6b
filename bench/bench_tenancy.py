"""What per-key cache namespaces cost, measured side by side in one run (issue 11).

Two keys send the same ~1,000-token state with 4 questions each, A first, then B (other
questions). `shared`: both in one namespace (a server without keys, or two keys of one
cache_group); `namespaced`: each key its own (the default with keys). Each round uses a
state never seen before and runs both modes back to back, in alternating order, on the
same engine and prefix cache. Reported: B's tokens computed and cached, p50 latency of B
(and of A, cold in both modes), the prefix-cache bytes the pair leaves behind, and the
ratios namespaced / shared. One JSON line.

    .venv/bin/python bench/bench_tenancy.py [--repeats N] [--dtype float32|bfloat16|auto]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

from openjev.config import EMBEDDED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import core_request, machine, p50, payload

from openjev.api.server.assembly import service_limits
from openjev.config import MAX_CHOICE_OPTIONS, load_settings
from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService
from openjev.engines import load_engine

_SETTINGS = load_settings({"max_in_flight": 64, "engine_timeout_s": 3600}, environ={})
LIMITS = service_limits(_SETTINGS.quality, _SETTINGS.limits)
QUESTIONS = 4


async def pair(service: DecisionService, cache, tag: int, namespaces: tuple[str, str]) -> dict:
    """A then B on state `tag`; B's usage and latency, A's latency, the cache bytes added."""
    before = cache.nbytes
    out: dict = {}
    for who, ns, qtag in (("a", namespaces[0], tag), ("b", namespaces[1], tag + 5000)):
        request = dataclasses.replace(core_request(payload(QUESTIONS, tag, qtag)), cache_namespace=ns)
        t0 = time.perf_counter()
        result = await service.decide(request)
        out[f"{who}_ms"] = (time.perf_counter() - t0) * 1000
        out[f"{who}_computed"] = result.usage.computed_tokens
        out[f"{who}_cached"] = result.usage.cached_tokens
    out["cache_bytes"] = cache.nbytes - before
    return out


async def main(args) -> dict:
    settings = load_settings({"engine": "transformers", "model": EMBEDDED_MODEL, "dtype": args.dtype}, environ={})
    loaded = load_engine(settings)
    engine = loaded.engine
    service = DecisionService(PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS), engine, LIMITS)
    modes = {"shared": ("team", "team"), "namespaced": ("key-a", "key-b")}
    await pair(service, engine.cache, 9999, modes["shared"])  # warm-up: first forwards are slow
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for i, mode in enumerate(order):
            runs[mode].append(await pair(service, engine.cache, 10 * r + i + 1, modes[mode]))
    await engine.close()
    summary: dict = {"machine": machine(), "dtype": args.dtype, "repeats": args.repeats, "questions": QUESTIONS}
    for mode, rs in runs.items():
        summary[mode] = {
            "b_computed_tokens": p50([x["b_computed"] for x in rs]),
            "b_cached_tokens": p50([x["b_cached"] for x in rs]),
            "b_p50_ms": round(p50([x["b_ms"] for x in rs]), 1),
            "a_p50_ms": round(p50([x["a_ms"] for x in rs]), 1),
            "a_computed_tokens": p50([x["a_computed"] for x in rs]),
            "cache_bytes_per_pair": p50([x["cache_bytes"] for x in rs]),
        }
    s, n = summary["shared"], summary["namespaced"]
    summary["ratios_namespaced_over_shared"] = {
        "b_computed_tokens": round(n["b_computed_tokens"] / s["b_computed_tokens"], 2),
        "b_latency": round(n["b_p50_ms"] / s["b_p50_ms"], 2),
        "a_latency": round(n["a_p50_ms"] / s["a_p50_ms"], 2),
        "cache_bytes": round(n["cache_bytes_per_pair"] / s["cache_bytes_per_pair"], 2),
    }
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
