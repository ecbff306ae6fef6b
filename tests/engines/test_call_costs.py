"""`auto`'s cost model for the HTTP engines (engines/http/submission.py CallCosts): what a
call to the server costs, learned from the calls made, and the choice it makes between one
batched call (the shared prefix computed per branch) and `staged` (two calls in a row, each
token once)."""

import pytest

from openjev.core.plan import Branch, Plan
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.sglang_protocol import SGLANG, SGLANG_BATCHED
from openjev.engines.http.submission import CallCosts, RecentPrefixes, choose, one_batch_extra_tokens
from tests.support.fakes import FakeSGLang

LABELS = (10, 11, 12)


def _long(n: int = 8, state_len: int = 1000, tail: int = 60, first: int = 100) -> Plan:
    state = tuple(range(first, first + state_len))
    return Plan.from_branches(
        [Branch(state + tuple(range(50_000 + 100 * i, 50_000 + 100 * i + tail)), LABELS) for i in range(n)]
    )


def _fed(fixed_s: float, per_token_s: float, sizes=range(100, 3300, 200)) -> CallCosts:
    costs = CallCosts()
    for tokens in sizes:
        costs.record(tokens, fixed_s + per_token_s * tokens)
    return costs


def test_the_fit_recovers_a_servers_fixed_and_per_token_costs():
    fixed, per_token = _fed(0.012, 3e-6).estimate()
    assert fixed == pytest.approx(0.012) and per_token == pytest.approx(3e-6)


def test_no_estimate_before_enough_calls_of_different_sizes():
    assert CallCosts().estimate() is None
    few = CallCosts(min_calls=16)
    for tokens in range(100, 1600, 100):  # 15 calls
        few.record(tokens, 0.01)
    assert few.estimate() is None
    same = CallCosts(min_calls=4)
    for _ in range(8):
        same.record(500, 0.01)  # no spread: nothing tells a token's cost from a call's
    assert same.estimate() is None


def test_noise_never_makes_a_call_or_a_token_cost_less_than_nothing():
    costs = CallCosts(min_calls=2)
    costs.record(100, 0.05)
    costs.record(2000, 0.01)  # bigger and quicker: the slope would be negative
    fixed, per_token = costs.estimate()
    assert per_token == 0.0 and fixed > 0
    steep = CallCosts(min_calls=2)
    steep.record(100, 0.0)
    steep.record(200, 1.0)  # the line would cross zero above 100 tokens: a negative fixed cost
    assert steep.estimate()[0] == 0.0


def test_the_window_forgets_old_calls():
    costs = CallCosts(window=16, min_calls=16)
    for tokens in range(100, 1700, 100):
        costs.record(tokens, 1.0 + tokens * 1e-3)  # a slow server, once
    for tokens in range(100, 1700, 100):
        costs.record(tokens, 0.01 + tokens * 1e-6)  # what it is now
    assert costs.estimate() == pytest.approx((0.01, 1e-6))


def test_one_batch_when_a_round_trip_costs_more_than_the_prefix_again():
    plan = _long()  # 8 branches on a 1,000-token state: one batch computes about 7,000 tokens more
    recent = RecentPrefixes()
    kw = {"warmup_min_tokens": 256, "batched": True}
    assert choose("auto", plan, recent, costs=(0.010, 1e-6), **kw) == "all"  # a cheap forward: 7 ms < 10 ms
    assert choose("auto", plan, recent, costs=(0.010, 1e-4), **kw) == "staged"  # a CPU forward: 0.7 s > 10 ms
    assert choose("auto", plan, recent, costs=None, **kw) == "staged"  # nothing learned yet: each token once
    assert choose("staged", plan, recent, costs=(0.010, 1e-6), **kw) == "staged"  # a strategy asked for stays
    # one call per branch: the cost model does not apply
    assert choose("auto", plan, recent, costs=(0.010, 1e-6), warmup_min_tokens=256) == "staged"


