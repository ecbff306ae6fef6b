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


def _mixed_nll(fit, part):
    lam = fit["uniform_weight"]
    fitted = []
    for s in part:
        probs = calib.apply(calib.TypeFit(fit["temperature"]), s.probs)
        fitted.append(Scored("choice", tuple((1 - lam) * p + lam / len(probs) for p in probs), s.correct))
    return summarize(fitted)["nll"]


def test_the_uniform_mix_bounds_a_confident_mistake_without_flattening_the_rest():
    """A kind of text the model knows, and one where it is right with confidence except for
    every third answer, wrong with the same confidence: a temperature can only pay for those
    mistakes by flattening every answer; with the uniform mix the worst-group fit pays with
    λ instead, keeps a sharper temperature, and its worst group costs clearly less than any
    temperature alone can make it, at no real cost to the other group."""
    from openjev.evals.fit import UNIFORM_WEIGHTS, fit_type_worst_group, fit_type_worst_group_uniform

    def top(s):
        return max(range(len(s.probs)), key=s.probs.__getitem__)

    good = synthetic(300, sharpen=2.0, bias_a=0.0, seed=3)
    wrong = synthetic(60, sharpen=2.0, bias_a=0.0, seed=4)
    bad = [Scored("choice", s.probs, (top(s) + 1) % 4 if i % 3 == 0 else top(s)) for i, s in enumerate(wrong)]
    samples, groups = good + bad, ["good"] * len(good) + ["bad"] * len(bad)
    t_only, mixed = fit_type_worst_group(samples, groups), fit_type_worst_group_uniform(samples, groups)
    t_only["uniform_weight"] = 0.0
    assert 0.0 < mixed["uniform_weight"] < 1.0 and mixed["uniform_weight"] in UNIFORM_WEIGHTS
    assert mixed["temperature"] < t_only["temperature"] / 2
    worst = max(_mixed_nll(mixed, good), _mixed_nll(mixed, bad))
    assert worst == pytest.approx(mixed["worst_group_nll"], abs=1e-6)
    assert worst < max(_mixed_nll(t_only, good), _mixed_nll(t_only, bad)) - 0.05
    assert _mixed_nll(mixed, good) < _mixed_nll(t_only, good) + 0.01


def test_the_held_out_uniform_mix_is_judged_on_groups_its_temperature_never_saw():
    """Three kinds of text the model reads well and one it reads wrong with confidence: the
    leave-one-group-out choice of λ sees the wrong group held out, and mixes (λ > 0); with
    every group read well it does not (λ = 0)."""
    from openjev.evals.fit import fit_type_held_out_uniform

    good = [synthetic(120, sharpen=1.0, bias_a=0.0, seed=s) for s in (5, 6, 7)]
    wrong = synthetic(60, sharpen=1.0, bias_a=0.0, seed=8)
    bad = [Scored("choice", s.probs, (s.top + 1 + i % 3) % 4) for i, s in enumerate(wrong)]
    parts = [*good, bad]
    samples = [s for part in parts for s in part]
    groups = [f"g{k}" for k, part in enumerate(parts) for _ in part]
    assert fit_type_held_out_uniform(samples, groups)["uniform_weight"] > 0.0
    clean = [s for part in good for s in part]
    clean_groups = [f"g{k}" for k, part in enumerate(good) for _ in part]
    assert fit_type_held_out_uniform(clean, clean_groups)["uniform_weight"] == 0.0


def test_the_worst_group_over_a_guess_is_not_the_group_with_the_longest_scales():
    """By NLL alone, a group of 5-option questions the model reads well is still 'worse' than
    a group of 2-option questions it reads wrong (log 5 against log 2 for a guess), so the
    plain worst-group T serves the first and leaves the second above a guess; judged by each
    group's excess over its own guess, the fit flattens until the wrong group is next to a
    guess, and the well-read group stays better than one."""
    from openjev.evals.fit import fit_type_worst_excess, fit_type_worst_group

    long = synthetic(200, sharpen=1.0, bias_a=0.0, seed=5, k=5)
    short = [Scored("choice", (0.8, 0.2), 0 if i % 20 < 9 else 1) for i in range(60)]  # 55 % on the 0.2 side
    samples, groups = long + short, ["long"] * len(long) + ["short"] * len(short)
    plain, excess = fit_type_worst_group(samples, groups), fit_type_worst_excess(samples, groups)

    def over_guess(fit, part):
        fitted = [Scored("choice", calib.apply(calib.TypeFit(fit["temperature"]), s.probs), s.correct) for s in part]
        return summarize(fitted)["nll"] - math.fsum(math.log(len(s.probs)) for s in part) / len(part)

    assert over_guess(plain, short) > 0.1  # the plain form sacrificed the short group
    assert excess["temperature"] > plain["temperature"]
    assert 0 < over_guess(excess, short) < 0.01 and over_guess(excess, long) < 0
    assert excess["worst_group_excess"] == pytest.approx(
        max(over_guess(excess, long), over_guess(excess, short)), abs=1e-6
    )
