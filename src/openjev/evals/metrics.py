"""Quality metrics over scored questions: accuracy, Brier, NLL, ECE, selective accuracy,
and the order-flip rate of choice questions. Pure functions, stdlib only.

Every question is a distribution over its options (noul: true, false; choice: in the
request's order; score: levels) and the index of the correct option.
- accuracy: the top option (first on ties) is the correct one;
- Brier: sum over options of (p - y)^2 (multi-class; 0 is perfect, 2 the worst);
- NLL: -ln p(correct), p floored at 1e-12;
- ECE: 15 equal-width bins of the top probability; sum over bins of
  (share of questions) x |accuracy - mean top probability|;
- accuracy at p >= 0.9 and its coverage (share of questions answered that confidently);
- order-flip rate: share of choice questions whose top option changes when the options
  are rotated by one position;
- under the server's abstain rule (core/abstain.py): coverage (share of questions answered,
  not declined) and accuracy on the answered ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ECE_BINS = 15
CONFIDENT = 0.9


@dataclass(frozen=True)
class Scored:
    qtype: str
    probs: tuple[float, ...]
    correct: int
    flipped: bool | None = None  # choice questions read in a rotated order too; None otherwise
    abstained: bool = False  # declined by the server's abstain rule (the answer's x_abstain)

    @property
    def top(self) -> int:
        best = 0
        for i, p in enumerate(self.probs):
            if p > self.probs[best]:
                best = i
        return best


def reliability(scored: Sequence[Scored], bins: int = ECE_BINS) -> list[tuple[int, float, float]]:
    """Per bin of top probability: (count, mean top probability, accuracy); empty bins (0, nan, nan)."""
    groups: list[list[Scored]] = [[] for _ in range(bins)]
    for s in scored:
        conf = s.probs[s.top]
        groups[min(bins - 1, int(conf * bins))].append(s)
    out = []
    for g in groups:
        if not g:
            out.append((0, math.nan, math.nan))
            continue
        out.append((len(g), math.fsum(s.probs[s.top] for s in g) / len(g), sum(s.top == s.correct for s in g) / len(g)))
    return out


def summarize(scored: Sequence[Scored]) -> dict[str, float | int | None]:
    n = len(scored)
    if n == 0:
        return {"questions": 0}
    brier = (
        math.fsum(math.fsum((p - (1.0 if i == s.correct else 0.0)) ** 2 for i, p in enumerate(s.probs)) for s in scored)
        / n
    )
    nll = math.fsum(-math.log(max(s.probs[s.correct], 1e-12)) for s in scored) / n
    ece = math.fsum(count / n * abs(acc - conf) for count, conf, acc in reliability(scored) if count)
    confident = [s for s in scored if s.probs[s.top] >= CONFIDENT]
    flips = [s.flipped for s in scored if s.flipped is not None]
    answered = [s for s in scored if not s.abstained]
    return {
        "questions": n,
        "accuracy": sum(s.top == s.correct for s in scored) / n,
        "brier": brier,
        "nll": nll,
        "ece": ece,
        "accuracy_at_0.9": sum(s.top == s.correct for s in confident) / len(confident) if confident else None,
        "coverage_at_0.9": len(confident) / n,
        "mean_confidence": math.fsum(s.probs[s.top] for s in scored) / n,
        "order_flip_rate": sum(flips) / len(flips) if flips else None,
        "coverage": len(answered) / n,
        "accuracy_answered": sum(s.top == s.correct for s in answered) / len(answered) if answered else None,
    }


def by_type(scored: Iterable[Scored]) -> dict[str, dict]:
    """summarize() per question type and overall ("all")."""
    scored = list(scored)
    out = {t: summarize([s for s in scored if s.qtype == t]) for t in ("noul", "choice", "score")}
    out["all"] = summarize(scored)
    return out
