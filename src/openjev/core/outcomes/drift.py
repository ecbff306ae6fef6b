"""Drift: is a task's recent window of answers worse than its fit said it would be?

The input is a task's outcomes in time order, each with the probabilities the answering fit
gave, the true answer and which fit answered, and each fit's own cross-validated figures
(`TaskFit.after`, core/task_fit.py: nested cross-validated, so honest about its own
examples). The recent window is the last `window` outcomes; its figures (accuracy, Brier,
ECE and debiased ECE, core/task_figures.py) are given per answering fit, beside that fit's
estimate.

"Beyond noise", stated so that it can be tested: per answer i of the window whose fit F(i)
has an estimate, d_i = Brier_i - Brier_F(i), the answer's Brier less its fit's estimated
mean Brier. Were the answers drawn from the fit's own examples' distribution, the mean of
d over n of them is 0 up to the noise of those answers (sd(d) / sqrt(n)) and of the
estimate itself (the same spread over the m examples it rests on: sd(d) / sqrt(m)). At each
scale s of `scales` (10, 20 and 40: the last s tested answers; a scale with fewer answers
gives no verdict) the task is flagged when

    z = mean(d) / (sd(d) * sqrt(1/n + 1/m)) > the normal quantile of 1 - alpha / len(scales)

with m the fewest examples an estimate among those answers rests on, and alpha = 0.03 over
the scales together (each at 0.01, z > 2.33; Bonferroni). The short scale sees a sharp
change within about 10 answers, the long one a mild change that needs 40. The aim is at
most 2.5 false alarms in 100 checks of a stream that has not drifted. Brier per answer is
skewed to the right (most answers cost little, a confident miss much), which makes the
normal quantile conservative: measured by simulation (tests/core/test_outcomes_drift.py,
seeded), the three scales flag 0.7-1.7 % of such windows, whether the fit is calibrated or
consistently over-confident, on 2, 3 or 5 options. Checks on overlapping windows are
correlated, so a stream checked after every outcome still sees a lone flag now and then:
act on a flag that persists, or on the refit's own test (core/outcomes/refit.py).
Brier, not log-loss, because the estimate a fit carries is its Brier (`Figures`); Brier is
bounded, so a few confident misses do not swamp the mean. Answers of a fit without an estimate (the global fit: never checked on the
caller's text) are shown, not tested.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from openjev.core.task_figures import Figures, figures

WINDOW = 40
SCALES = (10, 20, 40)
ALPHA = 0.03
_SE_FLOOR = 1e-9


@dataclass(frozen=True)
class Outcome:
    """One answered question whose true answer came back: `probs` the answering fit gave
    (in the question's option order), `gold` the true option's index, `fit` which fit
    answered (any stable name: "global", "task:<id>@<version>"), and `logs` the reading as a
    task's fit sees it (core/task_fit.py `Example.logs`; needed only to refit)."""

    probs: tuple[float, ...]
    gold: int
    fit: str
    logs: tuple[float, ...] | None = None


@dataclass(frozen=True)
class WindowPart:
    """The window's answers given by one fit: their figures, and the fit's estimate (None
    where the fit has none)."""

    fit: str
    window: Figures
    estimate: Figures | None

    def describe(self) -> dict[str, object]:
        return {
            "fit": self.fit,
            "window": self.window.describe(),
            "estimate": self.estimate.describe() if self.estimate is not None else None,
        }


@dataclass(frozen=True)
class DriftTest:
    """The test of the module doc on the last `scale` window answers whose fit has an
    estimate: `n` of them there were (no verdict, None figures, below `scale`), `excess_brier`
    is mean(d), `se` its standard error, `z` their ratio, `critical` the z that flags,
    `estimate_n` is m."""

    scale: int
    n: int
    estimate_n: int
    excess_brier: float | None
    se: float | None
    z: float | None
    critical: float
    flagged: bool

    def describe(self) -> dict[str, object]:
        return {
            "scale": self.scale,
            "n": self.n,
            "estimate_n": self.estimate_n,
            "excess_brier": self.excess_brier,
            "se": self.se,
            "z": self.z,
            "critical": self.critical,
            "flagged": self.flagged,
        }


@dataclass(frozen=True)
class DriftReport:
    """A task's recent window: its figures over every answer in it (None for no outcomes),
    per answering fit (in order of first appearance), and the drift tests, one per scale."""

    window: Figures | None
    parts: tuple[WindowPart, ...]
    tests: tuple[DriftTest, ...]

    @property
    def flagged(self) -> bool:
        return any(t.flagged for t in self.tests)

    def describe(self) -> dict[str, object]:
        return {
            "flagged": self.flagged,
            "window": self.window.describe() if self.window is not None else None,
            "by_fit": [part.describe() for part in self.parts],
            "tests": [t.describe() for t in self.tests],
        }


def brier(probs: Sequence[float], gold: int) -> float:
    """One answer's Brier score, summed over options (task_figures' definition, per answer)."""
    return math.fsum((q - (i == gold)) ** 2 for i, q in enumerate(probs))


def critical_z(alpha: float) -> float:
    """The one-sided normal quantile a z must pass to flag at false-alarm rate `alpha`."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    return NormalDist().inv_cdf(1.0 - alpha)


def drift_report(
    outcomes: Sequence[Outcome],
    estimates: Mapping[str, Figures],
    *,
    window: int = WINDOW,
    scales: Sequence[int] = SCALES,
    alpha: float = ALPHA,
) -> DriftReport:
    """The report on the last `window` of `outcomes` (oldest first); `estimates` maps a
    fit's name to its cross-validated figures; the test at each of `scales` (module doc).
    ValueError for a window below 1, scales outside 2..window, or an outcome whose gold is
    not one of its options."""
    if window < 1:
        raise ValueError("the window holds at least one outcome")
    if not scales or any(not 2 <= s <= window for s in scales):
        raise ValueError("every scale is between 2 answers and the window")
    recent = list(outcomes[-window:])
    if any(not 0 <= o.gold < len(o.probs) for o in recent):
        raise ValueError("every outcome's gold must be one of its options")
    by_fit: dict[str, list[Outcome]] = {}
    for o in recent:
        by_fit.setdefault(o.fit, []).append(o)
    parts = tuple(
        WindowPart(fit, figures([(o.probs, o.gold) for o in group]), estimates.get(fit))
        for fit, group in by_fit.items()
    )
    whole = figures([(o.probs, o.gold) for o in recent]) if recent else None
    tested = [o for o in recent if o.fit in estimates]
    tests = tuple(excess_test(tested[-s:], estimates, s, alpha / len(scales)) for s in scales)
    return DriftReport(whole, parts, tests)


def excess_test(tested: Sequence[Outcome], estimates: Mapping[str, Figures], scale: int, alpha: float) -> DriftTest:
    """The module doc's test on `tested` (every one's fit in `estimates`) at one scale."""
    critical = critical_z(alpha)
    n = len(tested)
    m = min((estimates[o.fit].n for o in tested), default=0)
    if n < scale or m < 2:
        return DriftTest(scale, n, m, None, None, None, critical, False)
    d = [brier(o.probs, o.gold) - estimates[o.fit].brier for o in tested]
    mean = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    se = max(sd * math.sqrt(1.0 / n + 1.0 / m), _SE_FLOOR)
    z = mean / se
    return DriftTest(scale, n, m, mean, se, z, critical, z > critical)
