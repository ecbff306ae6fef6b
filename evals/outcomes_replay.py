"""Outcomes replayed: does the server's loop (answer, record the true answer, refit, watch for
drift) make a question's answers better calibrated over time, and does it notice and undo a
change of text? Measured on recorded readings, not by hand.

Each question of a held-out vader source (evals/task_sources.py's `tasks`: the recorded
letters readings of the 1.5B model, the same answers that page's per-task fits use) is one
task. Per draw, its answers are shuffled; the first STREAM arrive one by one as decisions
whose outcomes come back, the rest are a fixed held-out tail. Per outcome the loop answers
with the current fit (the shipped global fit until the first refit), records the outcome,
checks drift (core/outcomes/drift.py) and, every `--every` outcomes, refits with the
server's task fit (core/task_fit.py) on the outcomes since the task's start; where the
drift flag is up at a refit and a fit on the recent window is clearly better
(core/outcomes/refit.py), the task restarts from that window. Figures: the held-out tail's
log-loss and ECE at each refit, the loop's against the global fit's (no loop), and the
prequential ones (each answer as it was given, before its outcome was fitted).

The drift case: the stream of one question switches source (up to STREAM outcomes of A,
then B's, all but a held-out tail of B); figures on B's held-out tail. "Flagged" is the first outcome after the switch
whose drift check flags; "recovered" the first refit after the switch from which the loop's
held-out log-loss on B is no more than one standard error (paired over B's tail) above a
fit on B's own STREAM outcomes alone, i.e. as good as a task that only ever saw B.

    .venv/bin/python evals/outcomes_replay.py --model qwen2.5-coder-1.5b

writes evals/results/outcomes-replay-<model>.md and .json and the pictures
docs/outcomes-replay-<model>.png and docs/outcomes-drift-<model>.png; with `--policy always`
(the window refit weighed at every refit rather than only under the flag) the results under
the same names with `-always` after the model's, and no pictures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openjev.core import calibration as calib
from openjev.core.calibration import TypeFit
from openjev.core.outcomes.drift import WINDOW, Outcome, drift_report
from openjev.core.outcomes.refit import log_loss, window_examples, window_refit
from openjev.core.readouts import ReadoutSpec
from openjev.core.task_figures import Figures, figures
from openjev.core.task_fit import MIN_EXAMPLES, Example, Params, fit_task, global_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_curve import ROOT
from task_sources import SOURCES, tasks

STREAM = 50
MIN_TAIL = 10  # a drift case's second source keeps at least this many answers held out
TARGET_PRECISION = 0.9


class Loop:
    """The server's loop on one task (module doc), replayed outcome by outcome."""

    def __init__(self, base: TypeFit | None, width: int, every: int, window: int, policy: str = "flagged") -> None:
        self.base, self.every, self.window, self.policy = base, every, window, policy
        self.params: Params = global_params(base, width)
        self.fit = "global"
        self.outcomes: list[Outcome] = []
        self.estimates: dict[str, Figures] = {}
        self.start = 0
        self.flags: list[bool] = []
        self.window_refits: list[int] = []

    def observe(self, e: Example) -> list[float]:
        """Answer `e` with the current fit, take its outcome, check drift, refit on schedule."""
        probs = self.params.probs(e.logs)
        self.outcomes.append(Outcome(tuple(probs), e.gold, self.fit, e.logs))
        flagged = drift_report(self.outcomes, self.estimates, window=self.window).flagged
        self.flags.append(flagged)
        if len(self.outcomes) % self.every == 0:
            self.refit(flagged)
        return probs

    def refit(self, flagged: bool) -> None:
        count = len(self.outcomes)
        # the window refit is weighed where the drift flag is up ("flagged", the default), or
        # at every refit ("always")
        if (flagged or self.policy == "always") and count - self.start > self.window >= MIN_EXAMPLES:
            if window_refit(self.outcomes, self.base, window=self.window).better:
                self.start = count - self.window
                self.window_refits.append(count)
        since = self.outcomes[self.start :]
        if len(since) >= MIN_EXAMPLES:
            fit = fit_task(window_examples(since, len(since)), self.base, TARGET_PRECISION)
            self.params, self.fit = fit.params, f"task@{count}"
            self.estimates[self.fit] = fit.after


