"""What a run leaves behind: summary.json, summary.md (a markdown table per question type)
and reliability.png (a reliability diagram per type; matplotlib, headless)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openjev.evals.metrics import Scored, reliability

COLUMNS = [
    ("questions", "n", "{:d}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("brier", "Brier", "{:.3f}"),
    ("nll", "NLL", "{:.3f}"),
    ("ece", "ECE", "{:.3f}"),
    ("accuracy_at_0.9", "acc@p>=0.9", "{:.3f}"),
    ("coverage_at_0.9", "coverage@0.9", "{:.3f}"),
    ("order_flip_rate", "order flips", "{:.3f}"),
    ("coverage", "coverage", "{:.3f}"),
    ("accuracy_answered", "acc. answered", "{:.3f}"),
]


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def markdown(summary: dict[str, Any], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| type | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for qtype in ("noul", "choice", "score", "all"):
        row = summary["metrics"][qtype]
        if not row.get("questions"):
            continue
        lines.append(f"| {qtype} | " + " | ".join(_cell(row.get(k), f) for k, _, f in COLUMNS) + " |")
    facts = summary["run"]
    lines += [
        "",
        f"readout `{facts['readout']}`, calibration `{facts['calibration']}`; "
        f"{facts['items'] - facts['items_failed']}/{facts['items']} requests answered; "
        f"p50 latency {_cell(facts['latency_ms_p50'], '{:.0f}')} ms; "
        f"tokens computed per request {_cell(facts['tokens_computed_per_request'], '{:.1f}')}; "
        f"declined by the abstain rule {_cell(facts.get('abstained_share'), '{:.0%}')}: "
        "coverage is the share answered, acc. answered the accuracy on those "
        "(evals/abstain_table.py: accuracy against coverage over a grid of floors)",
    ]
    inv = summary.get("invariance")
    if inv:
        lines += ["", f"{inv['suite']} invariance relations (share of tests that hold, tolerance 0.05; no labels):", ""]
        lines += ["| relation | holds | tests |", "|---|---|---|"]
        for name, share in inv["relations"].items():
            lines.append(f"| {name} | {_cell(share, '{:.3f}')} | {inv['tests'].get(name, 0)} |")
        if inv.get("errors"):
            lines.append(f"\n{inv['errors']} jevbench requests failed: their relations are left unscored")
    return "\n".join(lines) + "\n"


def reliability_png(scored: Sequence[Scored], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    types = [t for t in ("noul", "choice", "score") if any(s.qtype == t for s in scored)] + ["all"]
    fig, axes = plt.subplots(1, len(types), figsize=(3.2 * len(types), 3.4), squeeze=False)
    for ax, qtype in zip(axes[0], types, strict=True):
        subset = [s for s in scored if qtype == "all" or s.qtype == qtype]
        bins = reliability(subset)
        width = 1.0 / len(bins)
        xs = [(i + 0.5) * width for i, (count, _, _) in enumerate(bins) if count]
        accs = [acc for count, _, acc in bins if count]
        confs = [conf for count, conf, _ in bins if count]
        ax.bar(xs, accs, width=width * 0.9, color="#4c72b0", label="accuracy")
        # Where the bin's answers claimed to be: the gap to the bar is the miscalibration.
        ax.plot(xs, confs, "_", color="#dd8452", markersize=9, markeredgewidth=2, label="mean top probability")
        ax.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{qtype} (n={len(subset)})", fontsize=9)
        ax.set_xlabel("top probability", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("accuracy", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(folder: str | Path, summary: dict[str, Any], scored: Sequence[Scored], title: str) -> None:
    folder = Path(folder)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "summary.md").write_text(markdown(summary, title))
    reliability_png(scored, folder / "reliability.png", title)
