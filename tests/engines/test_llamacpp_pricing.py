"""The llama.cpp engine's pricing, its steps and the keys' turns between them, and its stop,
against SimulatedLlamaCpp, a named fake of the binding seam (tests/support/fake_llamacpp.py)
whose decode calls take a fixed time per call. The real binding and model: tests/llamacpp."""

import asyncio
import dataclasses

import pytest

from openjev.api.identity.admission import GatedEngine
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.operations.metrics import Metrics
from openjev.core.caller import ANONYMOUS
from openjev.core.plan import Branch, Plan
from openjev.core.ports import PlanResult
from openjev.core.types import Share
from openjev.engines.llamacpp.engine import LlamaCppEngine
from openjev.engines.llamacpp.steps import MIN_STEP
from openjev.engines.llamacpp.turns import HOLD_STEPS, MAX_SAVED, Turns
from openjev.errors import EngineError, TokensExceeded
from tests.support.fake_llamacpp import SimulatedLlamaCpp, expected

HEAVY, LIGHT = Share("heavy"), Share("light")


def _long(n: int, share: Share = HEAVY, ns: str = "", first: int = 100) -> Plan:
    """One branch of `n` tokens (a long question), read at its end."""
    return dataclasses.replace(
        Plan.from_branches([Branch(tuple(range(first, first + n)), (1, 2))], cache_namespace=ns), share=share
    )


def _check(plan, result):
    for branch, got in zip(plan.branches, result.branches, strict=True):
        assert got.logprobs == expected(branch.input_ids, branch.label_ids)


def test_nothing_is_priced_before_the_warm_up_and_everything_after_it():
    fake = SimulatedLlamaCpp()
    fake.decode_s = 0.02
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)
    try:
        assert engine.estimate_s(_long(600)) is None
        engine.warm_up()
        assert fake.decodes == 2 and not fake.cells  # an untimed call, the timed one; the context left empty
        short, long = engine.estimate_s(_long(60)), engine.estimate_s(_long(600))
        assert short is not None and long is not None
        assert 0 < short < long  # a longer plan costs more; both from the one call measured
        assert engine.stats()["pricing_forwards_measured"] == 1
    finally:
        asyncio.run(engine.close())


def test_the_estimate_subtracts_what_the_namespaces_cache_holds():
    fake = SimulatedLlamaCpp()
    fake.decode_s = 0.01
    engine = LlamaCppEngine(fake, prefix_cache_bytes=1 << 20)
    try:
        engine.warm_up()
        state = tuple(range(100, 400))
        plan = Plan.from_branches([Branch((7, 8), (1, 2), prefix=state), Branch((9,), (1, 2), prefix=state)])
        cold = engine.estimate_s(plan)
        asyncio.run(engine.run(plan))
        warm = engine.estimate_s(plan)
        other = engine.estimate_s(dataclasses.replace(plan, cache_namespace="another"))
        assert warm is not None and cold is not None and other is not None
        assert warm < cold / 10 and other > warm  # only its own namespace's cache counts
    finally:
        asyncio.run(engine.close())


async def _admitted(gate: GatedEngine, plan: Plan) -> PlanResult:
    """`plan` as the service runs it: admitted for an anonymous caller, then run."""
    async with gate.admit(ANONYMOUS, [plan]):
        return await gate.run(plan)


def test_the_gate_refuses_at_the_door_what_could_not_finish_before_the_deadline():
    """The admission's deadline rule (api/identity/admission.py) over the llama.cpp engine:
    422 before any decode, the small request admitted and answered."""
    fake = SimulatedLlamaCpp(n_batch=64)
    fake.decode_s = 0.05
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)
    gate = GatedEngine(
        engine,
        max_tokens_in_flight=0,
        max_wait_s=0,
        key_limits=KeyLimits(0, 0),
        metrics=Metrics(dict),
        retry_after_s=1,
        deadline_s=1.0,
    )
    try:
        engine.warm_up()  # 32 tokens (the fake's n_batch caps it) in 0.05 s: ~1.6 ms a token
        before = fake.decodes
        with pytest.raises(TokensExceeded, match="past its 1 s deadline"):
            asyncio.run(_admitted(gate, _long(1500)))
        assert fake.decodes == before  # refused before any work
        small = _long(40)
        _check(small, asyncio.run(_admitted(gate, small)))
    finally:
        asyncio.run(engine.close())


def test_decode_calls_are_sized_in_time_from_the_measured_cost():
    fake = SimulatedLlamaCpp(n_batch=512, n_ctx_train=4096)
    fake.decode_s = 0.01
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0, slice_s=0.05)
    try:
        assert engine.executor.step_tokens(0) == MIN_STEP  # nothing measured: the smallest step
        engine.warm_up(tokens=100)  # 0.01 s for 100 tokens: 0.05 s is about 500 tokens
        before = engine.executor.step_tokens(0)
        assert MIN_STEP < before <= 512  # about 500 (a loaded machine's sleeps run long)
        fake.decode_s = 0.1  # the machine got slower: the calls measure it, steps shrink
        plan = _long(1200)
        _check(plan, asyncio.run(engine.run(plan)))
        assert engine.executor.step_tokens(0) < before and engine.executor.step_tokens(1000) < before / 2
    finally:
        asyncio.run(engine.close())


