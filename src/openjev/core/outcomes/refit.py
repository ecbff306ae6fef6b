"""Refit on the recent window, when that is better.

After drift, a task's fit rests mostly on answers of text it no longer sees; a fit on the
recent window alone may answer better. The comparison is honest on both sides: the current
answers are the probabilities the answering fits gave when they answered (they had not seen
those outcomes), and the window's fit is the whole task fit procedure (core/task_fit.py,
form and shrinkage chosen by cross-validation) run without each answer's fold: nested
cross-validation, so the choice does not flatter it. Both are scored by log-loss per answer,
paired; the window's fit is better where its mean loss is lower by more than one standard
error of the paired difference (the rule task_fit uses to leave the global fit), so a
window's noise does not replace a fit that still holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from openjev.core.calibration import TypeFit
from openjev.core.outcomes.drift import WINDOW, Outcome
from openjev.core.task_fit import FOLDS, MIN_EXAMPLES, Example, global_params, honest_predictions

_FLOOR = 1e-12


@dataclass(frozen=True)
class RefitChoice:
    """Whether a fit on the `n` window outcomes is better than the answers given (module
    doc): both mean log-losses per answer, the standard error of their paired difference,
    and the verdict."""

    n: int
    current_log_loss: float
    window_log_loss: float
    se: float
    better: bool

    def describe(self) -> dict[str, object]:
        return {
            "n": self.n,
            "current_log_loss": self.current_log_loss,
            "window_log_loss": self.window_log_loss,
            "se": self.se,
            "better": self.better,
        }


def window_examples(outcomes: Sequence[Outcome], window: int = WINDOW) -> list[Example]:
    """The last `window` outcomes as a task's examples. ValueError where one has no reading."""
    out = []
    for o in outcomes[-window:]:
        if o.logs is None or len(o.logs) != len(o.probs):
            raise ValueError("an outcome without its reading cannot be refitted on")
        out.append(Example(o.logs, o.gold))
    return out


def log_loss(probs: Sequence[float], gold: int) -> float:
    return -math.log(max(probs[gold], _FLOOR))


def window_refit(
    outcomes: Sequence[Outcome],
    base: TypeFit | None,
    *,
    window: int = WINDOW,
    folds: int = FOLDS,
    seed: int = 0,
) -> RefitChoice:
    """The module doc's comparison on the last `window` outcomes, the window's fit starting
    from the global fit `base` as every task fit does. ValueError for fewer than
    MIN_EXAMPLES outcomes, outcomes without readings, or differing option counts. The fit
    itself, where chosen, is `fit_task(window_examples(outcomes, window), base, ...)`."""
    examples = window_examples(outcomes, window)
    if len(examples) < MIN_EXAMPLES:
        raise ValueError(f"a window refit needs at least {MIN_EXAMPLES} outcomes, it has {len(examples)}")
    width = len(examples[0].logs)
    if any(len(e.logs) != width for e in examples):
        raise ValueError("every outcome must read the task's options")
    predicted = honest_predictions(examples, global_params(base, width), min(folds, len(examples)), seed)
    given = outcomes[-window:]
    current = [log_loss(o.probs, o.gold) for o in given]
    refit = [log_loss(p, e.gold) for p, e in zip(predicted, examples, strict=True)]
    diffs = [c - r for c, r in zip(current, refit, strict=True)]
    n = len(diffs)
    mean = math.fsum(diffs) / n
    se = math.sqrt(math.fsum((x - mean) ** 2 for x in diffs) / (n - 1) / n)
    return RefitChoice(n, math.fsum(current) / n, math.fsum(refit) / n, se, mean > se)
