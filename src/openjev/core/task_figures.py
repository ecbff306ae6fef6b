"""Figures of one task's answers: accuracy, Brier, ECE, and the abstain threshold that
reaches a target precision. Pure functions, stdlib only; the same definitions as the eval
tooling (evals/metrics.py): ECE over 15 equal-width bins of the top probability, Brier
summed over options.

ECE measured on few answers is inflated by their noise alone (a perfectly calibrated
answerer shows about 0.19 on 20 answers, 0.12 on 50), so figures on different numbers of
answers cannot be compared by it. `ece_debiased` takes that noise out bin by bin: each
bin's squared gap minus the variance its hit rate would have were its confidences right,
floored at 0 (the squared-error correction of Kumar et al., 2019, "Verified uncertainty
calibration", applied per bin to the L1 gap). It estimates the ECE of many answers; its
error is within about 0.03 from 20 answers to 50 in simulation (docs/api-tasks.md).

A row is (probabilities in option order, the index of the gold option).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from openjev.core.scoring import argmax

ECE_BINS = 15

Row = tuple[Sequence[float], int]


@dataclass(frozen=True)
class Figures:
    """`n` answers: their accuracy (top option is gold), mean Brier, ECE and ECE with the
    noise of `n` answers taken out (module doc)."""

    n: int
    accuracy: float
    brier: float
    ece: float
    ece_debiased: float

    def describe(self) -> dict[str, float | int]:
        return {
            "n": self.n,
            "accuracy": self.accuracy,
            "brier": self.brier,
            "ece": self.ece,
            "ece_debiased": self.ece_debiased,
        }


@dataclass(frozen=True)
class Threshold:
    """The abstain rule's `min_confidence` for a target precision: answers whose top
    probability is at least `min_confidence` are answered, the rest declined; `coverage`
    is the share answered and `precision` their accuracy (on the rows it was chosen on)."""

    target_precision: float
    min_confidence: float
    coverage: float
    precision: float

    def describe(self) -> dict[str, float]:
        return {
            "target_precision": self.target_precision,
            "min_confidence": self.min_confidence,
            "coverage": self.coverage,
            "precision": self.precision,
        }


def figures(rows: Sequence[Row]) -> Figures:
    if not rows:
        raise ValueError("no rows to measure")
    n = len(rows)
    hits = [argmax(p) == gold for p, gold in rows]
    brier = math.fsum(math.fsum((q - (i == gold)) ** 2 for i, q in enumerate(p)) for p, gold in rows) / n
    bins: list[list[tuple[float, bool]]] = [[] for _ in range(ECE_BINS)]
    for (p, _), hit in zip(rows, hits, strict=True):
        conf = max(p)
        bins[min(ECE_BINS - 1, int(conf * ECE_BINS))].append((conf, hit))
    # per bin: its answers, the gap of its mean confidence to its hit rate, and the variance
    # that hit rate would have were the confidences right
    gaps = [
        (
            len(b),
            (math.fsum(c for c, _ in b) - sum(h for _, h in b)) / len(b),
            math.fsum(c * (1 - c) for c, _ in b) / len(b) ** 2,
        )
        for b in bins
        if b
    ]
    ece = math.fsum(size * abs(gap) for size, gap, _ in gaps) / n
    debiased = math.fsum(size * math.sqrt(max(0.0, gap * gap - noise)) for size, gap, noise in gaps) / n
    return Figures(n=n, accuracy=sum(hits) / n, brier=brier, ece=ece, ece_debiased=debiased)


def threshold(rows: Sequence[Row], target_precision: float) -> Threshold:
    """The lowest `min_confidence` whose answered rows reach `target_precision` (so the
    largest coverage that does); where no cut reaches it, 1.0 (every answer below certainty
    declined) with the coverage and precision that leaves."""
    if not rows:
        raise ValueError("no rows to choose a threshold on")
    ranked = sorted(((max(p), argmax(p) == gold) for p, gold in rows), key=lambda r: -r[0])
    best: tuple[float, int, int] | None = None  # (cut, answered, right)
    right = 0
    for k, (conf, hit) in enumerate(ranked, 1):
        right += hit
        # a cut can only fall between distinct confidences: ties are answered together
        if k < len(ranked) and ranked[k][0] == conf:
            continue
        if right / k >= target_precision:
            best = (conf, k, right)
    if best is None:
        answered = [hit for conf, hit in ranked if conf >= 1.0]
        precision = sum(answered) / len(answered) if answered else 0.0
        return Threshold(target_precision, 1.0, len(answered) / len(ranked), precision)
    cut, answered_n, right_n = best
    return Threshold(target_precision, cut, answered_n / len(ranked), right_n / answered_n)
