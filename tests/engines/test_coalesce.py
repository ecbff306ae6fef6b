"""Concurrent requests' stages in shared batched calls (engines/http/coalesce.py), over the
faithful SGLang fake (SGLang 0.5.23's batched, prefill-only protocol): idle, a request goes
out at once and alone; under load, the stages that wait share the next call; each request
gets its own answers and its own failures; a request that leaves aborts its own items only,
and a call every request of which has left is cancelled and aborted whole."""

import asyncio

import pytest

from openjev.core.plan import Branch, Plan
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.sglang_protocol import SGLANG_BATCHED, sglang
from openjev.errors import EngineError, EngineUnavailable
from tests.support.fakes import FakeSGLang

LABELS = (10, 11, 12)
URL = "http://sglang.test"


def _plan(tag: int, n: int = 2, namespace: str = "") -> Plan:
    """`n` branches on a state of its own (tag), short enough that `auto` sends them at once."""
    state = tuple(range(100 + 1000 * tag, 140 + 1000 * tag))
    return Plan.from_branches([Branch((*state, 7000 + i), LABELS) for i in range(n)], cache_namespace=namespace)


def _engine(fake: FakeSGLang, depth: int = 2, protocol=SGLANG_BATCHED) -> HTTPEngine:
    return HTTPEngine(URL, protocol, transport=fake.transport(), strategy="all", coalesce_calls=depth)


async def _answers(engine: HTTPEngine, plans: list[Plan]) -> list[tuple]:
    try:
        results = await asyncio.gather(*(engine.run(p) for p in plans))
    finally:
        await engine.close()
    return [tuple(b.logprobs for b in r.branches) for r in results]


def _items_per_call(fake: FakeSGLang) -> list[int]:
    return [len(c["body"]["input_ids"]) for c in fake.calls]


async def test_an_idle_server_gets_each_request_at_once_and_alone():
    fake = FakeSGLang()
    engine = _engine(fake)
    try:
        for tag in range(3):
            await engine.run(_plan(tag))
    finally:
        await engine.close()
    assert _items_per_call(fake) == [2, 2, 2]
    assert engine.stats()["engine_shared_calls"] == 3 and engine.stats()["engine_shared_call_parts"] == 3


async def test_stages_that_wait_share_the_next_call_and_keep_their_own_answers():
    plans = [_plan(tag) for tag in range(6)]
    alone = await _answers(_engine(FakeSGLang(delay_s=0.05), depth=0), plans)
    fake = FakeSGLang(delay_s=0.05)
    shared = await _answers(_engine(fake, depth=2), plans)
    # two calls go out at once; the four requests that came meanwhile share the third
    assert _items_per_call(fake) == [2, 2, 8]
    assert shared == alone


async def test_without_coalescing_every_request_has_its_own_calls():
    fake = FakeSGLang(delay_s=0.02)
    engine = _engine(fake, depth=0)
    assert engine.coalescer is None and "engine_shared_calls" not in engine.stats()
    await _answers(engine, [_plan(tag) for tag in range(4)])
    assert _items_per_call(fake) == [2, 2, 2, 2]


async def test_a_request_that_leaves_aborts_its_own_items_and_the_call_goes_on():
    fake = FakeSGLang(delay_s=0.1)
    engine = _engine(fake, depth=1)
    try:
        first = asyncio.create_task(engine.run(_plan(0)))
        await asyncio.sleep(0.01)  # the first call is out: the next two wait, then share one
        stay = asyncio.create_task(engine.run(_plan(1)))
        leave = asyncio.create_task(engine.run(_plan(2)))
        await first
        await asyncio.sleep(0.02)  # the shared call is out
        leave.cancel()
        result = await stay
        with pytest.raises(asyncio.CancelledError):
            await leave
    finally:
        await engine.close()
    assert _items_per_call(fake) == [2, 4]
    shared = fake.calls[1]["body"]
    leaving = [rid for rid, ids in zip(shared["rid"], shared["input_ids"], strict=True) if ids[0] == 2100]
    assert sorted(fake.aborted) == sorted(leaving) and len(leaving) == 2  # its items only
    assert all(b.logprobs for b in result.branches)


async def test_a_call_every_request_of_which_left_is_cancelled_and_aborted_whole():
    fake = FakeSGLang(delay_s=0.2)
    engine = _engine(fake, depth=2)
    try:
        tasks = [asyncio.create_task(engine.run(_plan(tag))) for tag in range(2)]
        await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.01)  # the fire-and-forget aborts
    finally:
        await engine.close()
    sent = [rid for c in fake.calls for rid in c["body"]["rid"]]
    assert sorted(fake.aborted) == sorted(sent) and len(sent) == 4


async def test_an_unusable_item_fails_its_own_request_only():
    # the server aborts one request's items (finish_reason abort), answers the others
    fake = FakeSGLang(delay_s=0.05, abort_when=lambda ids: ids[0] == 3100)
    engine = _engine(fake, depth=1)
    try:
        first = asyncio.create_task(engine.run(_plan(0)))
        await asyncio.sleep(0.01)
        others = [asyncio.create_task(engine.run(_plan(tag))) for tag in (1, 3, 4)]
        await first
        outcomes = await asyncio.gather(*others, return_exceptions=True)
    finally:
        await engine.close()
    assert _items_per_call(fake) == [2, 6]  # the three shared one call
    assert isinstance(outcomes[1], EngineError) and "aborted" in str(outcomes[1])
    assert not isinstance(outcomes[0], BaseException) and not isinstance(outcomes[2], BaseException)


async def test_a_call_that_fails_whole_fails_every_request_in_it():
    fake = FakeSGLang(fail_status=503)
    outcomes = []
    engine = _engine(fake, depth=1)
    try:
        outcomes = await asyncio.gather(*(engine.run(_plan(tag)) for tag in range(3)), return_exceptions=True)
    finally:
        await engine.close()
    assert all(isinstance(o, EngineUnavailable) for o in outcomes)
    assert _items_per_call(fake) == [2, 4]


async def test_namespaces_never_share_a_call():
    fake = FakeSGLang(delay_s=0.05)
    engine = _engine(fake, depth=1)
    plans = [_plan(0, namespace="a"), _plan(1, namespace="a"), _plan(2, namespace="b"), _plan(3, namespace="a")]
    await _answers(engine, plans)
    keys = [(c["body"].get("extra_key"), len(c["body"]["input_ids"])) for c in fake.calls]
    assert keys[0] == ("a", 2) and sorted(keys[1:]) == [("a", 4), ("b", 2)]


async def test_a_server_whose_batches_lose_the_namespace_shares_no_calls():
    """SGLang-JAX 0.1.0rc0 (batches drop extra_key): its batch form is not trusted to answer
    an item aborted alone either, so requests keep their own calls."""
    fake = FakeSGLang(delay_s=0.02)
    engine = _engine(fake, protocol=sglang(batch=True, prefill_only=True, keeps_namespace=False))
    assert engine.coalescer is None
    await _answers(engine, [_plan(tag) for tag in range(3)])
    assert _items_per_call(fake) == [2, 2, 2]
