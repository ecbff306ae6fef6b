"""How many examples does a per-task fit need? Measured on recorded readings, not by hand.

For each question type (each standing for one task), the labelled questions of a model's
recorded readings (evals/results/readings/<model>/{dev,test}-letters-r1.jsonl: letters,
one ordering) are split, per repeat, into a held-out set drawn from the test split and a
pool the task's examples are drawn from (the rest of test and dev). The per-task fit
(core/task_fit.py, the server's own) is fitted on 10, 25, 50 and 100 of them, starting
from the shipped global fit (src/openjev/calibrations/<model>.json, fitted on dev); its
ECE on the held-out set is set beside the global fit's on the same set, and beside the
cross-validated estimate the fit reports to its caller (GET /v1/tasks/{id}: fit.after).

    .venv/bin/python evals/task_curve.py --model qwen2.5-coder-1.5b

writes evals/results/tasks-<model>.json and .md, and the pictures docs/tasks-ece-<model>.png
(ECE against examples) and docs/tasks-reliability-<model>.png (held-out reliability at the
most examples the type's questions allow, global fit against the task's).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

from openjev.core import calibration as calib
from openjev.core.readouts import LettersReadout, ReadoutSpec, question_type
from openjev.core.task_figures import figures
from openjev.core.task_fit import Example, fit_task, global_params
from openjev.evals import readings
from openjev.evals.dataset import load_items

ROOT = Path(__file__).resolve().parents[1]
SIZES = (10, 25, 50, 100)
TYPES = ("noul", "choice", "score")
HELD_OUT = 20
LABELS = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
IDS = tuple(range(len(LABELS)))  # the recordings carry the log-probs; ids are never looked up


def rows(model: str, split: str, base: calib.Calibration) -> dict[str, list[Example]]:
    """Per type, each recorded question as the fit sees it (log-probs after the global fit's
    position prior), from `split`'s letters R=1 readings."""
    items = load_items(ROOT / "evals" / "data" / f"{split}.jsonl")
    path = ROOT / "evals" / "results" / "readings" / model / f"{split}-letters-r1.jsonl"
    recs = readings.recorded(readings.load(path))
    readout = LettersReadout(LABELS, IDS, rotations=1)
    out: dict[str, list[Example]] = {t: [] for t in TYPES}
    for item in items:
        for qid, question in readings.core_request(item).questions:
            rec = recs.get((item.id, qid))
            if rec is not None:
                out[question_type(question)].append(example(item, qid, question, rec, base, readout))
    return out


def example(item, qid: str, question, rec: readings.Recorded, base: calib.Calibration, readout) -> Example:
    """One recorded question as a task's fit sees it: its letters R=1 log-probs after the global
    fit's position prior, and its gold answer."""
    combined = readings.combine_letters(readout, question, rec)
    fit = base.fit_for(ReadoutSpec("letters", 1), question_type(question))
    prior = calib.TypeFit(1.0, (), dict(fit.position_prior) if fit is not None else {})
    probs = calib.apply(prior, combined.probs, combined.shown, combined.clones, combined.mirrored)
    return Example(tuple(math.log(max(p, 1e-12)) for p in probs), readings.expected_index(item, qid))


def by_width(examples: list[Example]) -> list[list[Example]]:
    """A task reads one question: its examples all have its option count. The type's
    questions grouped by option count, largest group first."""
    groups: dict[int, list[Example]] = {}
    for e in examples:
        groups.setdefault(len(e.logs), []).append(e)
    return sorted(groups.values(), key=len, reverse=True)


def curve(dev: list[Example], test: list[Example], base: calib.TypeFit | None, repeats: int) -> dict[str, Any]:
    """Per size: mean held-out ECE of the global fit and of the task's, and the task's
    cross-validated estimate, over `repeats` draws; and the held-out predictions of the
    largest size the type's questions allow."""
    out: dict[str, Any] = {"sizes": {}, "pooled": {}}
    n = len(test[0].logs)
    prior = global_params(base, n)
    for size in SIZES:
        if size > len(dev) + len(test) - HELD_OUT:
            continue
        figs: dict[str, list[float]] = {"global": [], "task": [], "cv": [], "gap": []}
        for r in range(repeats):
            rng = random.Random(1000 * size + r)
            order = list(range(len(test)))
            rng.shuffle(order)
            held = [test[i] for i in order[:HELD_OUT]]
            pool = [test[i] for i in order[HELD_OUT:]] + dev
            rng.shuffle(pool)
            fitted = fit_task(pool[:size], base, 0.9)
            g_rows = [(prior.probs(e.logs), e.gold) for e in held]
            t_rows = [(fitted.params.probs(e.logs), e.gold) for e in held]
            held_ece = figures(t_rows).ece
            figs["global"].append(figures(g_rows).ece)
            figs["task"].append(held_ece)
            figs["cv"].append(fitted.after.ece)
            figs["gap"].append(abs(fitted.after.ece - held_ece))
            pooled = out["pooled"].setdefault("largest", {"size": size, "global": [], "task": []})
            if pooled["size"] != size:
                pooled.update(size=size, **{"global": [], "task": []})
            pooled["global"] += g_rows
            pooled["task"] += t_rows
        out["sizes"][size] = {k: sum(v) / len(v) for k, v in figs.items()}
    return out


