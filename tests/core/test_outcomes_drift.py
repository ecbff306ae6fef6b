"""Drift on a task's outcomes (core/outcomes/drift.py, refit.py): the stated rule's
false-alarm rate and power measured by simulation with seeded generators, the window's
figures per answering fit, and the window refit's choice."""

import math
import random

import pytest

from openjev.core.outcomes.drift import ALPHA, Outcome, brier, critical_z, drift_report
from openjev.core.outcomes.refit import window_examples, window_refit
from openjev.core.task_figures import figures
from openjev.core.task_fit import Params, fit_task


def reading(rng, n):
    """A reading's log-probabilities over `n` options (normalised)."""
    logs = [rng.gauss(0, 2) for _ in range(n)]
    top = max(logs)
    norm = math.log(math.fsum(math.exp(v - top) for v in logs)) + top
    return tuple(v - norm for v in logs)


def stream(rng, count, n, stated, truth, fit="task"):
    """`count` outcomes: probabilities stated by `stated` (Params), gold drawn from `truth`'s."""
    out = []
    for _ in range(count):
        logs = reading(rng, n)
        gold = rng.choices(range(n), weights=truth.probs(logs))[0]
        out.append(Outcome(tuple(stated.probs(logs)), gold, fit, logs))
    return out


def flag_rate(stated, truth_estimate, truth_window, runs, n=3, m=50, window=40, seed=0):
    """How often a window of `window` answers under `truth_window` is flagged against an
    estimate measured on `m` answers under `truth_estimate` (the same `stated` fit)."""
    flags = 0
    for r in range(runs):
        rng = random.Random(seed * 100_000 + r)
        est = figures([(o.probs, o.gold) for o in stream(rng, m, n, stated, truth_estimate)])
        recent = stream(rng, window, n, stated, truth_window)
        flags += drift_report(recent, {"task": est}, window=window).flagged
    return flags / runs


CALIBRATED = Params(1.0, (0.0, 0.0, 0.0))
OVERCONFIDENT = Params(2.0, (0.0, 0.0, 0.0))


def flat(scale, n):
    return Params(scale, (0.0,) * n)


@pytest.mark.parametrize(
    ("stated", "n"),
    [(flat(1.0, 2), 2), (CALIBRATED, 3), (OVERCONFIDENT, 3), (flat(2.0, 5), 5)],
    ids=["calibrated-2", "calibrated-3", "overconfident-3", "overconfident-5"],
)
def test_a_stream_that_did_not_drift_rarely_flags(stated, n):
    # the aim: at most 2.5 false alarms per 100 checks (module doc); 1500 windows measure
    # the rate within about +-0.3 %. A stationary but miscalibrated fit is no drift: its estimate said so
    assert ALPHA == 0.03
    assert flag_rate(stated, flat(1.0, n), flat(1.0, n), runs=1500, n=n) <= 0.025


def test_a_stream_that_drifted_flags():
    # the same stated probabilities, the truth flatter than before (the text got harder):
    # a calibrated fit becomes over-confident
    assert flag_rate(CALIBRATED, CALIBRATED, flat(0.2, 3), runs=300, seed=1) >= 0.75
    assert flag_rate(CALIBRATED, CALIBRATED, flat(0.35, 3), runs=300, seed=1) >= 0.4
    # and a small shift several times as often as the false-alarm rate (0.7 % here)
    assert flag_rate(CALIBRATED, CALIBRATED, flat(0.7, 3), runs=300, seed=2) > 0.03


def test_a_sharp_change_is_flagged_within_about_ten_answers():
    # 30 answers as the estimate said, then the readings stop telling the answer: the short
    # scale flags before the window is mostly new answers
    flagged_at = []
    for r in range(40):
        rng = random.Random(500 + r)
        est = figures([(o.probs, o.gold) for o in stream(rng, 50, 2, flat(1.0, 2), flat(1.0, 2))])
        seq = stream(rng, 30, 2, flat(1.0, 2), flat(1.0, 2)) + stream(rng, 20, 2, flat(1.0, 2), flat(-1.0, 2))
        hits = [k for k in range(31, 51) if drift_report(seq[:k], {"task": est}).flagged]
        flagged_at.append(hits[0] - 30 if hits else None)
    soon = [k for k in flagged_at if k is not None and k <= 12]
    assert len(soon) >= 30


