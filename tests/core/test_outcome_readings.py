"""core/outcomes: a decision's kept reading is exactly what a task's example reading is, and
the refit schedule (first fit at MIN_EXAMPLES, then every N outcomes, at most every T s)."""

from __future__ import annotations

import math

import pytest

from openjev.api.server.task_jobs import logs_of
from openjev.core import calibration as calib
from openjev.core.outcomes.readings import examples_of, fit_logs
from openjev.core.outcomes.schedule import REFIT_EVERY, REFIT_MIN_INTERVAL_S, refit_due
from openjev.core.task_fit import MIN_EXAMPLES
from openjev.core.types import Combined


class _Readout:
    """A readout whose combine hands back a fixed Combined (the seam logs_of reads through)."""

    def __init__(self, combined: Combined) -> None:
        self.combined = combined

    def combine(self, question, logprobs):
        return self.combined


@pytest.mark.parametrize("mirrored", [False, True])
def test_a_kept_reading_is_what_a_task_example_reads(mirrored):
    combined = Combined(probs=(0.5, 0.3, 0.2), label_mass=0.9, shown=(2, 0, 1), mirrored=mirrored)
    base = calib.TypeFit(0.7, (0.0, 0.4, -0.2), {3: (0.5, 0.3, 0.2)})
    kept = fit_logs(combined, base)
    assert kept == logs_of(_Readout(combined), None, [], base)  # type: ignore[arg-type]
    # the position prior moved it; the global fit's temperature and bias did not
    assert kept != tuple(math.log(p) for p in combined.probs)
    unprior = fit_logs(combined, calib.TypeFit(0.7, (0.0, 0.4, -0.2)))
    assert unprior == pytest.approx(tuple(math.log(p) for p in combined.probs))
    assert fit_logs(combined, None) == pytest.approx(tuple(math.log(p) for p in combined.probs))


def test_examples_of_keeps_the_most_recent_and_drops_impossible_golds():
    rows = [((0.0, -1.0), i % 2) for i in range(10)] + [((0.0, -1.0), 5)]
    got = examples_of(rows, 4)
    assert [e.gold for e in got] == [0, 1, 0, 1] and len(got) == 4
    assert examples_of(rows, 0) == []


def test_the_refit_schedule():
    few = MIN_EXAMPLES - 1
    assert not refit_due(pending=few, readings=few, last_fit=None, now=0.0).now  # too few to fit
    assert refit_due(pending=1, readings=MIN_EXAMPLES, last_fit=None, now=0.0).now  # first fit at once
    assert not refit_due(pending=0, readings=100, last_fit=0.0, now=1e9).now  # nothing new
    fitted = 1000.0
    waiting = refit_due(REFIT_EVERY - 1, 100, fitted, fitted + 1e6)
    assert not waiting.now and waiting.after_s is None  # not enough new outcomes
    soon = refit_due(REFIT_EVERY, 100, fitted, fitted + 5.0)
    assert not soon.now and soon.after_s == pytest.approx(REFIT_MIN_INTERVAL_S - 5.0)  # at most every T s
    assert refit_due(REFIT_EVERY, 100, fitted, fitted + REFIT_MIN_INTERVAL_S).now
