"""The in-process engine's cost model (engines/cost_model.py): fitted on forwards' own
timings, it prices a long state with attention's growth, so the admission gate can refuse
what would pass the deadline (issue 28, item 8)."""

from __future__ import annotations

import pytest

from openjev.core.plan import Branch, Plan
from openjev.engines.cost_model import CostModel, attended

A, B = 1.0e-3, 6.3e-7  # the embedded model on a 2-core CPU: 1 ms/token, +21 ms at 32k context


def _forward(model: CostModel, start: int, count: int) -> None:
    model.observe(count, attended(start, count), A * count + B * attended(start, count))


def _plan(state: int, branches: int, own: int) -> Plan:
    prefix = tuple(range(10, 10 + state))
    return Plan.from_branches(
        [Branch(tuple(range(100_000 + k * own, 100_000 + (k + 1) * own)), (1,), prefix) for k in range(branches)]
    )


def test_nothing_is_priced_before_a_forward_was_measured():
    assert CostModel(576).estimate_s(_plan(100, 2, 5)) is None


def test_short_forwards_measure_the_rate_and_the_prior_prices_attention():
    model = CostModel(576)
    for _ in range(20):
        _forward(model, 0, 60)  # short requests only
    assert model.a == pytest.approx(A, rel=0.05)
    big = model.estimate_s(_plan(32_000, 128, 40))
    assert big is not None and big > 120  # the body cannot finish in 120 s
    small = model.estimate_s(_plan(200, 3, 20))
    assert small is not None and small < 1


def test_long_forwards_measure_attention_and_the_estimate_follows():
    model = CostModel(576)
    for start in range(0, 32_768, 512):
        _forward(model, start, 512)
    assert model.b == pytest.approx(B, rel=0.05)
    plan = _plan(32_000, 128, 40)
    truth = A * plan.unique_tokens + B * (attended(0, 32_000) + 128 * 40 * (32_000 + 19.5))
    assert model.estimate_s(plan) == pytest.approx(truth, rel=0.05)


def test_a_cached_prefix_is_free():
    model = CostModel(576)
    for start in range(0, 32_768, 512):
        _forward(model, start, 512)
    plan = _plan(32_000, 4, 40)
    cold, warm = model.estimate_s(plan), model.estimate_s(plan, cached=32_000)
    assert cold is not None and warm is not None and warm < cold / 50


def branches_plan(lengths: list[int], state: int = 20) -> Plan:
    """A plan over a `state`-token prefix with one branch of each own length."""
    prefix = tuple(range(10, 10 + state))
    at, branches = 100_000, []
    for n in lengths:
        branches.append(Branch(tuple(range(at, at + n)), (1,), prefix))
        at += n
    return Plan.from_branches(branches)


def test_one_long_branch_among_short_ones_is_priced_at_its_own_length():
    """Issue 48: a 20,000-token question alone priced ~146 s; with 63 three-token questions
    beside it, averaging priced the plan at ~24 s and it ran past the 120 s deadline."""
    model = CostModel(576)
    for start in range(0, 32_768, 512):
        _forward(model, start, 512)
    alone = model.estimate_s(branches_plan([20_000]))
    padded = model.estimate_s(branches_plan([20_000, *([3] * 63)]))
    assert alone is not None and padded is not None
    assert alone > 140 and padded >= alone


def test_the_warm_up_alone_prices_a_plan_and_the_metrics_say_so():
    model = CostModel(576)
    assert model.stats()["pricing_forwards_measured"] == 0
    _forward(model, 0, 512)  # the engine's warm-up at load
    assert model.estimate_s(branches_plan([20_000])) is not None
    stats = model.stats()
    assert stats["pricing_forwards_measured"] == 1 and stats["pricing_attention_measured"] == 0
    assert stats["pricing_seconds_per_token"] == pytest.approx(A, rel=0.1)
