"""Per-task calibration (core/task_fit.py, core/task_figures.py): known answers on
examples drawn from a model whose miscalibration is known."""

import math
import random

import pytest

from openjev.core.calibration import TypeFit, apply
from openjev.core.task_figures import figures, threshold
from openjev.core.task_fit import Example, Params, fit_task, global_params, honest_predictions, nll, solve


def drawn(count, n, true_scale, true_bias=None, seed=1):
    """Examples whose gold is drawn from softmax(true_scale * l + true_bias): a model that
    reads l is calibrated by a = true_scale (T = 1 / true_scale)."""
    rng = random.Random(seed)
    bias = true_bias or (0.0,) * n
    truth = Params(true_scale, tuple(bias))
    out = []
    for _ in range(count):
        logs = [rng.gauss(0, 2) for _ in range(n)]
        top = max(logs)
        norm = math.log(math.fsum(math.exp(v - top) for v in logs)) + top
        logs = tuple(v - norm for v in logs)
        p = truth.probs(logs)
        gold = rng.choices(range(n), weights=p)[0]
        out.append(Example(logs, gold))
    return out


def test_figures_by_hand():
    rows = [((0.9, 0.1), 0), ((0.8, 0.2), 1), ((0.5, 0.5), 0), ((0.3, 0.7), 1)]
    f = figures(rows)
    assert f.n == 4
    assert f.accuracy == pytest.approx(3 / 4)  # the tie picks the first option, gold there
    assert f.brier == pytest.approx((2 * 0.01 + 2 * 0.64 + 2 * 0.25 + 2 * 0.09) / 4)
    # bins of 1/15: 0.9 alone (right), 0.8 alone (wrong), 0.5 alone (right), 0.7 alone (right)
    assert f.ece == pytest.approx((0.1 + 0.8 + 0.5 + 0.3) / 4)
    # each bin's squared gap less the variance of its hit rate, floored at 0: only the 0.8
    # answer that was wrong is off by more than its own noise (0.64 - 0.16)
    assert f.ece_debiased == pytest.approx(math.sqrt(0.64 - 0.16) / 4)


def _mean_ece(size, scale, debiased, runs=300):
    """Mean ECE of `runs` draws of `size` answers of a 3-option task whose true probabilities
    are the shown ones at temperature 1/scale (scale 1: calibrated)."""
    rng = random.Random(size)
    total = 0.0
    for _ in range(runs):
        rows = []
        for _ in range(size):
            shown = Params(1.0, (0.0, 0.0, 0.0)).probs([rng.gauss(0, 2) for _ in range(3)])
            truth = Params(scale, (0.0, 0.0, 0.0)).probs([math.log(p) for p in shown])
            rows.append((shown, rng.choices(range(3), weights=truth)[0]))
        f = figures(rows)
        total += f.ece_debiased if debiased else f.ece
    return total / runs


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_debiased_ece_compares_across_sizes_where_ece_does_not(scale):
    raw = _mean_ece(20, scale, False) - _mean_ece(50, scale, False)
    debiased = _mean_ece(20, scale, True) - _mean_ece(50, scale, True)
    assert raw > 0.04  # the fewer answers, the larger the ECE, whatever the calibration
    assert abs(debiased) < 0.03


def test_threshold_reaches_the_target_with_the_most_coverage():
    rows = [((0.95, 0.05), 0), ((0.9, 0.1), 0), ((0.85, 0.15), 1), ((0.8, 0.2), 0), ((0.6, 0.4), 1)]
    t = threshold(rows, 0.75)
    assert t.min_confidence == pytest.approx(0.8)  # 3 of the top 4 right: 0.75
    assert t.coverage == pytest.approx(4 / 5)
    assert t.precision == pytest.approx(3 / 4)
    strict = threshold(rows, 1.0)
    assert (strict.min_confidence, strict.coverage, strict.precision) == (pytest.approx(0.9), 0.4, 1.0)


def test_threshold_out_of_reach_declines_all_below_certainty():
    t = threshold([((0.6, 0.4), 1), ((0.7, 0.3), 1)], 0.9)
    assert (t.min_confidence, t.coverage, t.precision) == (1.0, 0.0, 0.0)


