"""Per-task fits on text we never fitted: each question of a held-out source is one task.

A held-out source (openjev.evals.sources: the vader sources ask the same three questions of
every text) gives, per question, 72-112 labelled answers of one decision: a task as a caller
would create it. From the recorded readings (`evals/source_table.py record`: letters R=2,
whose first ordering is letters R=1's), each task's answers are split per draw into its
examples and the held-out rest (at least 20); the server's own per-task fit
(core/task_fit.py) on 10, 25 and 50 of them is set beside the shipped global fit on the same
held-out answers, with the cross-validated estimate the fit reports to its caller
(evals/task_curve.py's `curve`).

    .venv/bin/python evals/task_sources.py --model qwen2.5-coder-1.5b

writes evals/results/tasks-sources-<model>.md and .json, and the picture
docs/tasks-sources-ece-<model>.png (ECE against examples, per source and task).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from openjev.core import calibration as calib
from openjev.core.readouts import LettersReadout, ReadoutSpec, question_type
from openjev.core.task_fit import Example
from openjev.evals import readings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_table import items_of
from task_curve import IDS, LABELS, ROOT, curve, ece_picture, example, row_cells, table_head

SOURCES = ("vader-tweets", "vader-amazon", "vader-movies")


def tasks(model: str, source: str, base: calib.Calibration, cache_dir: str) -> dict[str, tuple[str, list[Example]]]:
    """Per question id of `source`: its type and every recorded answer as the fit sees it."""
    path = ROOT / "evals" / "results" / "readings" / model / f"{source}-letters-r2.jsonl"
    recs = readings.recorded(readings.load(path))
    readout = LettersReadout(LABELS, IDS, rotations=1)
    out: dict[str, tuple[str, list[Example]]] = {}
    for item in items_of(source, cache_dir, [5, 8, 16]):
        for qid, question in readings.core_request(item).questions:
            rec = recs.get((item.id, qid))
            if rec is not None and qid in item.expected:
                got = example(item, qid, question, rec, base, readout)
                out.setdefault(qid, (question_type(question), []))[1].append(got)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--cache-dir", default="~/.cache/openjev")
    args = p.parse_args()
    base = calib.load(ROOT / "src" / "openjev" / "calibrations" / f"{args.model}.json")
    results: dict[str, dict] = {}
    lines = [
        f"### {args.model}: per-task fits on held-out sources (held-out ECE, {args.repeats} draws)",
        "",
        *table_head("| source | task (type, n) "),
    ]
    for source in SOURCES:
        for qid, (qtype, examples) in tasks(args.model, source, base, args.cache_dir).items():
            res = curve([], examples, base.fit_for(ReadoutSpec("letters", 1), qtype), args.repeats)
            results[f"{source}/{qid}"] = {"type": qtype, "n": len(examples), "sizes": res["sizes"]}
            for size, f in res["sizes"].items():
                lines.append(f"| {source} | {qid} ({qtype}, {len(examples)}) | " + row_cells(size, f))
    import matplotlib

    matplotlib.use("Agg")
    panels = [(f"{key.removeprefix('vader-')} ({r['type']}, {r['n']})", r["sizes"]) for key, r in results.items()]
    ece_picture(panels, 3, f"{args.model}: per-task fits on held-out sources", f"tasks-sources-ece-{args.model}.png")
    out = ROOT / "evals" / "results"
    (out / f"tasks-sources-{args.model}.json").write_text(json.dumps(results, indent=1) + "\n")
    text = "\n".join(lines) + "\n"
    (out / f"tasks-sources-{args.model}.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
