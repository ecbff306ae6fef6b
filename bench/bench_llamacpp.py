"""The llama.cpp engine beside the in-process PyTorch engine, side by side in one run.

Each engine runs in a child process of its own (so start time and RSS are its own), on the
same GGUF (the embedded model, or `--model NAME|PATH`), through the real DecisionService with
the same requests (bench/common.py): start time (process start to engine loaded, imports
included, in `openjev serve`'s order: the engine's prestart, then the service's imports), RSS
after load and at the peak, prefill tokens/s (a cold ~1,000-token state with
one question: computed tokens over wall time), and p50 latency at 1 and 8 questions on a
~1,000-token state, cold (a state never sent) and warm (the same state, new questions).
The PyTorch engine runs in its `auto` dtype (bfloat16 on CPUs with native support) and in
float32. One JSON line per engine, then a markdown table.

    .venv/bin/python bench/bench_llamacpp.py [--model qwen2.5-coder-1.5b] [--repeats 3] [--engines llamacpp,auto,float32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from openjev.config import EMBEDDED_MODEL

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))


def rss_mib() -> tuple[float, float]:
    import resource

    now = 0.0
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            now = int(line.split()[1]) / 1024
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(engine: str, model: str | None, repeats: int, prefix_cache_bytes: int | None) -> dict:
    from openjev.config import MAX_CHOICE_OPTIONS, load_settings
    from openjev.engines import load_engine, preflight_engine, prestart_engine

    overrides: dict = {"engine": "llamacpp"} if engine == "llamacpp" else {"engine": "transformers", "dtype": engine}
    overrides["model"] = model or EMBEDDED_MODEL
    if prefix_cache_bytes is not None:
        overrides["prefix_cache_bytes"] = prefix_cache_bytes
    settings = load_settings({**overrides, "max_in_flight": 16, "engine_timeout_s": 3600}, environ={})
    # in `openjev serve`'s order: the checks, the engine's prestart (where it has one), then
    # the service's imports beside it, then the load
    preflight_engine(settings)
    prestart_engine(settings)
    import asyncio

    from common import core_request, p50, payload

    from openjev.api.server.assembly import service_limits
    from openjev.core.prompts import PromptCompiler
    from openjev.core.service import DecisionService

    loaded = load_engine(settings)
    start_s = time.perf_counter() - T0
    rss_loaded, _ = rss_mib()
    service = DecisionService(
        PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS),
        loaded.engine,
        service_limits(settings.quality, settings.limits),
    )

    async def timed(wire) -> tuple[float, int]:
        t = time.perf_counter()
        decision = await service.decide(core_request(wire))
        return time.perf_counter() - t, decision.usage.computed_tokens or 0

    async def run() -> dict:
        await timed(payload(1, tag=9000))  # warm-up (first-call costs: allocator, caches)
        out: dict = {}
        rates = []
        for r in range(repeats):
            seconds, computed = await timed(payload(1, tag=9100 + r))
            rates.append(computed / seconds)
        out["prefill_tok_s"] = round(p50(rates), 1)
        for n in (1, 8):
            cold, warm = [], []
            for r in range(repeats):
                tag = 1000 * n + r
                cold.append((await timed(payload(n, tag=tag)))[0])
                warm.append((await timed(payload(n, tag=tag, qtag=tag + 500)))[0])
            out[f"cold_p50_s_{n}q"] = round(p50(cold), 3)
            out[f"warm_p50_s_{n}q"] = round(p50(warm), 3)
        return out

    timings = asyncio.run(run())
    asyncio.run(loaded.engine.close())
    _, peak = rss_mib()
    return {
        "engine": engine,
        "model": loaded.card.name,
        "start_s": round(start_s, 2),
        "load_s": round(loaded.load_seconds, 2),
        "rss_loaded_mib": round(rss_loaded),
        "rss_peak_mib": round(peak),
        **timings,
    }


COLUMNS = (
    "engine",
    "start_s",
    "rss_loaded_mib",
    "rss_peak_mib",
    "prefill_tok_s",
    "cold_p50_s_1q",
    "warm_p50_s_1q",
    "cold_p50_s_8q",
    "warm_p50_s_8q",
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a named model or a .gguf path (default: the embedded model)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="llamacpp,auto,float32", help="llamacpp, and PyTorch dtypes")
    ap.add_argument("--prefix-cache-bytes", type=int, default=None, help="for every engine (default: the setting's)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.repeats, args.prefix_cache_bytes)), flush=True)
        return
    from common import machine

    print(json.dumps({"machine": machine(), "model": args.model or "embedded", "repeats": args.repeats}), flush=True)
    rows = []
    for engine in args.engines.split(","):
        cmd = [sys.executable, __file__, "--child", engine, "--repeats", str(args.repeats)]
        if args.model:
            cmd += ["--model", args.model]
        if args.prefix_cache_bytes is not None:
            cmd += ["--prefix-cache-bytes", str(args.prefix_cache_bytes)]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        print(line, flush=True)
        rows.append(json.loads(line))
    print("\n| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