@pytest.mark.parametrize(
    ("step_tokens", "extra"),
    [
        (None, 7 * 1000),  # no step known: every branch may compute the state
        (1024, 0),  # the first branch (1,060) is chunked; its first chunk covers the state
        (400, 7 * 200),  # its chunks cover 800 before its last: the others compute the other 200
        (2048, 988),  # the second branch fits beside the first (1,000 of its state), the third gets a chunk of 0
        (1100, 40),  # the second branch is chunked into the 40 tokens left of the first step
        (8192, 6 * 1000 + 772),  # seven fit in the first step, side by side; the eighth gets 772 tokens of it
        (16384, 7 * 1000),  # all eight fit
    ],
)
def test_what_one_batch_computes_again_on_a_server_that_prefills_in_steps(step_tokens, extra):
    assert one_batch_extra_tokens(_long(), step_tokens) == extra


def test_a_deeper_shared_run_is_counted_once_per_branch_in_one_batch():
    """Two readings of one question share 50 tokens after the state; a third question does not."""
    state, q1, q2 = tuple(range(100, 1100)), tuple(range(70_000, 70_050)), tuple(range(80_000, 80_050))
    plan = Plan.from_branches(
        [Branch(state + q1 + (90_000,), LABELS), Branch(state + q1 + (90_001,), LABELS), Branch(state + q2, LABELS)]
    )
    assert one_batch_extra_tokens(plan, 1024) == 50  # the state once (the first chunk), q1 twice


async def test_the_engine_learns_from_its_calls_and_sends_one_batch_where_tokens_are_cheap():
    """A server whose calls cost 20 ms whatever their size: after the calls of a few single
    questions (of different sizes), a cold 8-branch request goes in one call, not two."""
    fake = FakeSGLang(delay_s=0.02)
    # each request's own calls (--coalesce-calls 0): what is tested is auto's choice per
    # request; requests sharing calls are tests/engines/test_coalesce.py's (and a shared
    # call's 16 items, timed on a busy machine, move this fake's per-token fit)
    engine = HTTPEngine(
        "http://sglang.test", SGLANG_BATCHED, transport=fake.transport(), strategy="auto", coalesce_calls=0
    )
    try:
        for i in range(16):
            await engine.run(_long(n=1, state_len=100 + 150 * i, first=10_000 * (i + 1)))
        fixed, per_token = engine.costs.estimate()
        assert fixed > 0.015 and per_token * 7000 < fixed
        before = len(fake.calls)
        await engine.run(_long())
    finally:
        await engine.close()
    assert engine.strategies_used["all"] == 17 and "staged" not in engine.strategies_used
    assert len(fake.calls) - before == 1


async def test_the_engine_stages_where_the_forward_dominates():
    """A server that takes 40 us per computed token: the prefix is computed once (staged)."""
    fake = FakeSGLang(delay_s=0.001, token_delay_s=40e-6)
    # each request's own calls (--coalesce-calls 0): what is tested is auto's choice per
    # request; requests sharing calls are tests/engines/test_coalesce.py's (and a shared
    # call's 16 items, timed on a busy machine, move this fake's per-token fit)
    engine = HTTPEngine(
        "http://sglang.test", SGLANG_BATCHED, transport=fake.transport(), strategy="auto", coalesce_calls=0
    )
    try:
        for i in range(16):
            await engine.run(_long(n=1, state_len=100 + 150 * i, first=10_000 * (i + 1)))
        _, per_token = engine.costs.estimate()
        assert per_token == pytest.approx(40e-6, rel=0.5)
        before = len(fake.calls)
        result = await engine.run(_long())
    finally:
        await engine.close()
    assert engine.strategies_used["staged"] == 1
    assert len(fake.calls) - before == 2
    assert result.computed_tokens == _long().unique_tokens


async def test_servers_that_take_one_branch_per_call_are_not_judged_by_the_cost_model():
    fake = FakeSGLang(delay_s=0.0)
    engine = HTTPEngine("http://sglang.test", SGLANG, transport=fake.transport(), strategy="auto")
    for tokens in range(100, 3300, 200):
        engine.costs.record(tokens, 0.02)  # as cheap a forward as can be
    try:
        await engine.run(_long())
    finally:
        await engine.close()
    assert engine.strategies_used == {"staged": 1}


