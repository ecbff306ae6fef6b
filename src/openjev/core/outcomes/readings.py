"""What a decision keeps of each question so that a task can be refitted on it later with
no engine work: the option log-probabilities a task's fit consumes (core/task_fit.py
`Example.logs`), i.e. the readout's combined probabilities after the global fit's position
prior and nothing else of the global fit, exactly as a task's labelled example is read
(api/server/task_jobs.py `logs_of`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from openjev.core import calibration as calib
from openjev.core.task_fit import Example
from openjev.core.types import Combined

_FLOOR = 1e-12


def fit_logs(combined: Combined, base: calib.TypeFit | None) -> tuple[float, ...]:
    """Per option, the log-probability a task's fit reads: `combined` after `base`'s
    position prior (the global fit's temperature and bias are the fit's to replace)."""
    prior = calib.TypeFit(1.0, (), dict(base.position_prior)) if base is not None else calib.TypeFit(1.0)
    probs = calib.apply(prior, combined.probs, combined.shown, combined.clones, combined.mirrored)
    return tuple(math.log(max(p, _FLOOR)) for p in probs)


def examples_of(rows: Iterable[tuple[Sequence[float], int]], cap: int) -> list[Example]:
    """Task examples from stored (logs, gold) rows, at most the last `cap` of them (the
    rows in time order: the most recent kept). Rows whose gold is not one of their options
    are skipped (a stored row never has one; this keeps the fit's input valid regardless)."""
    out = [Example(tuple(logs), gold) for logs, gold in rows if 0 <= gold < len(logs)]
    return out[-cap:] if cap > 0 else []
