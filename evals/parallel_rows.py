"""An order-free readout's rows of the quality table (parallel, or its sequential twin
canonical) on a budget: one raw run, calibrated metrics computed from it.

evals/quality_table.py sends every item twice per readout (raw and calibrated) plus a flip
request per item with choice questions. For these readouts both extras can be derived exactly:
- calibrated: the server applies `calibration.apply(fit, probs)` to the raw option
  probabilities (core/service.py `_answer`); here the same function is applied to the raw
  answers with the same file's fits, so no second engine pass is needed;
- flips: both readouts compile a request and its options in any other order to the
  identical plan (tests/integration/test_embedded_model.py proves it for parallel on the
  real model), so every flip is 0 by construction; `--flips` sends them anyway.

    .venv/bin/python evals/parallel_rows.py --calibration src/openjev/calibrations/smollm2-135m-instruct.json
    .venv/bin/python evals/parallel_rows.py --readout canonical --flips --calibration ...

Writes evals/results/quality-<readout>.json and prints the rows in quality.md's format.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from openjev.config import load_settings
from openjev.core import calibration as calib
from openjev.core.readouts import CANONICAL_ORDER, ReadoutSpec
from openjev.evals.dataset import load_items
from openjev.evals.local import local_server
from openjev.evals.metrics import Scored, by_type
from openjev.evals.runner import ResultStore, RunConfig, run_items, run_meta, score


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="evals/data/test.jsonl")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--readout", choices=CANONICAL_ORDER, default="parallel")
    ap.add_argument("--out", help="run folder (default: evals/runs/table/<readout>-r1-raw-once)")
    ap.add_argument("--results", help="default: evals/results/quality-<readout>.json")
    ap.add_argument("--flips", action="store_true", help="also send the flip requests (0 by construction)")
    args = ap.parse_args()
    spec = ReadoutSpec(args.readout)
    out = args.out or f"evals/runs/table/{args.readout}-r1-raw-once"
    results = args.results or f"evals/results/quality-{args.readout}.json"
    items = load_items(args.data)
    cal = calib.load(args.calibration)
    config = RunConfig(readout=args.readout, rotations=1, calibrated=False, flips=args.flips)
    store = ResultStore(out, run_meta([args.data], f"in-process:{args.calibration}", config))
    settings = load_settings(
        {"engine": "transformers", "model": "embedded", "calibration": args.calibration, "prefix_cache_bytes": 0}
    )
    with local_server(settings) as url:
        asyncio.run(run_items(url, items, config, store, concurrency=1))
    raw, facts = score(items, store)
    calibrated = []
    for s in raw:
        fit = cal.fit_for(spec, s.qtype)
        calibrated.append(s if fit is None else Scored(s.qtype, calib.apply(fit, s.probs), s.correct, s.flipped))
    rows = [
        {"readout": args.readout, "rotations": 1, "calibrated": c, "metrics": by_type(scored), "run": facts}
        for c, scored in ((False, raw), (True, calibrated))
    ]
    Path(results).write_text(json.dumps({"calibration": cal.id, "rows": rows}, indent=1) + "\n")
    for r in rows:
        m = r["metrics"]["all"]
        flips = r["metrics"]["choice"].get("order_flip_rate")
        print(
            f"| {args.readout} | {'yes' if r['calibrated'] else 'no'} | {m['accuracy']:.3f} | {m['ece']:.3f} | "
            f"{m['brier']:.3f} | {m['nll']:.3f} | flips {flips} | tokens {facts['tokens_computed_per_request']:.0f} |"
        )
        print(
            "  per type (ECE / accuracy):",
            {t: (round(v["ece"], 3), round(v["accuracy"], 3)) for t, v in r["metrics"].items() if t != "all"},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
