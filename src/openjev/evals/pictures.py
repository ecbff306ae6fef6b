"""`openjev eval --report`: the pictures of a run, for people who look rather than read, and
one HTML page that shows them with the run's table.

- reliability.png (evals/report.py): per type, accuracy against the top probability;
- confidence.png: per type, how often each top probability was given, right and wrong apart;
- coverage.png: per type, the abstain rule's trade: the accuracy of the answers kept against
  the share kept, as the floor on the top probability (`--abstain-min-confidence`) rises;
- report.html: the three and the run's summary table.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openjev.evals.metrics import Scored

TYPES = ("noul", "choice", "score")


def coverage_curve(scored: Sequence[Scored]) -> list[tuple[float, float, float]]:
    """(floor, coverage, accuracy of the answers kept) for each distinct top probability as
    the floor, highest first: what the abstain rule's confidence floor trades."""
    ranked = sorted(((s.probs[s.top], s.top == s.correct) for s in scored), key=lambda r: -r[0])
    out, right = [], 0
    for k, (conf, hit) in enumerate(ranked, 1):
        right += hit
        if k == len(ranked) or ranked[k][0] != conf:
            out.append((conf, k / len(ranked), right / k))
    return out


def _axes(plt: Any, scored: Sequence[Scored]) -> tuple[Any, Any, list[str]]:
    types = [t for t in TYPES if any(s.qtype == t for s in scored)] + ["all"]
    fig, axes = plt.subplots(1, len(types), figsize=(3.2 * len(types), 3.2), squeeze=False)
    return fig, axes[0], types


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def confidence_png(scored: Sequence[Scored], path: Path, title: str) -> None:
    plt = _pyplot()
    fig, axes, types = _axes(plt, scored)
    bins = [i / 20 for i in range(21)]
    for ax, qtype in zip(axes, types, strict=True):
        subset = [s for s in scored if qtype == "all" or s.qtype == qtype]
        right = [s.probs[s.top] for s in subset if s.top == s.correct]
        wrong = [s.probs[s.top] for s in subset if s.top != s.correct]
        ax.hist([right, wrong], bins=bins, stacked=True, color=["#4c72b0", "#dd8452"], label=["right", "wrong"])
        ax.set_title(f"{qtype} (n={len(subset)})", fontsize=9)
        ax.set_xlabel("top probability", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("answers", fontsize=8)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def coverage_png(scored: Sequence[Scored], path: Path, title: str) -> None:
    plt = _pyplot()
    fig, axes, types = _axes(plt, scored)
    for ax, qtype in zip(axes, types, strict=True):
        subset = [s for s in scored if qtype == "all" or s.qtype == qtype]
        curve = coverage_curve(subset)
        ax.plot([c for _, c, _ in curve], [a for _, _, a in curve], "-", color="#4c72b0")
        for floor in (0.6, 0.8, 0.9):  # where some floors fall on the curve
            kept = [(c, a) for f, c, a in curve if f >= floor]
            if kept:
                ax.plot(*kept[-1], "o", color="#dd8452", markersize=4)
                ax.annotate(f"{floor:g}", kept[-1], fontsize=6, xytext=(3, -8), textcoords="offset points")
        ax.set_xlim(0, 1.02)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{qtype} (n={len(subset)})", fontsize=9)
        ax.set_xlabel("coverage (share answered)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("accuracy of the answered", fontsize=8)
    fig.suptitle(title + ": the confidence floor's trade (points: floors 0.6, 0.8, 0.9)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(folder: Path, scored: Sequence[Scored], title: str, table: str) -> Path:
    """confidence.png, coverage.png and report.html beside reliability.png; the page's path."""
    confidence_png(scored, folder / "confidence.png", title)
    coverage_png(scored, folder / "coverage.png", title)
    page = folder / "report.html"
    images = "".join(
        f'<h2>{html.escape(caption)}</h2><img src="{name}" alt="{html.escape(caption)}">'
        for name, caption in (
            ("reliability.png", "Reliability per question type"),
            ("confidence.png", "How confident the answers were"),
            ("coverage.png", "The abstain rule: accuracy against coverage"),
        )
    )
    page.write_text(
        f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<h1>{html.escape(title)}</h1><pre>{html.escape(table)}</pre>{images}\n"
    )
    return page
