import math

import pytest

from openjev.core import scoring


def test_softmax_hand_computed():
    # logprobs ln(0.2), ln(0.6), ln(0.2) renormalise to themselves
    probs = scoring.softmax([math.log(0.2), math.log(0.6), math.log(0.2)])
    assert probs == pytest.approx([0.2, 0.6, 0.2], abs=1e-12)


def test_softmax_renormalises_partial_mass():
    # the labels hold 0.5 of the mass, split 0.4 / 0.1 -> 0.8 / 0.2
    probs = scoring.softmax([math.log(0.4), math.log(0.1)])
    assert probs == pytest.approx([0.8, 0.2], abs=1e-12)
    assert scoring.label_mass([math.log(0.4), math.log(0.1)]) == pytest.approx(0.5)


def test_softmax_is_stable_for_extreme_values():
    probs = scoring.softmax([-1000.0, -1001.0])
    assert probs == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])


def test_softmax_temperature():
    # T=2 halves the log-odds: ln(4) -> ln(2), so 0.8/0.2 -> 2/3, 1/3
    probs = scoring.softmax([math.log(0.8), math.log(0.2)], temperature=2.0)
    assert probs == pytest.approx([2 / 3, 1 / 3])


def test_softmax_minus_inf_gets_zero_and_all_minus_inf_raises():
    assert scoring.softmax([0.0, -math.inf]) == [1.0, 0.0]
    with pytest.raises(ValueError):  # noqa: PT011 - the type is the contract here, not the message
        scoring.softmax([-math.inf, -math.inf])
    with pytest.raises(ValueError):  # noqa: PT011 - the type is the contract here, not the message
        scoring.softmax([0.0, math.nan])
    with pytest.raises(ValueError):  # noqa: PT011 - the type is the contract here, not the message
        scoring.softmax([0.0, 1.0], temperature=0)


def test_choice_confidence_vendor_formula():
    # (max p - 1/n) / (1 - 1/n): n=4, max .7 -> (.7-.25)/.75 = .6
    assert scoring.choice_confidence([0.7, 0.1, 0.1, 0.1]) == pytest.approx(0.6)
    assert scoring.choice_confidence([0.25] * 4) == pytest.approx(0.0)
    assert scoring.choice_confidence([1.0, 0.0]) == pytest.approx(1.0)
    assert scoring.choice_confidence([1.0]) == 1.0


def test_score_confidence_vendor_formula():
    # n=3, p=[.2,.6,.2]: k=1, spread = .2*1+.2*1 = .4, D = (1+0+1)/3 = 2/3 -> 1 - .4/(2/3) = .4
    assert scoring.score_confidence([0.2, 0.6, 0.2]) == pytest.approx(0.4)
    # uniform over 4 levels: k=0, spread = (0+1+2+3)/4 = 1.5, D = (1.5+.5+.5+1.5)/4 = 1 -> clipped to 0
    assert scoring.score_confidence([0.25] * 4) == 0.0
    assert scoring.score_confidence([0, 0, 1.0]) == pytest.approx(1.0)
    assert scoring.score_confidence([1.0]) == 1.0


def test_expectation_is_over_level_indices():
    assert scoring.expectation([0.2, 0.6, 0.2]) == pytest.approx(1.0)
    assert scoring.expectation([0.0, 0.0, 0.0, 1.0]) == pytest.approx(3.0)


def test_argmax_first_on_ties():
    assert scoring.argmax([0.4, 0.4, 0.2]) == 0
    assert scoring.argmax([0.1, 0.2, 0.7]) == 2
