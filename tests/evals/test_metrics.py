import math

import pytest

from openjev.evals.metrics import Scored, by_type, reliability, summarize


def test_hand_computed_metrics():
    scored = [
        Scored("noul", (0.8, 0.2), 0),  # right, confident-ish
        Scored("noul", (0.95, 0.05), 1),  # wrong, very confident
        Scored("choice", (0.5, 0.3, 0.2), 0, flipped=False),
        Scored("choice", (0.1, 0.9, 0.0), 1, flipped=True),
    ]
    s = summarize(scored)
    assert s["questions"] == 4
    assert s["accuracy"] == 0.75
    brier = [(0.2**2 + 0.2**2), (0.95**2 + 0.95**2), (0.5**2 + 0.3**2 + 0.2**2), (0.1**2 + 0.1**2)]
    assert s["brier"] == pytest.approx(sum(brier) / 4)
    assert s["nll"] == pytest.approx(-(math.log(0.8) + math.log(0.05) + math.log(0.5) + math.log(0.9)) / 4)
    # bins of 1/15: 0.8 -> bin 12, 0.95 -> 14, 0.5 -> 7, 0.9 -> 13; each alone
    assert s["ece"] == pytest.approx((abs(1 - 0.8) + abs(0 - 0.95) + abs(1 - 0.5) + abs(1 - 0.9)) / 4)
    assert s["coverage_at_0.9"] == 0.5 and s["accuracy_at_0.9"] == 0.5
    assert s["order_flip_rate"] == 0.5


def test_reliability_bins_and_ties():
    bins = reliability([Scored("noul", (0.5, 0.5), 0), Scored("noul", (0.5, 0.5), 1), Scored("noul", (1.0, 0.0), 0)])
    assert bins[7] == (2, 0.5, 0.5)  # ties take the first option: one right, one wrong
    assert bins[14] == (1, 1.0, 1.0)  # p = 1 falls in the last bin
    assert sum(count for count, _, _ in bins) == 3


def test_by_type_and_empty_groups():
    out = by_type([Scored("score", (0.2, 0.8), 1)])
    assert out["noul"] == {"questions": 0} and out["score"]["accuracy"] == 1.0 and out["all"]["questions"] == 1
    assert out["score"]["order_flip_rate"] is None and out["score"]["accuracy_at_0.9"] is None


def test_coverage_and_accuracy_on_the_answered_questions():
    scored = [
        Scored("noul", (0.8, 0.2), 0),  # answered, right
        Scored("noul", (0.6, 0.4), 1, abstained=True),  # declined (wrong, but not counted)
        Scored("choice", (0.2, 0.8), 0),  # answered, wrong
        Scored("choice", (0.9, 0.1), 0, abstained=True),  # declined (right, not counted either)
    ]
    s = summarize(scored)
    assert s["accuracy"] == 0.5  # every question, declined or not
    assert s["coverage"] == 0.5 and s["accuracy_answered"] == 0.5
    assert summarize(scored[:2])["accuracy_answered"] == 1.0
    assert summarize([scored[1]])["coverage"] == 0.0 and summarize([scored[1]])["accuracy_answered"] is None