def test_solve_recovers_a_known_temperature():
    examples = drawn(3000, 3, true_scale=0.5)  # an over-confident model: T = 2
    fitted = solve(examples, Params(1.0, (0.0, 0.0, 0.0)), 0.0, with_bias=False)
    assert 1 / fitted.scale == pytest.approx(2.0, rel=0.1)


def test_solve_recovers_a_known_bias():
    examples = drawn(4000, 2, true_scale=1.0, true_bias=(0.0, 1.0))
    fitted = solve(examples, Params(1.0, (0.0, 0.0)), 0.0, with_bias=True)
    assert fitted.scale == pytest.approx(1.0, rel=0.15)
    assert fitted.bias[1] == pytest.approx(1.0, abs=0.15)


def test_shrinkage_holds_the_fit_to_the_global_one():
    examples = drawn(10, 3, true_scale=0.3)
    prior = Params(1.0, (0.0, 0.0, 0.0))
    near = solve(examples, prior, 1e6, with_bias=True)
    assert near.scale == pytest.approx(1.0, abs=1e-3)
    assert all(abs(b) < 1e-3 for b in near.bias)


def test_a_miscalibrated_task_gets_its_own_fit_and_a_lower_cross_validated_ece():
    examples = drawn(200, 3, true_scale=0.4)
    fit = fit_task(examples, None, 0.8)
    assert fit.form != "global"
    assert 1 / fit.params.scale == pytest.approx(2.5, rel=0.3)
    assert fit.after.ece < fit.before.ece
    assert fit.cv_nll[min(fit.cv_nll, key=fit.cv_nll.get)] < fit.cv_nll["global"]


def mean_excess(count, base, runs=20):
    """The fit on `count` examples against the global fit, by their NLL per example on 2,000
    fresh examples of the same task (the truth: T = 2), averaged over `runs` draws."""
    fresh = drawn(2000, 2, true_scale=0.5, seed=999)
    prior = global_params(base, 2)
    excess = []
    for seed in range(runs):
        fit = fit_task(drawn(count, 2, true_scale=0.5, seed=seed), base, 0.9)
        excess.append((nll(fit.params, fresh) - nll(prior, fresh)) / len(fresh))
    return sum(excess) / runs


def test_ten_examples_cannot_move_a_right_global_fit_far():
    assert mean_excess(10, TypeFit(2.0)) < 0.02  # nats per example, on fresh examples


def test_fifty_examples_correct_a_wrong_global_fit():
    assert mean_excess(50, TypeFit(1.0)) < -0.02


def test_the_fit_applies_as_the_core_applies_it():
    base = TypeFit(1.5, (0.0, 0.3), {2: (0.6, 0.4)})
    examples = drawn(60, 2, true_scale=0.5, seed=4)
    fit = fit_task(examples, base, 0.9)
    applied = fit.type_fit(base)
    assert applied.position_prior == base.position_prior
    probs = (0.7, 0.3)
    logs = [math.log(p) for p in probs]
    assert apply(applied, probs) == pytest.approx(tuple(fit.params.probs(logs)))


def test_global_params_are_the_fit_itself():
    base = TypeFit(2.0, (0.5, 1.0))
    logs = [math.log(0.7), math.log(0.3)]
    assert global_params(base, 2).probs(logs) == pytest.approx(list(apply(base, (0.7, 0.3))))


def test_too_few_or_inconsistent_examples_are_refused():
    with pytest.raises(ValueError, match="at least 10"):
        fit_task(drawn(9, 2, 1.0), None, 0.9)
    bad = [*drawn(10, 2, 1.0), Example((0.0, 0.0, 0.0), 0)]
    with pytest.raises(ValueError, match="options"):
        fit_task(bad, None, 0.9)


def test_the_reported_figures_never_see_the_example_they_predict():
    examples = drawn(20, 2, true_scale=0.4, seed=5)
    prior = Params(1.0, (0.0, 0.0))
    before = honest_predictions(examples, prior, 5, 0)
    flipped = [*examples[:3], Example(examples[3].logs, 1 - examples[3].gold), *examples[4:]]
    after = honest_predictions(flipped, prior, 5, 0)
    assert after[3] == before[3]  # its own gold changed nothing of its prediction
    assert after != before  # but its fold's neighbours were predicted by fits that saw it