def pictures(results: dict[str, Any], model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(3.4 * len(results), 3.2), squeeze=False)
    for ax, (qtype, res) in zip(axes[0], results.items(), strict=True):
        sizes = sorted(res["sizes"])
        for key, style, label in (
            ("global", "x--", "global fit (held-out)"),
            ("task", "o-", "per-task fit (held-out)"),
            ("cv", "s:", "per-task fit (its CV estimate)"),
        ):
            ax.plot(sizes, [res["sizes"][s][key] for s in sizes], style, label=label)
        ax.set_title(f"{qtype} ({res['options']} options)", fontsize=9)
        ax.set_xlabel("examples in the task", fontsize=8)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("ECE", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{model}: ECE against the examples a task has", fontsize=10)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"tasks-ece-{model}.png", dpi=110)
    plt.close(fig)
    reliability_pictures(results, model, plt)


def reliability_pictures(results: dict[str, Any], model: str, plt: Any) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(3.4 * len(results), 3.2), squeeze=False)
    for ax, (qtype, res) in zip(axes[0], results.items(), strict=True):
        for key, color in (("global", "#dd8452"), ("task", "#4c72b0")):
            rows = res["pooled"]["largest"][key]
            bins: list[list[tuple[float, bool]]] = [[] for _ in range(10)]
            for p, gold in rows:
                conf = max(p)
                bins[min(9, int(conf * 10))].append((conf, p.index(conf) == gold))
            xs = [sum(c for c, _ in b) / len(b) for b in bins if b]
            ys = [sum(h for _, h in b) / len(b) for b in bins if b]
            ax.plot(xs, ys, "o-", color=color, label=f"{key} fit")
        ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
        ax.set_title(f"{qtype}, {res['pooled']['largest']['size']} examples", fontsize=9)
        ax.set_xlabel("top probability", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("accuracy (held-out)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{model}: held-out reliability, global fit and per-task fit", fontsize=10)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"tasks-reliability-{model}.png", dpi=110)
    plt.close(fig)


def markdown(results: dict[str, Any], model: str, repeats: int) -> str:
    lines = [
        f"### {model}: per-task fits against the global fit (held-out ECE, {repeats} draws, {HELD_OUT} held out)",
        "",
        "| type | options | examples | global | per-task | per-task CV estimate | abs(CV - held-out) |",
        "|---|---|---|---|---|---|---|",
    ]
    for qtype, res in results.items():
        for size, f in sorted(res["sizes"].items()):
            lines.append(
                f"| {qtype} | {res['options']} | {size} | {f['global']:.3f} | {f['task']:.3f} | {f['cv']:.3f} "
                f"| {f['gap']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    base = calib.load(ROOT / "src" / "openjev" / "calibrations" / f"{args.model}.json")
    dev, test = rows(args.model, "dev", base), rows(args.model, "test", base)
    results = {}
    for qtype in TYPES:
        width = len(by_width(test[qtype])[0][0].logs)
        d = [e for e in dev[qtype] if len(e.logs) == width]
        t = [e for e in test[qtype] if len(e.logs) == width]
        res = curve(d, t, base.fit_for(ReadoutSpec("letters", 1), qtype), args.repeats)
        res["options"] = width
        results[qtype] = res
        print(f"{qtype}: {width} options, {len(d)} dev + {len(t)} test questions", file=sys.stderr)
    pictures(results, args.model)
    md = markdown(results, args.model, args.repeats)
    out = ROOT / "evals" / "results"
    plain = {q: {"options": r["options"], "sizes": r["sizes"]} for q, r in results.items()}
    (out / f"tasks-{args.model}.json").write_text(json.dumps(plain, indent=2) + "\n")
    (out / f"tasks-{args.model}.md").write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
