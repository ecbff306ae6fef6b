"""Calibration fitting recovers what was put into synthetic data, and keeps a prior
correction only where held-out error says it helps."""

import math
import random

import pytest

from openjev.core import calibration as calib
from openjev.evals.fit import fit_readout, fit_type
from openjev.evals.metrics import Scored, summarize


def _softmax(z):
    top = max(z)
    w = [math.exp(x - top) for x in z]
    return tuple(x / sum(w) for x in w)


def synthetic(n: int, *, sharpen: float, bias_a: float, seed: int, k: int = 4) -> list[Scored]:
    """Questions whose true distribution is known; the 'model' reports it sharpened by
    `sharpen` and with `bias_a` extra log-odds on position 0."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        logits = [rng.gauss(0, 1.2) for _ in range(k)]
        truth = _softmax(logits)
        correct = rng.choices(range(k), weights=truth)[0]
        reported = _softmax([x * sharpen + (bias_a if i == 0 else 0.0) for i, x in enumerate(logits)])
        out.append(Scored("choice", reported, correct))
    return out


def test_temperature_undoes_overconfidence_and_no_prior_without_bias():
    fit = fit_type(synthetic(600, sharpen=3.0, bias_a=0.0, seed=1))
    assert fit["temperature"] == pytest.approx(3.0, rel=0.25)
    assert fit["form"] == "temperature" and fit["bias"] == []
    assert fit["nll_after"] < fit["nll_before"]


def test_a_position_bias_gets_a_prior_correction_that_improves_held_out_data():
    train = synthetic(600, sharpen=1.0, bias_a=1.5, seed=2)
    test = synthetic(600, sharpen=1.0, bias_a=1.5, seed=3)
    fit = fit_type(train)
    assert fit["form"] == "temperature+prior"
    # the model adds 1.5 to position 0; the fit lifts every other position instead (the ridge shrinks it)
    assert fit["bias"][0] == 0.0 and all(0.5 < b < 2.0 for b in fit["bias"][1:])
    tf = calib.TypeFit(fit["temperature"], tuple(fit["bias"]))
    before = summarize(test)
    after = summarize([Scored(s.qtype, calib.apply(tf, s.probs), s.correct) for s in test])
    assert after["nll"] < before["nll"] and after["ece"] < before["ece"]


def test_types_with_too_few_questions_are_left_out():
    few = [Scored("noul", (0.6, 0.4), 0)] * 5
    many = [Scored("score", (0.7, 0.3), i % 2) for i in range(40)]
    fits = fit_readout(few + many)
    assert set(fits) == {"score"}
    assert fits["score"]["temperature"] > 1  # 70 % confident, 50 % right: soften


def test_a_temperature_only_fit_never_takes_a_prior():
    samples = [Scored("choice", (0.7, 0.2, 0.1), i % 3) for i in range(60)]  # position 0 over-predicted
    assert fit_type(samples)["form"] in ("temperature", "temperature+prior")
    only = fit_type(samples, prior=False)
    assert only["form"] == "temperature" and only["bias"] == [] and "temperature+prior" in only["cv_nll"]


def test_the_worst_group_temperature_trades_the_pooled_optimum_for_the_group_it_would_sacrifice():
    """One kind of text where the model knows the answers, a smaller one where it is confidently
    wrong: the pooled T serves the first and costs the second far more than a uniform guess;
    the worst-group T flattens until the two cost the same, still better than a guess on both."""
    from openjev.evals.fit import fit_type_worst_group

    good = synthetic(300, sharpen=1.0, bias_a=0.0, seed=3)
    wrong = synthetic(60, sharpen=1.0, bias_a=0.0, seed=4)
    bad = [Scored("choice", s.probs, (s.top + 1 + i % 3) % 4) for i, s in enumerate(wrong)]  # never the top
    samples, groups = good + bad, ["good"] * len(good) + ["bad"] * len(bad)
    pooled, robust = fit_type(samples, prior=False), fit_type_worst_group(samples, groups)

    def nll(fit, part):
        fitted = [Scored("choice", calib.apply(calib.TypeFit(fit["temperature"]), s.probs), s.correct) for s in part]
        return summarize(fitted)["nll"]

    assert robust["temperature"] > pooled["temperature"]
    assert nll(robust, bad) < nll(pooled, bad) and nll(pooled, bad) > math.log(4)
    assert robust["worst_group_nll"] == pytest.approx(max(nll(robust, good), nll(robust, bad)), abs=1e-6)
    assert nll(robust, good) < math.log(4)