def test_a_stream_better_than_its_estimate_does_not_flag():
    sharper = Params(2.0, (0.0, 0.0, 0.0))  # the truth more certain: answers beat the estimate
    assert flag_rate(CALIBRATED, CALIBRATED, sharper, runs=300, seed=3) == 0.0


def test_a_task_fits_estimate_holds_on_its_own_stream():
    # the real estimate (nested cross-validated, core/task_fit.py) of a fit on 50 examples,
    # then 40 new answers by that fit from the same truth: no flag; the truth changed: flag
    truth = Params(0.5, (0.0, 0.4, -0.3))
    flags = drifted = 0
    for r in range(12):
        rng = random.Random(r)
        seen = stream(rng, 50, 3, truth, truth)
        fit = fit_task(window_examples(seen, 50), None, 0.9)
        flags += drift_report(stream(rng, 40, 3, fit.params, truth), {"task": fit.after}).flagged
        shifted = Params(0.0, (0.0, 0.0, 0.0))  # the readings no longer tell the answer
        drifted += drift_report(stream(rng, 40, 3, fit.params, shifted), {"task": fit.after}).flagged
    assert flags <= 1
    assert drifted >= 8


def test_the_window_is_shown_per_answering_fit_and_only_estimated_fits_are_tested():
    rng = random.Random(7)
    old = stream(rng, 30, 2, CALIBRATED, CALIBRATED, fit="global")
    new = stream(rng, 25, 2, CALIBRATED, CALIBRATED, fit="task:a@2")
    est = figures([(o.probs, o.gold) for o in stream(rng, 60, 2, CALIBRATED, CALIBRATED)])
    report = drift_report(old + new, {"task:a@2": est}, window=40)
    assert [(p.fit, p.window.n) for p in report.parts] == [("global", 15), ("task:a@2", 25)]
    assert report.parts[0].estimate is None and report.parts[1].estimate == est
    assert report.window is not None and report.window.n == 40
    assert [(t.scale, t.n, t.estimate_n) for t in report.tests] == [(10, 10, 60), (20, 20, 60), (40, 25, 60)]
    assert report.tests[2].z is None  # 25 tested answers: no verdict at 40
    d = [brier(o.probs, o.gold) - est.brier for o in new]
    assert report.tests[1].excess_brier == pytest.approx(sum(d[-20:]) / 20)
    assert report.tests[0].critical == pytest.approx(critical_z(ALPHA / 3))
    assert report.describe()["by_fit"][1]["fit"] == "task:a@2"


def test_too_few_tested_answers_give_no_verdict():
    rng = random.Random(8)
    recent = stream(rng, 9, 2, CALIBRATED, Params(0.05, (0.0, 0.0)))
    est = figures([(o.probs, o.gold) for o in stream(rng, 50, 2, CALIBRATED, CALIBRATED)])
    report = drift_report(recent, {"task": est})
    assert all(t.z is None for t in report.tests) and not report.flagged
    assert drift_report([], {}).window is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="gold"):
        drift_report([Outcome((0.5, 0.5), 2, "g")], {})
    with pytest.raises(ValueError, match="window"):
        drift_report([], {}, window=0)
    with pytest.raises(ValueError, match="scale"):
        drift_report([], {}, window=20, scales=(10, 40))
    with pytest.raises(ValueError, match="alpha"):
        critical_z(0.0)
    assert critical_z(0.01) == pytest.approx(2.326, abs=1e-3)
    assert critical_z(ALPHA) == pytest.approx(1.881, abs=1e-3)


def test_a_window_refit_is_chosen_after_drift_and_not_without_it():
    truth = Params(1.0, (0.0, 0.0, 0.0))
    shifted = Params(0.3, (0.0, 1.0, -1.0))
    rng = random.Random(11)
    # answers stated by a fit right for the old truth; the window drawn from the new one
    choice = window_refit(stream(rng, 40, 3, truth, shifted), None)
    assert choice.n == 40 and choice.better
    assert choice.window_log_loss < choice.current_log_loss - choice.se
    # answers stated by the right fit: a refit on 40 of them is no clear gain
    held = [window_refit(stream(random.Random(20 + r), 40, 3, truth, truth), None).better for r in range(5)]
    assert sum(held) <= 1


def test_a_window_refit_needs_readings():
    with pytest.raises(ValueError, match="reading"):
        window_refit([Outcome((0.5, 0.5), 0, "g")] * 12, None)
    with pytest.raises(ValueError, match="at least"):
        window_refit([Outcome((0.5, 0.5), 0, "g", (-0.7, -0.7))] * 5, None)