def test_only_calls_that_ran_alone_are_learned_from():
    costs = CallCosts(min_calls=2)
    a = costs.begin()
    costs.end(a, 100, 0.1)  # alone: learned
    a = costs.begin()
    b = costs.begin()  # b starts while a is in flight: neither ran alone
    costs.end(a, 200, 0.5)
    c = costs.begin()  # c starts while b is in flight
    costs.end(b, 300, 0.9)
    costs.end(c, 400, 0.9)
    d = costs.begin()
    costs.end(d, 500, 0.5)  # alone again
    e = costs.begin()
    costs.end(e, None, 0.01)  # failed: nothing to learn
    assert costs.estimate() == pytest.approx((0.0, 1e-3))  # from (100, 0.1) and (500, 0.5) only


def test_the_learned_costs_decide_and_an_unknown_server_gets_staged_prefixes():
    """Cheap tokens beside a call's fixed cost: one call; dear tokens: staged; costs not yet
    learned: staged (each shared token computed once, whatever the server)."""
    plan, recent = _long(), RecentPrefixes()
    kw = {"warmup_min_tokens": 64, "batched": True, "step_tokens": None}
    assert choose("auto", plan, recent, costs=(0.010, 1e-6), **kw) == "all"
    assert choose("auto", plan, recent, costs=(0.010, 1e-3), **kw) == "staged"
    assert choose("auto", plan, recent, costs=None, **kw) == "staged"


async def _quiet_start_then_four_clients(fake, plans_of_client) -> HTTPEngine:
    """An auto engine over `fake`: 16 single questions of different sizes one at a time (so
    the costs are learned), then 4 clients at once, client k running plans_of_client(k)."""
    import asyncio

    # each request's own calls (--coalesce-calls 0): what is tested is auto's choice per
    # request; requests sharing calls are tests/engines/test_coalesce.py's (and a shared
    # call's 16 items, timed on a busy machine, move this fake's per-token fit)
    engine = HTTPEngine(
        "http://sglang.test", SGLANG_BATCHED, transport=fake.transport(), strategy="auto", coalesce_calls=0
    )
    try:
        for i in range(16):
            await engine.run(_long(n=1, state_len=100 + 150 * i, first=10_000 * (i + 1)))

        async def client(k: int) -> None:
            for plan in plans_of_client(k):
                await engine.run(plan)

        await asyncio.gather(*(client(k) for k in range(4)))
    finally:
        await engine.close()
    return engine


async def test_under_load_a_cheap_forward_still_gets_one_call_per_request():
    """The tiny-model case (as on a GPU): a server whose forward costs almost nothing beside
    a call, driven by 4 clients at once, gets each cold request in one call, not two: the
    second call's fixed work is what the other clients would wait for."""
    # a call's fixed cost well above this machine's timer noise (a few ms on a busy CI box
    # once read as a per-token cost: one run in many staged)
    fake = FakeSGLang(delay_s=0.02, token_delay_s=1e-7, serial=True)
    engine = await _quiet_start_then_four_clients(
        fake, lambda k: [_long(first=900_000 + 10_000 * (4 * j + k)) for j in range(3)]
    )
    assert engine.strategies_used["all"] == 16 + 12 and "staged" not in engine.strategies_used


async def test_under_load_the_fit_still_sees_the_forward_and_cold_prefixes_are_staged():
    """A server that computes one call at a time at 40 us a token, driven by 4 clients at
    once: calls that waited behind others would read as a large fixed cost with cheap
    tokens; learned from calls that ran alone, the per-token cost is the server's, and
    every cold 8-branch request computes its state once."""

    def plans(k: int) -> list:
        out = []
        for j in range(3):
            out.append(_long(n=1, state_len=200 + 300 * j, first=500_000 + 10_000 * (4 * j + k)))
            out.append(_long(first=900_000 + 10_000 * (4 * j + k)))
        return out

    engine = await _quiet_start_then_four_clients(FakeSGLang(delay_s=0.001, token_delay_s=40e-6, serial=True), plans)
    _, per_token = engine.costs.estimate()
    assert per_token == pytest.approx(40e-6, rel=0.5)
    assert engine.strategies_used["staged"] == 12 and engine.strategies_used["all"] == 16 + 12
