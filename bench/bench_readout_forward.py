"""The engine work each readout costs, without the server: the warm forward alone.

For each readout (letters R=1, letters R=4, parallel), an N-question request on a
~1,000-token state is compiled and packed exactly as the in-process engine packs it; the
state's KV is computed once and shared, and then each readout's question part is run as
the one warm forward the scheduler would run (its tree mask, its positions), the readouts
taking turns. Wall and process CPU seconds per forward, p50 over --repeats, as ratios to
letters R=1; plus the host-side cost of packing and of building the mask.

Why next to bench_readouts.py: on a shared machine a request's wall time swings by 2x with
other jobs' load, and a few end-to-end samples cannot tell a 1.3x difference from noise.
Here every readout runs the same number of forwards on the same cached state, and process
CPU time counts the work done whatever the load (torch's own threads included).

    .venv/bin/python bench/bench_readout_forward.py [--repeats 5] [--sizes 8,1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from openjev.config import EMBEDDED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import core_request, machine, payload

from openjev.api.server.assembly import build_service
from openjev.config import load_settings
from openjev.core.readouts import ReadoutSpec
from openjev.engines import load_engine
from openjev.engines.torch.kv import KVChain, Row
from openjev.engines.torch.packing import PackedPlan, pack

SPECS = {
    "letters R=1": ReadoutSpec("letters", 1),
    "letters R=4": ReadoutSpec("letters", 4),
    "parallel": ReadoutSpec("parallel"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="8,1", help="questions per request, comma-separated")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    settings = load_settings({"engine": "transformers", "model": EMBEDDED_MODEL})
    loaded = load_engine(settings)
    service = build_service(settings.quality, settings.limits, loaded)
    runner = loaded.engine.runner  # type: ignore[attr-defined]
    names = list(SPECS)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        request = core_request(payload(n, tag=321, qtag=777))
        packed: dict[str, PackedPlan] = {}
        host: dict[str, dict[str, float]] = {}
        for name, spec in SPECS.items():
            plan = service.prepare_now(request, service.readout(spec)).plan
            t0 = time.perf_counter()
            p = pack(plan)
            t1 = time.perf_counter()
            p.visibility(p.root_len, len(p))
            t2 = time.perf_counter()
            packed[name] = p
            host[name] = {"pack_ms": (t1 - t0) * 1000, "mask_ms": (t2 - t1) * 1000, "nodes": p.ancestor.shape[0]}
        root = min(p.root_len for p in packed.values())
        first = packed[names[0]]
        if any(p.tokens[:root] != first.tokens[:root] for p in packed.values()):
            raise SystemExit("the readouts' plans do not share the state: nothing to compare")
        _, chunks = runner.forward(
            [Row(KVChain(), first.tokens[:root], first.positions[:root], first.visibility(0, root))]
        )
        state = KVChain().extend(chunks[0])
        got: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in names}
        for rep in range(args.repeats + 1):  # rep 0 warms kernels and the allocator, and is dropped
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                p = packed[name]
                row = Row(state.prefix(root), p.tokens[root:], p.positions[root:], p.visibility(root, len(p)))
                w0, c0 = time.perf_counter(), time.process_time()
                runner.forward([row])
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                if rep:
                    got[name]["wall"].append(wall)
                    got[name]["cpu"].append(cpu)
                    print(
                        json.dumps(
                            {
                                "readout": name,
                                "questions": n,
                                "rep": rep,
                                "wall_s": round(wall, 3),
                                "cpu_s": round(cpu, 3),
                            }
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
        base = {k: statistics.median(got[names[0]][k]) for k in ("wall", "cpu")}
        for name in names:
            wall, cpu = statistics.median(got[name]["wall"]), statistics.median(got[name]["cpu"])
            rows.append(
                {
                    "readout": name,
                    "questions": n,
                    "tokens": len(packed[name]) - root,
                    "wall_s_p50": round(wall, 3),
                    "cpu_s_p50": round(cpu, 3),
                    "wall_ratio": round(wall / base["wall"], 2),
                    "cpu_ratio": round(cpu / base["cpu"], 2),
                    "samples_wall_s": [round(x, 3) for x in got[name]["wall"]],
                    "samples_cpu_s": [round(x, 3) for x in got[name]["cpu"]],
                    **{k: round(v, 2) for k, v in host[name].items()},
                }
            )
    print(f"{machine()}, torch threads: {__import__('torch').get_num_threads()}, repeats {args.repeats}")
    print("| questions | readout | tokens | nodes | wall p50 s (x R=1) | CPU p50 s (x R=1) | pack ms | mask ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['questions']} | {r['readout']} | {r['tokens']} | {r['nodes']} | {r['wall_s_p50']} ({r['wall_ratio']}x) "
            f"| {r['cpu_s_p50']} ({r['cpu_ratio']}x) | {r['pack_ms']} | {r['mask_ms']} |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"machine": machine(), "repeats": args.repeats, "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
