"""What a model costs to serve on this machine: start-up, memory, and the latency of the
bench's standard requests, through the same service the server runs (in this process, no
HTTP), with the model's own defaults (its shipped calibration and default readout).

For each question count (--sizes), p50 of --repeats: cold (a ~1,000-token state never sent)
and warm (the same state, new questions), with the tokens computed and the resulting
tokens/s. One JSON line per size, then one with the memory (peak RSS).

    .venv/bin/python bench/bench_model_cost.py --model qwen2.5-coder-1.5b [--repeats 2] [--sizes 8 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

from openjev.config import EMBEDDED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import core_request, machine, p50, payload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a named model, a path, or the embedded model (default)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 1])
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    from openjev.api.server.assembly import build_service
    from openjev.config import load_settings
    from openjev.engines import load_engine

    t0 = time.perf_counter()
    settings = load_settings({"engine": "transformers", "model": args.model or EMBEDDED_MODEL, "dtype": args.dtype})
    loaded = load_engine(settings)
    service = build_service(settings.quality, settings.limits, loaded)
    head = {
        "bench": "model_cost",
        "machine": machine(),
        "model": args.model or "embedded",
        "readout": service.default_readout.describe(),
        "calibration": service.calibration.id if service.calibration else None,
        "start_s": round(time.perf_counter() - t0, 1),
    }

    async def run() -> None:
        for n in args.sizes:
            rows: dict[str, list] = {"cold_ms": [], "warm_ms": [], "cold_tokens": [], "warm_tokens": []}
            for rep in range(args.repeats):
                tag = 200_000 + 1000 * n + rep  # a state no earlier request sent
                for kind, wire in (("cold", payload(n, tag=tag)), ("warm", payload(n, tag=tag, qtag=tag + 500))):
                    start = time.perf_counter()
                    result = await service.decide(core_request(wire))
                    rows[f"{kind}_ms"].append((time.perf_counter() - start) * 1000)
                    rows[f"{kind}_tokens"].append(result.usage.computed_tokens)
            out = {"questions": n}
            for kind in ("cold", "warm"):
                ms, tokens = p50(rows[f"{kind}_ms"]), p50(rows[f"{kind}_tokens"])
                out[f"{kind}_p50_ms"] = round(ms)
                out[f"{kind}_tokens"] = tokens
                out[f"{kind}_tokens_per_s"] = round(tokens / (ms / 1000), 1)
            print(json.dumps({**head, "section": "latency", "repeats": args.repeats, **out}), flush=True)

    asyncio.run(run())
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss: KiB on Linux
    print(json.dumps({**head, "section": "memory", "peak_rss_gib": round(peak_gib, 2)}), flush=True)


if __name__ == "__main__":
    main()