def held_out(params: Params, tail: Sequence[Example]) -> tuple[list[float], Figures]:
    """Per-answer log-loss of `params` on the tail, and its figures there."""
    rows = [(params.probs(e.logs), e.gold) for e in tail]
    return [log_loss(p, g) for p, g in rows], figures(rows)


def point(params: Params, tail: Sequence[Example]) -> dict[str, float]:
    losses, f = held_out(params, tail)
    return {"log_loss": statistics.fmean(losses), "ece": f.ece, "ece_debiased": f.ece_debiased}


def replay(
    examples: list[Example], base: TypeFit | None, draw: int, every: int, window: int, policy: str
) -> dict[str, Any]:
    """One draw of the loop on one task: held-out figures per refit, prequential figures."""
    order = random.Random(draw).sample(examples, len(examples))
    stream, tail = order[:STREAM], order[STREAM:]
    prior = global_params(base, len(examples[0].logs))
    loop = Loop(base, len(examples[0].logs), every, window, policy)
    curve = {0: point(loop.params, tail)}
    given, plain = [], []
    for k, e in enumerate(stream, 1):
        given.append((loop.observe(e), e.gold))
        plain.append((prior.probs(e.logs), e.gold))
        if k % every == 0:
            curve[k] = point(loop.params, tail)
    prequential = {
        name: {"log_loss": statistics.fmean(log_loss(p, g) for p, g in rows), "ece": figures(rows).ece}
        for name, rows in (("loop", given), ("global", plain))
    }
    return {
        "held_out": len(tail),
        "global": point(prior, tail),
        "loop": curve,
        "prequential": prequential,
        "flagged_checks": sum(loop.flags),
        "window_refits": len(loop.window_refits),
    }


def drift_replay(
    first: list[Example], second: list[Example], base: TypeFit | None, draw: int, every: int, window: int, policy: str
) -> dict[str, Any]:
    """One draw of the drift case: up to STREAM outcomes of `first`, then of `second` (all but
    a held-out tail of at least MIN_TAIL); figures on that tail, keyed by outcomes after the switch."""
    rng = random.Random(draw)
    a = rng.sample(first, len(first))[:STREAM]
    b = rng.sample(second, len(second))
    cut = min(STREAM, len(b) - MIN_TAIL)
    b_stream, tail = b[:cut], b[cut:]
    switch = len(a)
    reference = fit_task(b_stream, base, TARGET_PRECISION).params
    ref_losses, _ = held_out(reference, tail)
    loop = Loop(base, len(first[0].logs), every, window, policy)
    curve: dict[int, dict[str, float]] = {}
    recovered = None
    for k, e in enumerate(a + b_stream, 1):
        loop.observe(e)
        if k >= switch and ((k - switch) % every == 0 or k == switch + cut):
            losses, f = held_out(loop.params, tail)
            curve[k - switch] = {"log_loss": statistics.fmean(losses), "ece_debiased": f.ece_debiased}
            if recovered is None and _within_one_se(losses, ref_losses):
                recovered = k - switch
    return {
        "flag_after": next((i + 1 for i, f in enumerate(loop.flags[switch:]) if f), None),
        "flagged_before": any(loop.flags[:switch]),
        "recovered_after": recovered,
        "window_refits": [k - switch for k in loop.window_refits if k > switch],
        "switch": switch,
        "held_out": len(tail),
        "loop": curve,
        "global": point(global_params(base, len(first[0].logs)), tail),
        "reference": point(reference, tail),
    }


def _within_one_se(losses: Sequence[float], ref: Sequence[float]) -> bool:
    diffs = [x - y for x, y in zip(losses, ref, strict=True)]
    return statistics.fmean(diffs) <= statistics.stdev(diffs) / math.sqrt(len(diffs))


