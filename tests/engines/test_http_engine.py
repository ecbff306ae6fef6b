"""The one HTTP engine's run loop (calls in flight, errors, timeouts, aborts), the same for
every protocol it speaks: each test runs over the faithful fakes, SGLang's native protocol
(FakeSGLang) spoken per branch (SGLANG, what older servers take) and batched and
prefill-only (SGLANG_BATCHED, SGLang 0.5.23), and vLLM's token route (FakeVLLM; VLLM) and
its batched /v1/completions (VLLM_BATCHED). What only one protocol does (its reply
shapes, its cache namespace field, vLLM's label chunking and context bound) stays in
test_sglang.py and test_vllm.py."""

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from openjev.core.plan import Branch, Plan
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.protocol import HTTPProtocol
from openjev.engines.http.sglang_protocol import SGLANG, SGLANG_BATCHED
from openjev.engines.http.vllm_protocol import ID_PREFIX, VLLM, VLLM_BATCHED
from openjev.errors import EngineError, EngineTimeout, EngineUnavailable
from tests.support.fakes import FakeSGLang, FakeVLLM

LABELS = (10, 11, 12)
STATE = tuple(range(100, 400))  # a 300-token shared prefix


@dataclass(frozen=True)
class Server:
    """One protocol and its fake: how the engine reaches it and how the fake names a call."""

    protocol: HTTPProtocol
    fake: type
    url: str
    abort_ids: Callable[[dict[str, Any]], list[str]]  # the ids an abort of this call body names
    abort_prefix: str  # what every aborted id starts with
    name: str = ""

    def engine(self, fake: Any, **kw: Any) -> HTTPEngine:
        return HTTPEngine(self.url, self.protocol, transport=fake.transport(), **kw)


def _rids(body: dict[str, Any]) -> list[str]:
    return body["rid"] if isinstance(body["rid"], list) else [body["rid"]]


def _vllm_ids(body: dict[str, Any]) -> list[str]:
    if "prompt" in body:  # a batched completions call: its items are cmpl-{request_id}-{i}
        return [f"cmpl-{body['request_id']}-{i}" for i in range(len(body["prompt"]))]
    return [ID_PREFIX + body["request_id"]]


def _started(fake: Any) -> int:
    """How many branches the fake has been sent."""
    if isinstance(fake, FakeSGLang):
        return len(fake.items)
    return sum(len(c["body"].get("prompt", [None])) for c in fake.calls)


SERVERS = [
    Server(SGLANG, FakeSGLang, "http://sglang.test", _rids, "", "SGLang"),
    Server(SGLANG_BATCHED, FakeSGLang, "http://sglang.test", _rids, "", "SGLang-batched"),
    Server(VLLM, FakeVLLM, "http://vllm.test", _vllm_ids, ID_PREFIX, "vLLM"),
    Server(VLLM_BATCHED, FakeVLLM, "http://vllm.test", _vllm_ids, "cmpl-", "vLLM-batched"),
]


@pytest.fixture(params=SERVERS, ids=lambda s: s.name)
def server(request) -> Server:
    return request.param


def _plan(n: int = 4, state=STATE) -> Plan:
    # branches: state, then two groups sharing a 40-token question run, then each own tail
    branches = []
    for i in range(n):
        group = tuple(range(1000 + 100 * (i % 2), 1040 + 100 * (i % 2)))
        branches.append(Branch(state + group + (5000 + i, 5001 + i), LABELS))
    return Plan.from_branches(branches)


async def _run(engine: HTTPEngine, plan: Plan):
    try:
        return await engine.run(plan)
    finally:
        await engine.close()


async def test_missing_cached_tokens_makes_accounting_unknown(server):
    result = await _run(server.engine(server.fake(report_cached=False), strategy="all"), _plan())
    assert result.cached_tokens is None and result.computed_tokens is None


async def test_calls_in_flight_are_capped(server):
    fake = server.fake(delay_s=0.02)
    engine = server.engine(fake, strategy="all", max_calls=2)
    try:  # three requests at once: three calls batched, 24 per branch
        await asyncio.gather(*(engine.run(_plan(8)) for _ in range(3)))
    finally:
        await engine.close()
    assert fake.max_in_flight == 2 and len(fake.calls) == (3 if server.protocol.batch_body else 24)


async def test_stats_count_the_calls_made_and_in_flight(server):
    fake = server.fake(delay_s=0.05)
    engine = server.engine(fake, strategy="all", max_calls=2)
    assert engine.parallel_layouts is False
    calls = {"engine_http_calls", "engine_http_calls_in_flight"}
    assert {k: v for k, v in engine.stats().items() if k in calls} == dict.fromkeys(calls, 0)
    try:
        running = asyncio.gather(*(engine.run(_plan(8)) for _ in range(3)))
        await asyncio.sleep(0.02)  # the first calls are out, the rest wait for a slot
        assert engine.stats()["engine_http_calls_in_flight"] == 2
        await running
    finally:
        await engine.close()
    stats = engine.stats()
    assert stats["engine_http_calls"] == len(fake.calls) and stats["engine_http_calls_in_flight"] == 0


# ---- failures


@pytest.mark.parametrize(("status", "error"), [(429, EngineUnavailable), (503, EngineUnavailable), (500, EngineError)])
async def test_error_statuses_are_retryable(server, status, error):
    with pytest.raises(error) as info:
        await _run(server.engine(server.fake(fail_status=status), strategy="all"), _plan())
    assert info.value.retryable
    if status in (429, 503):
        assert info.value.headers["Retry-After"] == "7" and info.value.status == 503


async def test_unreachable_engine_is_unavailable(server):
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    engine = HTTPEngine(server.url, server.protocol, transport=httpx.MockTransport(refuse))
    with pytest.raises(EngineUnavailable):
        await _run(engine, _plan())


async def test_call_timeout_is_504_and_aborts_on_the_server(server):
    fake = server.fake()

    async def handle(request):  # what a real transport raises when the read deadline passes
        if request.url.path in (server.protocol.generate_path, server.protocol.batch_path):
            raise httpx.ReadTimeout("timed out", request=request)
        return await fake.handle(request)

    engine = HTTPEngine(server.url, server.protocol, transport=httpx.MockTransport(handle), strategy="all")
    with pytest.raises(EngineTimeout):
        await _run(engine, _plan(2))
    assert len(fake.aborted) == 2  # the server was told to drop both
    assert all(rid.startswith(server.abort_prefix) for rid in fake.aborted)


async def test_cancelling_a_request_aborts_whatever_is_in_flight(server):
    fake = server.fake(delay_s=5)
    engine = server.engine(fake, strategy="all")
    task = asyncio.create_task(engine.run(_plan(3)))
    while _started(fake) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await engine.close()
    assert len(fake.calls) == (1 if server.protocol.batch_body else 3)
    assert sorted(fake.aborted) == sorted(rid for c in fake.calls for rid in server.abort_ids(c["body"]))
    assert len(fake.aborted) == 3  # every branch, batched or not
