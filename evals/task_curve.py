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
(ECE, with the noise of its answers taken out, against examples) and
docs/tasks-reliability-<model>.png (held-out reliability at the most examples the type's
questions allow, global fit against the task's).
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
    """Per size, means over `repeats` draws: the held-out ECE of the global fit and of the
    task's, and the task's cross-validated estimate, each as ECE and as ECE with the noise of
    its answers taken out (core/task_figures.py: the held-out answers and the examples differ
    in number, so only the second compares them), and the held-out Brier and accuracy of both
    fits; `bias` is the estimate's mean less the held-out figure's mean, `spread` the mean
    per-draw distance. Held out per draw: HELD_OUT test answers and every other test answer
    not drawn as an example (dev answers never: the global fit saw them). Also the held-out
    predictions of the largest size."""
    out: dict[str, Any] = {"sizes": {}, "pooled": {}}
    n = len(test[0].logs)
    prior = global_params(base, n)
    for size in SIZES:
        if size > len(dev) + len(test) - HELD_OUT:
            continue
        figs: dict[str, list[float]] = {}
        for r in range(repeats):
            rng = random.Random(1000 * size + r)
            order = list(range(len(test)))
            rng.shuffle(order)
            pool = [(test[i], True) for i in order[HELD_OUT:]] + [(e, False) for e in dev]
            rng.shuffle(pool)
            held = [test[i] for i in order[:HELD_OUT]] + [e for e, is_test in pool[size:] if is_test]
            fitted = fit_task([e for e, _ in pool[:size]], base, 0.9)
            g_rows = [(prior.probs(e.logs), e.gold) for e in held]
            t_rows = [(fitted.params.probs(e.logs), e.gold) for e in held]
            g, t = figures(g_rows), figures(t_rows)
            for key, value in (
                ("global", g.ece),
                ("task", t.ece),
                ("cv", fitted.after.ece),
                ("global_debiased", g.ece_debiased),
                ("task_debiased", t.ece_debiased),
                ("cv_debiased", fitted.after.ece_debiased),
                ("global_brier", g.brier),
                ("task_brier", t.brier),
                ("global_accuracy", g.accuracy),
                ("task_accuracy", t.accuracy),
                ("spread", abs(fitted.after.ece - t.ece)),
                ("spread_debiased", abs(fitted.after.ece_debiased - t.ece_debiased)),
                ("held_out", len(held)),
            ):
                figs.setdefault(key, []).append(value)
            pooled = out["pooled"].setdefault("largest", {"size": size, "global": [], "task": []})
            if pooled["size"] != size:
                pooled.update(size=size, **{"global": [], "task": []})
            pooled["global"] += g_rows
            pooled["task"] += t_rows
        means = {k: sum(v) / len(v) for k, v in figs.items()}
        means["bias"] = means["cv"] - means["task"]
        means["bias_debiased"] = means["cv_debiased"] - means["task_debiased"]
        out["sizes"][size] = means
    return out


def pictures(results: dict[str, Any], model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"{qtype} ({res['options']} options)", res["sizes"]) for qtype, res in results.items()]
    ece_picture(panels, len(panels), f"{model}: ECE against the examples a task has", f"tasks-ece-{model}.png")
    reliability_pictures(results, model, plt)


def ece_picture(panels: list[tuple[str, dict[int, dict[str, float]]]], columns: int, title: str, name: str) -> None:
    """docs/<name>: per panel (title, `curve`'s sizes), held-out ECE of the global and the
    task's fit and the task's CV estimate against the examples, noise taken out (comparable
    across sizes)."""
    import matplotlib.pyplot as plt

    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 3.0 * rows), squeeze=False)
    for ax, (label, by_size) in zip([a for row in axes for a in row], panels, strict=False):
        sizes = sorted(by_size)
        for key, style, legend in (
            ("global_debiased", "x--", "global fit (held-out)"),
            ("task_debiased", "o-", "per-task fit (held-out)"),
            ("cv_debiased", "s:", "per-task fit (its CV estimate)"),
        ):
            ax.plot(sizes, [by_size[s][key] for s in sizes], style, label=legend)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("examples in the task", fontsize=8)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    for row in axes:
        row[0].set_ylabel("ECE, noise taken out", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / name, dpi=110)
    plt.close(fig)


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


HEADER = (
    "| examples | held out | global | per-task | CV estimate | bias | global (debiased) | per-task (debiased) "
    "| CV estimate (debiased) | bias (debiased) |"
)


def table_head(first: str) -> list[str]:
    """A results table's header and rule: the `first` columns (e.g. "| type | options "), then HEADER's."""
    return [first + HEADER, "|---" * (first.count("|") + HEADER.count(" | ")) + "|---|"]


def row_cells(size: int, f: dict[str, float]) -> str:
    """One size's figures as table cells (`curve`'s keys), from `examples` to the debiased bias."""
    return (
        f"{size} | {f['held_out']:.0f} | {f['global']:.3f} | {f['task']:.3f} | {f['cv']:.3f} | {f['bias']:+.3f} | "
        f"{f['global_debiased']:.3f} | {f['task_debiased']:.3f} | {f['cv_debiased']:.3f} | {f['bias_debiased']:+.3f} |"
    )


def markdown(results: dict[str, Any], model: str, repeats: int) -> str:
    lines = [
        f"### {model}: per-task fits against the global fit (held-out ECE, {repeats} draws)",
        "",
        *table_head("| type | options "),
    ]
    for qtype, res in results.items():
        for size, f in sorted(res["sizes"].items()):
            lines.append(f"| {qtype} | {res['options']} | " + row_cells(size, f))
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