def test_another_keys_small_request_goes_between_two_steps_of_a_long_one():
    """The long request is set aside (its context saved whole), the light key's runs, and
    the long one goes on from where it was, its answer its own independent prefill's."""
    fake = SimulatedLlamaCpp(n_batch=32, n_ctx_train=4096)
    fake.decode_s = 0.01
    engine = LlamaCppEngine(fake, prefix_cache_bytes=1 << 20)
    long, small = _long(1000), _long(40, LIGHT, ns="light", first=5000)

    async def scenario():
        heavy = asyncio.create_task(engine.run(long))
        while fake.decodes < 3:
            await asyncio.sleep(0.005)
        before = fake.decodes
        light = await engine.run(small)
        calls = fake.decodes - before
        assert not heavy.done()  # the light one did not wait for the whole long one
        return light, await heavy, calls

    try:
        light, heavy, calls = asyncio.run(scenario())
    finally:
        asyncio.run(engine.close())
    _check(small, light)
    _check(long, heavy)
    assert fake.saves == 1 and engine.switches == 1
    assert calls <= 4  # the long one's call under way (and one more at most), then its own two; not 30
    assert heavy.computed_tokens == 1000 and not fake.cells


def test_a_set_aside_request_whose_caller_left_is_dropped():
    fake = SimulatedLlamaCpp(n_batch=32, n_ctx_train=4096)
    fake.decode_s = 0.01
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)

    async def scenario():
        heavy = asyncio.create_task(engine.run(_long(1000)))
        while fake.decodes < 3:
            await asyncio.sleep(0.005)
        light = asyncio.create_task(engine.run(_long(200, LIGHT, first=5000)))
        while fake.saves == 0:
            await asyncio.sleep(0.005)
        heavy.cancel()  # set aside now: it never comes back
        await light
        with pytest.raises(asyncio.CancelledError):
            await heavy
        decodes = fake.decodes
        await asyncio.sleep(0.1)
        return decodes

    try:
        decodes = asyncio.run(scenario())
        assert fake.decodes == decodes and not fake.cells and not engine._saved
    finally:
        asyncio.run(engine.close())


def test_close_stops_a_long_request_at_its_next_decode_call():
    fake = SimulatedLlamaCpp(n_batch=32, n_ctx_train=4096)
    fake.decode_s = 0.02
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)

    async def scenario():
        heavy = asyncio.create_task(engine.run(_long(3000)))  # 94 calls: about 2 s
        while fake.decodes < 2:
            await asyncio.sleep(0.005)
        before = fake.decodes
        await engine.close()
        with pytest.raises(EngineError, match="shut down"):
            await heavy
        return fake.decodes - before

    after = asyncio.run(scenario())
    assert after <= 1 and fake.closed  # the call under way, of 94


def _job(share: Share, *, started: bool = False):
    from openjev.engines.llamacpp.steps import Job

    job = Job(_long(100, share), lambda _: None)
    if started:
        job.steps = iter(())  # type: ignore[assignment]
    return job


def test_turns_keep_one_started_request_per_key_and_bound_the_set_aside():
    turns = Turns()
    running = _job(HEAVY, started=True)
    later_heavy, light = _job(HEAVY), _job(LIGHT)
    # one key: the running request goes on, its key's later request waits for it
    assert turns.next(running, [], [later_heavy], 64) is running
    # another key's waiting request goes after at most one more step
    picks = [turns.next(running, [], [later_heavy, light], 64) for _ in range(2)]
    assert light in picks
    # with MAX_SAVED requests set aside, the running one is not interrupted by a new one
    saved = [_job(Share(f"k{i}"), started=True) for i in range(MAX_SAVED)]
    turns = Turns()
    turns.held = HOLD_STEPS  # past the hold: only the bound keeps the new one out
    assert all(turns.next(running, saved, [light], 64) in (running, *saved) for _ in range(6))


def test_a_request_that_took_the_context_keeps_it_for_the_hold():
    turns = Turns()
    light_running, set_aside = _job(LIGHT, started=True), _job(HEAVY, started=True)
    turns.held = 1  # it just took the context
    got = [turns.next(light_running, [set_aside], [], 64) for _ in range(HOLD_STEPS - 1)]
    assert got == [light_running] * (HOLD_STEPS - 1)


def test_a_light_key_waits_at_most_one_step_of_a_long_request_on_a_slow_machine():
    """Steps of the long request, as many tokens as its measured cost allows in the slice
    (each decode 0.1 s: 64 tokens): the light key's request starts after the call under way."""
    fake = SimulatedLlamaCpp(n_batch=512, n_ctx_train=4096)
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0, slice_s=0.1)
    fake.decode_s = 0.1
    engine.warm_up()  # 64 tokens in 0.1 s: steps of 64 tokens

    async def scenario():
        heavy = asyncio.create_task(engine.run(_long(800)))
        while fake.decodes < 3:
            await asyncio.sleep(0.005)
        before = fake.decodes
        await engine.run(_long(60, LIGHT, first=5000))
        calls = fake.decodes - before
        await heavy
        return calls

    try:
        calls = asyncio.run(scenario())
    finally:
        asyncio.run(engine.close())
    assert calls <= 3  # the call under way, its own one; not the long one's 9 calls left