def mean_of(draws: Sequence[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.fmean(d[key] for d in draws) for key in draws[0]}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over draws of one task's replays."""
    steps = sorted(runs[0]["loop"])
    return {
        "held_out": statistics.fmean(r["held_out"] for r in runs),
        "global": mean_of([r["global"] for r in runs]),
        "loop": {k: mean_of([r["loop"][k] for r in runs]) for k in steps},
        "prequential": {n: mean_of([r["prequential"][n] for r in runs]) for n in ("loop", "global")},
        "flagged_checks": statistics.fmean(r["flagged_checks"] for r in runs),
        "window_refits": statistics.fmean(r["window_refits"] for r in runs),
    }


def summarise_drift(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over draws of one drift case: how often and how soon it was flagged and recovered."""
    flags = [r["flag_after"] for r in runs if r["flag_after"] is not None]
    recovered = [r["recovered_after"] for r in runs if r["recovered_after"] is not None]
    steps = sorted(runs[0]["loop"])
    return {
        "draws": len(runs),
        "switch": runs[0]["switch"],
        "held_out": statistics.fmean(r["held_out"] for r in runs),
        "flagged": len(flags),
        "flag_after_median": statistics.median(flags) if flags else None,
        "flag_after_range": [min(flags), max(flags)] if flags else None,
        "flagged_before_switch": sum(r["flagged_before"] for r in runs),
        "recovered": len(recovered),
        "recovered_after_median": statistics.median(recovered) if recovered else None,
        "window_refits": sum(len(r["window_refits"]) for r in runs),
        "loop": {k: mean_of([r["loop"][k] for r in runs]) for k in steps},
        "global": mean_of([r["global"] for r in runs]),
        "reference": mean_of([r["reference"] for r in runs]),
    }


def load_tasks(model: str, base: calib.Calibration, cache_dir: str) -> dict[str, tuple[str, list[Example]]]:
    """Per "source/question": its type and recorded answers; typed decisions' yes/no questions
    pooled as one ("typed-decisions/noul": 5 answers per wording, 30 in all)."""
    out = {f"{s}/{q}": got for s in SOURCES for q, got in tasks(model, s, base, cache_dir).items()}
    pooled = [
        e for qtype, ex in tasks(model, "typed-decisions", base, cache_dir).values() if qtype == "noul" for e in ex
    ]
    out["typed-decisions/noul"] = ("noul", pooled)
    return out


def drift_cases() -> list[tuple[str, str]]:
    """(A, B) task keys: the same question from one vader source to another, and the yes/no
    question of each vader source to typed decisions' yes/no questions and back."""
    pairs = [("vader-tweets", "vader-movies"), ("vader-movies", "vader-tweets")]
    same = [(f"{a}/{q}", f"{b}/{q}") for q in ("positive", "tone", "sentiment") for a, b in pairs]
    typed = [(f"{s}/positive", "typed-decisions/noul") for s in SOURCES]
    return same + typed + [("typed-decisions/noul", f"{s}/positive") for s in SOURCES]


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = calib.load(ROOT / "src" / "openjev" / "calibrations" / f"{args.model}.json")
    all_tasks = load_tasks(args.model, base, args.cache_dir)

    def fit_of(key: str) -> TypeFit | None:
        return base.fit_for(ReadoutSpec("letters", 1), all_tasks[key][0])

    replays = {}
    for key, (qtype, examples) in all_tasks.items():
        if len(examples) < STREAM + MIN_TAIL:
            continue
        runs = [replay(examples, fit_of(key), r, args.every, args.window, args.policy) for r in range(args.repeats)]
        replays[key] = {"type": qtype, "n": len(examples), **summarise(runs)}
        print(f"replayed {key}", file=sys.stderr)
    drifts = {}
    for a, b in drift_cases():
        runs = [
            drift_replay(all_tasks[a][1], all_tasks[b][1], fit_of(a), r, args.every, args.window, args.policy)
            for r in range(args.drift_repeats)
        ]
        drifts[f"{a} -> {b}"] = summarise_drift(runs)
        print(f"drift {a} -> {b}", file=sys.stderr)
    skipped = {k: len(ex) for k, (_, ex) in all_tasks.items() if len(ex) < STREAM + MIN_TAIL}
    settings = {
        "every": args.every,
        "window": args.window,
        "policy": args.policy,
        "stream": STREAM,
        "repeats": args.repeats,
    }
    return {
        "settings": {**settings, "drift_repeats": args.drift_repeats},
        "replays": replays,
        "drift": drifts,
        "too_few": skipped,
    }


def _arrow(before: float, after: float) -> str:
    return f"{before:.3f} -> **{after:.3f}**" if after < before else f"{before:.3f} -> {after:.3f}"


def markdown(results: dict[str, Any], model: str) -> str:
    s = results["settings"]
    lines = [
        f"### {model}: the loop on held-out sources ({s['stream']} outcomes per question, refit every "
        f"{s['every']}, drift window {s['window']}, window refit weighed: {s['policy']}; {s['repeats']} draws)",
        "",
        "| source | question (type, answers) | held out | log-loss: global -> loop | ECE: global -> loop "
        "| ECE debiased | prequential log-loss | prequential ECE | flagged checks | holds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results["replays"].items():
        g, last = r["global"], r["loop"][max(r["loop"])]
        pg, pl = r["prequential"]["global"], r["prequential"]["loop"]
        holds = "yes" if last["log_loss"] < g["log_loss"] and last["ece"] < g["ece"] else "**no**"
        source, q = key.split("/")
        lines.append(
            f"| {source} | {q} ({r['type']}, {r['n']}) | {r['held_out']:.0f} | {_arrow(g['log_loss'], last['log_loss'])} "
            f"| {_arrow(g['ece'], last['ece'])} | {_arrow(g['ece_debiased'], last['ece_debiased'])} "
            f"| {_arrow(pg['log_loss'], pl['log_loss'])} | {_arrow(pg['ece'], pl['ece'])} "
            f"| {r['flagged_checks']:.1f} / {s['stream']} | {holds} |"
        )
    lines += [
        "",
        f"### {model}: drift (the stream switches from A to B; {s['drift_repeats']} draws; "
        "figures on B's held-out answers)",
        "",
        "| A (outcomes) -> B (outcomes, held out) | flagged | outcomes to the flag (median, range) | flagged before the switch | recovered "
        "| outcomes to recover (median) | log-loss: global / at the switch / last / fit on B alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, d in results["drift"].items():
        loop = d["loop"]
        a, b = case.split(" -> ")
        case = f"{a} ({d['switch']}) -> {b} ({max(loop)}, {d['held_out']:.0f})"
        rng = (
            f"{d['flag_after_median']:g} ({d['flag_after_range'][0]}-{d['flag_after_range'][1]})"
            if d["flagged"]
            else "-"
        )
        rec = f"{d['recovered_after_median']:g}" if d["recovered"] else "-"
        lines.append(
            f"| {case} | {d['flagged']}/{d['draws']} | {rng} | {d['flagged_before_switch']}/{d['draws']} "
            f"| {d['recovered']}/{d['draws']} | {rec} | {d['global']['log_loss']:.3f} / {loop[min(loop)]['log_loss']:.3f} "
            f"/ {loop[max(loop)]['log_loss']:.3f} / {d['reference']['log_loss']:.3f} |"
        )
    if results["too_few"]:
        few = ", ".join(f"{k} ({n})" for k, n in results["too_few"].items())
        lines += ["", f"Not replayed (fewer than {s['stream'] + MIN_TAIL} answers): {few}."]
    return "\n".join(lines) + "\n"


def pictures(results: dict[str, Any], model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    replays = results["replays"]
    columns = 3
    rows = -(-len(replays) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.7 * rows), squeeze=False)
    for ax, (key, r) in zip([a for row in axes for a in row], replays.items(), strict=False):
        steps = sorted(r["loop"], key=int)
        right = ax.twinx()
        for axis, metric, color, label in ((ax, "log_loss", "#4c72b0", "log-loss"), (right, "ece", "#dd8452", "ECE")):
            axis.plot(
                [int(k) for k in steps],
                [r["loop"][k][metric] for k in steps],
                "o-",
                color=color,
                label=f"{label}, with the loop",
            )
            axis.axhline(r["global"][metric], color=color, linestyle="--", label=f"{label}, global fit (no loop)")
            axis.tick_params(labelsize=6, colors=color, axis="y")
        ax.tick_params(labelsize=6, axis="x")
        ax.set_title(key.replace("vader-", ""), fontsize=8)
        ax.set_xlabel("outcomes", fontsize=7)
        ax.set_ylabel("held-out log-loss", fontsize=7, color="#4c72b0")
        right.set_ylabel("held-out ECE", fontsize=7, color="#dd8452")
        if ax is axes[0][0]:
            lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
            ax.legend(lines, [line.get_label() for line in lines], fontsize=5, loc="lower left")
    title = f"{model}: outcomes replayed, per question, refit every {results['settings']['every']}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"outcomes-replay-{model}.png", dpi=110)
    plt.close(fig)
    drift_picture(results, model, plt)


def drift_picture(results: dict[str, Any], model: str, plt: Any) -> None:
    cases = results["drift"]
    columns = 3
    rows = -(-len(cases) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.3 * columns, 2.6 * rows), squeeze=False)
    for ax, (case, d) in zip([a for row in axes for a in row], cases.items(), strict=False):
        steps = sorted(d["loop"], key=int)
        ax.plot([int(k) for k in steps], [d["loop"][k]["log_loss"] for k in steps], "o-", label="with the loop")
        ax.axhline(d["global"]["log_loss"], color="#dd8452", linestyle="--", label="global fit")
        ax.axhline(d["reference"]["log_loss"], color="grey", linestyle=":", label="fit on B alone")
        if d["flagged"]:
            ax.axvline(d["flag_after_median"], color="#c44e52", linewidth=1, label="flag (median)")
        ax.set_title(case.replace("vader-", "").replace(" -> ", " ->\n"), fontsize=7)
        ax.set_xlabel("outcomes after the switch", fontsize=7)
        ax.tick_params(labelsize=6)
    for row in axes:
        row[0].set_ylabel("log-loss on B (held out)", fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{model}: the stream switches source (A -> B)", fontsize=9)
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / f"outcomes-drift-{model}.png", dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--every", type=int, default=10, help="refit every N outcomes (the server's schedule)")
    p.add_argument("--window", type=int, default=WINDOW, help="the drift check's recent window")
    p.add_argument("--repeats", type=int, default=10, help="draws per question")
    p.add_argument("--drift-repeats", type=int, default=5, help="draws per drift case")
    p.add_argument(
        "--policy",
        choices=("flagged", "always"),
        default="flagged",
        help="weigh a refit on the recent window only where the drift flag is up, or at every refit",
    )
    p.add_argument("--cache-dir", default="~/.cache/openjev")
    p.add_argument("--pictures-only", action="store_true", help="redraw the pictures from the results' JSON")
    args = p.parse_args()
    name = args.model if args.policy == "flagged" else f"{args.model}-{args.policy}"
    if args.pictures_only:
        pictures(json.loads((ROOT / "evals" / "results" / f"outcomes-replay-{name}.json").read_text()), name)
        return 0
    results = run(args)
    if args.policy == "flagged":  # the docs' pictures are the default loop's
        pictures(results, name)
    out = ROOT / "evals" / "results"
    (out / f"outcomes-replay-{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    text = markdown(results, name)
    (out / f"outcomes-replay-{name}.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
