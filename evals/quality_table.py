"""Rebuild the decision-quality table (docs/quality.md): every readout, with and without the
calibration, on the test split, in one run on one in-process server.

    .venv/bin/python evals/quality_table.py --calibration src/openjev/calibrations/smollm2-135m-instruct.json

Requests are cold (prefix cache off) and sent one at a time, so tokens and latency
compare the methods, not the cache or the load. `--only letters:1 --only parallel` runs
only those readouts and keeps the other rows of the existing quality.json (their answers
are deterministic; their p50 latency is then not comparable and is left out). Results: evals/results/quality.{md,json}
and a run folder per configuration under evals/runs/table/ (resumable: rerun to finish).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
from pathlib import Path

from openjev.config import load_settings
from openjev.evals import report
from openjev.evals.dataset import load_items
from openjev.evals.local import local_server
from openjev.evals.metrics import by_type
from openjev.evals.runner import ResultStore, RunConfig, run_items, run_meta, score

CONFIGS = [("letters", 1), ("letters", 2), ("letters", 4), ("yesno", 1), ("parallel", 1)]


def _name(readout: str, rotations: int) -> str:
    return readout + (f", R={rotations}" if readout == "letters" else "")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="evals/data/test.jsonl")
    ap.add_argument("--calibration", required=True, help="the calibration file the server applies")
    ap.add_argument("--out", default="evals/runs/table")
    ap.add_argument("--results", default="evals/results")
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--only", action="append", metavar="READOUT[:R]", help="run only these readouts (repeatable)")
    args = ap.parse_args()
    only = None
    if args.only:
        only = {(o.partition(":")[0], int(o.partition(":")[2] or 1)) for o in args.only}
    previous = Path(args.results) / "quality.json"
    kept = json.loads(previous.read_text())["rows"] if only and previous.exists() else []
    items = load_items(args.data)
    settings = load_settings(
        {"engine": "transformers", "model": "embedded", "calibration": args.calibration, "prefix_cache_bytes": 0}
    )
    rows = []
    with local_server(settings) as url:
        for readout, rotations in CONFIGS:
            if only is not None and (readout, rotations) not in only:
                rows += [
                    {**r, "previous_run": True} for r in kept if (r["readout"], r["rotations"]) == (readout, rotations)
                ]
                continue
            for calibrated in (False, True):
                config = RunConfig(readout=readout, rotations=rotations, calibrated=calibrated)
                name = f"{readout}-r{rotations}-{'cal' if calibrated else 'raw'}"
                folder = Path(args.out) / name
                store = ResultStore(
                    folder, run_meta([args.data], f"in-process:{args.calibration}", config), restart=args.restart
                )
                print(f"{name}: {len(items)} items", file=sys.stderr)
                asyncio.run(run_items(url, items, config, store, concurrency=1))
                scored, facts = score(items, store)
                summary = {"metrics": by_type(scored), "run": facts}
                report.write(folder, summary, scored, f"{Path(args.data).stem}: {name}")
                rows.append({"readout": readout, "rotations": rotations, "calibrated": calibrated, **summary})
    base = next(r for r in rows if r["readout"] == "letters" and r["rotations"] == 1 and not r["calibrated"])
    mixed = any(r.get("previous_run") for r in rows)
    lines = [
        f"Test split ({len(items)} items, {sum(len(i.expected) for i in items)} questions), embedded model, "
        f"{cpu_name()}, {'rows from two runs' if mixed else 'one run'}; tokens and p50 latency relative to "
        f"plain letters ({base['run']['tokens_computed_per_request']:.0f} tokens"
        + ("" if mixed else f", {base['run']['latency_ms_p50']:.0f} ms")
        + ")."
        + (" Latency only compares rows of one run: see bench/bench_readouts.py." if mixed else ""),
        "",
        "| readout | calibrated | accuracy | ECE | Brier | NLL | acc@p>=0.9 (coverage) | choice order flips "
        "| tokens computed | p50 latency |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, run = r["metrics"]["all"], r["run"]
        name = _name(r["readout"], r["rotations"])
        sel = "-" if m["accuracy_at_0.9"] is None else f"{m['accuracy_at_0.9']:.2f} ({m['coverage_at_0.9']:.2f})"
        lines.append(
            f"| {name} | {'yes' if r['calibrated'] else 'no'} | {m['accuracy']:.3f} | {m['ece']:.3f} | "
            f"{m['brier']:.3f} | {m['nll']:.3f} | {sel} | {r['metrics']['choice']['order_flip_rate']:.3f} | "
            f"{run['tokens_computed_per_request'] / base['run']['tokens_computed_per_request']:.2f}x | "
            + ("- |" if mixed else f"{run['latency_ms_p50'] / base['run']['latency_ms_p50']:.2f}x |")
        )
    lines += [
        "",
        "Per question type (ECE / accuracy):",
        "",
        "| readout | calibrated | noul | choice | score |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        name = _name(r["readout"], r["rotations"])
        cells = [
            f"{r['metrics'][t]['ece']:.3f} / {r['metrics'][t]['accuracy']:.3f}" for t in ("noul", "choice", "score")
        ]
        lines.append(f"| {name} | {'yes' if r['calibrated'] else 'no'} | " + " | ".join(cells) + " |")
    Path(args.results).mkdir(parents=True, exist_ok=True)
    (Path(args.results) / "quality.md").write_text("\n".join(lines) + "\n")
    (Path(args.results) / "quality.json").write_text(json.dumps({"cpu": cpu_name(), "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
