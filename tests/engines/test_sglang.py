"""The SGLang protocol against a faithful fake of SGLang's native protocol (httpx MockTransport):
its replies, strategies, cache namespace, tokenizer check and probe. The run loop shared with
vLLM (failures, timeouts, aborts) is tested over both fakes in test_http_engine.py."""

import asyncio
import math

import httpx
import pytest

from openjev.core.plan import Branch, Plan
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.sglang_protocol import SGLANG, SGLANG_BATCHED, parse_batch_reply, parse_reply
from openjev.errors import EngineError, EngineUnavailable
from tests.support.fakes import FakeSGLang, fake_logprobs

LABELS = (10, 11, 12)
STATE = tuple(range(100, 400))  # a 300-token shared prefix


def _plan(n: int = 4, state=STATE) -> Plan:
    # branches: state, then two groups sharing a 40-token question run, then each own tail
    branches = []
    for i in range(n):
        group = tuple(range(1000 + 100 * (i % 2), 1040 + 100 * (i % 2)))
        branches.append(Branch(state + group + (5000 + i, 5001 + i), LABELS))
    return Plan.from_branches(branches)


def _engine(fake: FakeSGLang, protocol=SGLANG, **kw) -> HTTPEngine:
    return HTTPEngine("http://sglang.test", protocol, transport=fake.transport(), **kw)


async def _run(engine: HTTPEngine, plan: Plan):
    try:
        return await engine.run(plan)
    finally:
        await engine.close()


# ---- replies


def _reply(entries, **meta):
    return {
        "meta_info": {
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": 5,
            "completion_tokens": 1,
            "output_token_ids_logprobs": [entries],
            **meta,
        }
    }


def test_reply_is_read_by_token_id_not_position():
    values, prompt, cached = parse_reply(
        _reply([[-3.0, 12, None], [-1.0, 10, None], [-2.0, 11, None]], cached_tokens=2), LABELS
    )
    assert values == (-1.0, -2.0, -3.0) and (prompt, cached) == (5, 2)


def test_null_is_minus_infinity_and_cached_tokens_may_be_absent():
    values, _, cached = parse_reply(_reply([[-1.0, 10, None], [None, 11, None], [-2.0, 12, None]]), LABELS)
    assert values[1] == -math.inf and cached is None


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"text": "x"}, "no meta_info"),
        (_reply([[-1.0, 10, None], [-2.0, 11, None]]), "no log-probs for label tokens"),
        (_reply([[None, 10, None], [None, 11, None], [None, 12, None]]), "probability zero"),
        (_reply([[float("nan"), 10, None], [-1.0, 11, None], [-1.0, 12, None]]), "non-finite"),
        (_reply([[-1.0, 10, None], [-1.0, 11, None], [-1.0, 12, None]], completion_tokens=2), "expected 1"),
        ({"meta_info": {"finish_reason": {"type": "abort", "message": "oom"}}}, "aborted"),
        ({"meta_info": {"output_token_ids_logprobs": []}}, "no output_token_ids_logprobs"),
    ],
)
def test_unusable_replies_are_engine_errors(body, why):
    with pytest.raises(EngineError, match=why):
        parse_reply(body, LABELS)


# ---- protocol


async def test_every_call_is_prefill_only_with_selected_logprobs():
    fake = FakeSGLang()
    plan = _plan()
    result = await _run(_engine(fake, strategy="warmup"), plan)
    for call in fake.calls:
        body = call["body"]
        assert body["sampling_params"]["max_new_tokens"] == 1
        assert body["return_logprob"] is True and body["logprob_start_len"] == -1
        assert body["token_ids_logprob"]  # warm-ups included (sglang#34719)
        assert body["return_text_in_logprobs"] is False and body["rid"]
    for b, r in zip(plan.branches, result.branches, strict=True):
        assert r.logprobs == fake_logprobs(b.input_ids, len(LABELS))


async def test_all_pays_the_prefix_per_branch_warmup_and_staged_reach_the_floor():
    plan = _plan()
    computed = {}
    for strategy in ("all", "warmup", "staged"):
        fake = FakeSGLang(delay_s=0.01)
        result = await _run(_engine(fake, strategy=strategy, stage_min_tokens=1), plan)
        computed[strategy] = result.computed_tokens
        assert result.computed_tokens + result.cached_tokens == sum(len(c["body"]["input_ids"]) for c in fake.calls)
    root = plan.shared_prefix_len
    assert computed["all"] == plan.prompt_tokens  # sent together: nobody's cache helps anybody
    # the prefix once, then each branch's own part (deeper shared runs once per branch)
    assert computed["warmup"] == root + sum(len(b.input_ids) - root for b in plan.branches)
    assert computed["staged"] == plan.unique_tokens  # every distinct token once, no extra call


async def test_warmup_finishes_before_any_branch_starts():
    fake = FakeSGLang(delay_s=0.02)
    plan = _plan()
    await _run(_engine(fake, strategy="warmup"), plan)
    warm, *branches = fake.calls
    assert tuple(warm["body"]["input_ids"]) == plan.root.tokens
    assert all(b["start"] >= warm["end"] for b in branches)
    assert len(branches) == len(plan.branches)


async def test_staged_seeds_each_group_before_its_siblings():
    fake = FakeSGLang(delay_s=0.02)
    plan = _plan()
    await _run(_engine(fake, strategy="staged", stage_min_tokens=1), plan)
    seed = fake.calls[0]
    assert all(c["start"] >= seed["end"] for c in fake.calls[1:])  # nothing before the state is cached
    assert len(fake.calls) == len(plan.branches)  # no extra call
    # the other group got its own seed before its second member
    group_b = [c for c in fake.calls if c["body"]["input_ids"][len(STATE)] == 1100]
    assert group_b[1]["start"] >= group_b[0]["end"]


async def test_auto_stages_a_long_cold_prefix_then_sends_all_once_it_is_cached():
    fake = FakeSGLang()
    engine = _engine(fake, strategy="auto", warmup_min_tokens=256)
    try:
        first = await engine.run(_plan())
        second = await engine.run(_plan())
        short = await engine.run(_plan(state=tuple(range(100, 150))))
    finally:
        await engine.close()
    assert engine.strategies_used == {"staged": 1, "all": 2}
    assert second.cached_tokens >= len(STATE) * len(_plan().branches)
    assert first.computed_tokens < _plan().prompt_tokens and short.computed_tokens is not None


# ---- batched and prefill-only (SGLang 0.5.23)


async def test_a_batched_stage_is_one_prefill_only_call_with_per_item_labels_and_rids():
    fake = FakeSGLang()
    plan = _plan()
    result = await _run(_engine(fake, SGLANG_BATCHED, strategy="all"), _plan())
    [call] = fake.calls
    body = call["body"]
    assert body["input_ids"] == [list(b.input_ids) for b in plan.branches]
    assert body["token_ids_logprob"] == [list(b.label_ids) for b in plan.branches]
    assert len(set(body["rid"])) == len(plan.branches)
    assert body["sampling_params"]["max_new_tokens"] == 0  # no decode step
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1
    for b, r in zip(plan.branches, result.branches, strict=True):
        assert r.logprobs == fake_logprobs(b.input_ids, len(LABELS))


@pytest.mark.parametrize(("strategy", "calls"), [("all", 1), ("warmup", 2), ("staged", 3)])
async def test_each_stage_of_a_strategy_is_one_call(strategy, calls):
    """warmup: the prefix, then every branch; staged on two groups of two: the seed, then
    its group's rest and the other group's seed in one call, then that group's rest."""
    fake = FakeSGLang(delay_s=0.01)
    plan = _plan()
    result = await _run(_engine(fake, SGLANG_BATCHED, strategy=strategy, stage_min_tokens=1), plan)
    assert len(fake.calls) == calls and len(result.branches) == len(plan.branches)
    assert sorted(fake.items) == sorted(
        [b.input_ids for b in plan.branches] + ([plan.root.tokens] if strategy == "warmup" else [])
    )
    warmups = [c["body"] for c in fake.calls if not isinstance(c["body"]["input_ids"][0], list)]
    assert all(w["token_ids_logprob"] and w["sampling_params"]["max_new_tokens"] == 0 for w in warmups)


async def test_staged_sends_what_may_go_at_the_same_moment_in_one_call():
    """A request's questions as the compiler lays them out: the first shares a short run (a
    question's opening words, under stage_min) with the fourth, the rest stand alone. Once
    the seed has cached the state, every other branch may go: one call, not the seed's
    group in a call of its own beside the others (which a server may admit a step later)."""
    branches = []
    for i in range(6):
        run = (1000,) * 10 + (1001 + i,) if i % 3 == 0 else (2000 + 10 * i,) * 5
        branches.append(Branch(STATE + run + (5000 + i, 5001 + i), LABELS))
    plan = Plan.from_branches(branches)
    fake = FakeSGLang(delay_s=0.01)
    result = await _run(_engine(fake, SGLANG_BATCHED, strategy="staged", stage_min_tokens=32), plan)
    seed, rest = fake.calls
    assert seed["body"]["input_ids"] == [list(plan.branches[0].input_ids)]
    assert sorted(map(tuple, rest["body"]["input_ids"])) == sorted(b.input_ids for b in plan.branches[1:])
    assert rest["start"] >= seed["end"]  # the state cached first
    assert result.computed_tokens == plan.unique_tokens  # the seed cached its group's short run too


async def test_batched_calls_account_each_items_cached_tokens():
    plan = _plan()
    fake = FakeSGLang()
    engine = _engine(fake, SGLANG_BATCHED, strategy="all")
    try:
        cold = await engine.run(plan)
        warm = await engine.run(plan)
    finally:
        await engine.close()
    assert cold.computed_tokens == plan.prompt_tokens  # one batch: its items share nothing here
    assert warm.cached_tokens == sum(len(b.input_ids) - 1 for b in plan.branches)


def _batch_reply(rids, labels=LABELS, **meta):
    return [
        {
            "meta_info": {
                "id": rid,
                "prompt_tokens": 5,
                "completion_tokens": 0,
                **meta,
                "output_token_ids_logprobs": [[[-1.0, t, None] for t in labels]],
            }
        }
        for rid in rids
    ]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_batch_reply(["a"]), "1 items for a batch of 2"),
        (_batch_reply(["a", "c"]), "item 'c' where 'b' was"),
        (_batch_reply(["a", "b"], completion_tokens=1), "expected 0"),
        ({"meta_info": {}}, "dict for a batch of 2"),
    ],
)
def test_unusable_batch_replies_are_engine_errors(body, why):
    with pytest.raises(EngineError, match=why):
        parse_batch_reply(body, ["a", "b"], [LABELS, LABELS])


async def test_a_deadline_aborts_every_branch_of_a_batched_call():
    fake = FakeSGLang(delay_s=5)
    engine = _engine(fake, SGLANG_BATCHED, strategy="all")
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):  # the service's deadline
                await engine.run(_plan(5))
    finally:
        await engine.close()
    [call] = fake.calls
    assert sorted(fake.aborted) == sorted(call["body"]["rid"]) and len(fake.aborted) == 5


@pytest.mark.parametrize(("batch", "prefill_only"), [(True, True), (False, True), (True, False), (False, False)])
def test_capabilities_are_probed_and_fall_back_to_what_the_server_takes(batch, prefill_only):
    from openjev.engines.http.sglang import capabilities

    fake = FakeSGLang(batch=batch, prefill_only=prefill_only)
    protocol = capabilities("http://sglang.test", [5, 6, 7], client=httpx.Client(transport=fake.sync_transport()))
    assert (protocol.batch_body is not None, protocol.prefill_only) == (batch, prefill_only)
    if batch or prefill_only:  # what is used was a real call, read as the engine reads it
        assert (5, 6, 7) in fake.items


async def test_a_server_without_batches_gets_one_call_per_branch():
    from openjev.engines.http.sglang import capabilities

    fake = FakeSGLang(batch=False, prefill_only=False)
    client = httpx.Client(transport=fake.sync_transport())
    protocol = await asyncio.to_thread(capabilities, "http://sglang.test", [5, 6, 7], client=client)
    fake.calls.clear()
    result = await _run(_engine(fake, protocol, strategy="all"), _plan())
    assert len(fake.calls) == 4 and len(result.branches) == 4
    assert all(c["body"]["sampling_params"]["max_new_tokens"] == 1 for c in fake.calls)


# ---- failures


async def test_aborted_finish_reason_is_an_engine_error():
    with pytest.raises(EngineError, match="aborted"):
        await _run(_engine(FakeSGLang(abort_when=lambda ids: True), strategy="all"), _plan())


async def test_a_failing_branch_cancels_and_aborts_its_siblings():
    fail_first = _plan().branches[0].input_ids
    fake = FakeSGLang(fail_status=500, fail_when=lambda ids: ids == fail_first)

    async def handle(request):  # the failing call answers at once, its siblings are slow
        import json

        if request.url.path == "/generate" and tuple(json.loads(request.content)["input_ids"]) != fail_first:
            await asyncio.sleep(0.5)
        return await fake.handle(request)

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    engine = HTTPEngine("http://sglang.test", SGLANG, transport=httpx.MockTransport(handle), strategy="all")
    with pytest.raises(EngineError):
        await _run(engine, _plan())
    assert loop.time() - t0 < 0.45  # did not wait for the slow siblings
    assert len(fake.aborted) == len(_plan().branches) - 1


# ---- tokenizer agreement


def _probe_server(shift: int, bos: bool = False, seen: list | None = None, reply=None):
    """A server whose tokenizer is one id per character (+ `shift`); records what it is sent
    in `seen`. `reply(ids)` replaces its answer's body."""
    import json as _json

    def handle(request):
        body = _json.loads(request.content)
        if seen is not None:
            seen.append((request.url.path, body))
        ids = [ord(c) + shift for c in body["text"]]  # it tokenizes the text it was sent
        if bos:
            ids = [1, *ids]
        if reply is not None:
            return httpx.Response(200, json=reply(ids))
        return httpx.Response(200, json={"meta_info": {"input_token_logprobs": [[None, t, None] for t in ids]}})

    return httpx.Client(transport=httpx.MockTransport(handle))


class CharTokenizer:
    def render(self, turns, *, add_generation_prompt):
        return "".join(f"[{t.role}]{t.content}" for t in turns) + ("[assistant]" if add_generation_prompt else "")

    def encode(self, text):
        return [ord(c) for c in text]


@pytest.mark.parametrize("bos", [False, True])
def test_tokenizer_agreement_accepts_the_same_tokenizer_with_or_without_bos(bos):
    from openjev.engines.http.sglang import verify_tokenizer

    seen: list = []
    # True: the server's ids were read and compared (a probe that could not be read is False)
    assert verify_tokenizer("http://s", CharTokenizer(), client=_probe_server(0, bos=bos, seen=seen)) is True
    [(path, body)] = seen
    assert path == "/generate" and body["logprob_start_len"] == 0  # the server lists every input token
    assert "Prüfe: naïve café" in body["text"] and body["text"].endswith("Answer:")  # a rendered prompt, as text


def test_tokenizer_mismatch_is_refused():
    from openjev.engines.http.sglang import verify_tokenizer
    from openjev.errors import ModelUnsuitable

    with pytest.raises(ModelUnsuitable, match="differs from ours"):
        verify_tokenizer("http://s", CharTokenizer(), client=_probe_server(1))


# ---- cache namespaces and what a failure discloses


def _in(namespace: str, plan: Plan) -> Plan:
    return Plan.from_branches(plan.branches, cache_namespace=namespace)


async def test_the_namespace_goes_to_the_radix_cache_as_extra_key():
    fake = FakeSGLang()
    engine = _engine(fake, strategy="warmup")
    try:
        a = await engine.run(_in("salt-a", _plan()))
        b = await engine.run(_in("salt-b", _plan()))
        a_again = await engine.run(_in("salt-a", _plan()))
        keyless = await engine.run(_plan())
    finally:
        await engine.close()
    bodies = [c["body"] for c in fake.calls]
    n = len(bodies) // 4
    assert {body["extra_key"] for body in bodies[:n]} == {"salt-a"}
    assert {body["extra_key"] for body in bodies[n : 2 * n]} == {"salt-b"}
    assert all("extra_key" not in body for body in bodies[3 * n :])  # no keys: the body as before
    assert b.cached_tokens == a.cached_tokens  # b finds nothing of a's state
    assert a_again.cached_tokens > a.cached_tokens and keyless.cached_tokens == a.cached_tokens


async def test_a_backend_error_reply_and_url_stay_out_of_the_public_message():
    def handler(request):
        if request.url.path == "/generate":
            return httpx.Response(500, text="Traceback: /srv/models/secret/config.json KeyError token=hunter2")
        return httpx.Response(200)

    engine = HTTPEngine("http://10.9.8.7:30000", SGLANG, transport=httpx.MockTransport(handler))
    with pytest.raises(EngineError) as failed:
        await _run(engine, _plan())
    assert failed.value.message == "the engine answered 500"
    assert "hunter2" in failed.value.detail and "10.9.8.7" in failed.value.detail


async def test_an_unreachable_backend_is_named_only_in_the_detail():
    def handler(request):
        raise httpx.ConnectError("connection refused by 10.9.8.7")

    engine = HTTPEngine("http://10.9.8.7:30000", SGLANG, transport=httpx.MockTransport(handler))
    with pytest.raises(EngineUnavailable) as failed:
        await _run(engine, _plan())
    assert "10.9.8.7" not in failed.value.message and "10.9.8.7" in failed.value.detail


async def test_auto_remembers_prefixes_per_namespace():
    """`auto` skips staging for a prefix it sent lately, only in the same namespace (the
    engine's cache has it only there)."""
    fake = FakeSGLang()
    engine = _engine(fake, strategy="auto")
    try:
        await engine.run(_in("salt-a", _plan()))
        await engine.run(_in("salt-a", _plan()))
        await engine.run(_in("salt-b", _plan()))
    finally:
        await engine.close()
    assert engine.strategies_used == {"staged": 2, "all": 1}


def test_a_server_that_cannot_list_its_tokens_is_not_verified_and_says_so(caplog):
    from openjev.engines.http.sglang import verify_tokenizer

    no_ids = _probe_server(0, reply=lambda ids: {"meta_info": {}})  # e.g. --skip-tokenizer-init
    assert verify_tokenizer("http://s", CharTokenizer(), client=no_ids) is False
    assert "could not verify" in caplog.text


# ---- health probe (GET /health of openjev asks it)


def _raises(error: type[httpx.TransportError]):
    def answer(request):
        raise error("what the transport saw", request=request)

    return answer


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (lambda request: httpx.Response(200, json={}), None),
        (lambda request: httpx.Response(503), "answered 503"),
        (_raises(httpx.ConnectError), "cannot be reached"),  # refused: the server is gone
        (_raises(httpx.ReadTimeout), "did not answer"),  # accepted, never answered: it stalls
    ],
)
async def test_probe_says_whether_the_server_answers_its_health(answer, expected):
    seen = []

    def handle(request):
        seen.append(request.url.path)
        return answer(request)

    engine = HTTPEngine("http://sglang.test", SGLANG, transport=httpx.MockTransport(handle))
    try:
        problem = await engine.probe()
    finally:
        await engine.close()
    assert seen == ["/health"]
    if expected is None:
        assert problem is None
    else:
        assert expected in problem and "sglang.test" not in problem  # /health is public: no address


async def test_an_unreachable_engine_is_503_with_retry_after():
    def refuse(request):
        raise httpx.RemoteProtocolError("Server disconnected without sending a response", request=request)

    engine = HTTPEngine("http://sglang.test", SGLANG, transport=httpx.MockTransport(refuse), retry_after_s=3)
    with pytest.raises(EngineUnavailable) as info:
        await _run(engine, _plan())
    assert info.value.status == 503 and info.value.headers["Retry-After"] == "3"


async def test_a_recent_reply_answers_the_probe_without_asking_health():
    fake = FakeSGLang()
    paths = []

    async def handle(request):
        paths.append(request.url.path)
        return await fake.handle(request)

    engine = HTTPEngine("http://sglang.test", SGLANG, transport=httpx.MockTransport(handle), probe_timeout_s=30)
    try:
        assert await engine.probe() is None  # nothing answered yet: asks /health
        await engine.run(_plan(1))
        assert await engine.probe() is None  # answered just now: does not ask
    finally:
        await engine.close()
    assert paths == ["/health", "/generate"]


async def test_a_call_that_cannot_reach_the_server_outweighs_a_recent_reply():
    fake = FakeSGLang()
    down = []

    async def handle(request):
        if down:
            raise httpx.ConnectError("connection refused", request=request)
        return await fake.handle(request)

    engine = HTTPEngine("http://sglang.test", SGLANG, transport=httpx.MockTransport(handle), probe_timeout_s=30)
    try:
        await engine.run(_plan(1))
        down.append(True)  # the server dies
        with pytest.raises(EngineUnavailable):
            await engine.run(_plan(1))
        assert "cannot be reached" in await engine.probe()
        down.clear()  # it is back
        assert await engine.probe() is None
    finally:
        await engine.close()


# ---- the server's context


async def test_a_plan_longer_than_the_servers_context_is_refused_before_any_call():
    from openjev.errors import TokensExceeded

    fake = FakeSGLang()
    with pytest.raises(TokensExceeded, match=r"342 tokens exceeds the SGLang server's context .*--context-length"):
        await _run(_engine(fake, max_prompt_tokens=341), _plan())
    assert fake.calls == []  # refused whole: no branch of it was computed
    result = await _run(_engine(fake, max_prompt_tokens=342), _plan())  # exactly the limit fits
    assert len(result.branches) == 4


@pytest.mark.parametrize(
    ("info", "limit"),
    [
        ({"max_req_input_len": 2047, "context_length": 4096}, 2047),  # the scheduler's own figure wins
        ({"context_length": 2048}, 2047),  # older servers: the context less the token generated
        ({"context_length": None}, None),
        ({"max_req_input_len": True}, None),  # not a number of tokens
        ({}, None),
    ],
)
def test_the_prompt_limit_is_read_from_the_servers_info(info, limit):
    from openjev.engines.http.sglang import max_prompt_tokens

    assert max_prompt_tokens(info) == limit


# ---- auto over batched calls: one call where the server's chunking shares the prefix


def _long(n: int = 4, state_len: int = 1000, tail: int = 60) -> Plan:
    state = tuple(range(100, 100 + state_len))
    return Plan.from_branches(
        [Branch(state + tuple(range(5000 + 100 * i, 5000 + 100 * i + tail)), LABELS) for i in range(n)]
    )


@pytest.mark.parametrize(
    ("step_tokens", "protocol", "expected"),
    [
        (1024, SGLANG_BATCHED, "all"),  # the first branch's first chunk covers the state: one call
        (8192, SGLANG_BATCHED, "staged"),  # every branch fits one step: admitted together
        (512, SGLANG_BATCHED, "all"),  # chunks 1-2 cover the state (1,024 of 1,060 tokens)
        (400, SGLANG_BATCHED, "staged"),  # the state spills into the first branch's last chunk (800 cached before it)
        (None, SGLANG_BATCHED, "staged"),  # the server does not say
        (1024, SGLANG, "staged"),  # one call per branch: they start side by side
    ],
)
async def test_auto_sends_one_batch_when_the_servers_chunking_computes_the_prefix_once(step_tokens, protocol, expected):
    fake = FakeSGLang()
    engine = _engine(fake, protocol, strategy="auto", step_tokens=step_tokens)
    await _run(engine, _long())
    assert engine.strategies_used == {expected: 1}


def test_the_servers_prefill_step_is_read_from_its_info():
    from openjev.engines.http.sglang import step_tokens

    assert step_tokens({"chunked_prefill_size": 8192, "max_prefill_tokens": 16384}) == 8192
    assert step_tokens({"chunked_prefill_size": 8192, "max_prefill_tokens": 512}) == 512
    assert step_tokens({"chunked_prefill_size": -1, "max_prefill_tokens": 512}) is None  # no chunking
    assert step_tokens({"max_prefill_tokens": 512}) is None


def test_a_server_that_drops_a_batchs_namespace_is_found_out():
    from openjev.engines.http.sglang import capabilities

    for drops in (False, True):
        fake = FakeSGLang(batch_drops_namespace=drops)
        protocol = capabilities("http://sglang.test", [5, 6, 7], client=httpx.Client(transport=fake.sync_transport()))
        assert protocol.batch_body is not None and protocol.batch_keeps_namespace is not drops


def test_a_server_that_saw_earlier_probes_still_keeps_its_namespace():
    """A restart, or a second openjev on the same server: the keyless cache already holds
    sequences that start with every token the probe draws from, so the probe's lone request
    finds a token or two cached. That is not a dropped key (which leaves all but the last
    token cached): batching stays on (it turned off, and every request of a keyed server
    went one call per branch)."""
    from openjev.engines.http.sglang import capabilities
    from openjev.engines.http.sglang_protocol import request_body

    ids = [5, 6, 7]
    for drops in (False, True):
        fake = FakeSGLang(batch_drops_namespace=drops)
        client = httpx.Client(transport=fake.sync_transport())
        for first in ids:  # what earlier start-ups' probes left in the keyless cache
            client.post("http://sglang.test/generate", json=request_body("seen", [first, first], [5], ""))
        protocol = capabilities("http://sglang.test", ids, client=client)
        assert protocol.batch_body is not None and protocol.batch_keeps_namespace is not drops


async def test_namespaced_plans_are_not_batched_where_the_server_would_drop_the_namespace():
    """SGLang-JAX 0.1.0rc0 loses `extra_key` when it splits a batch: a key's branches would
    enter (and be served from) the shared cache. Keyless plans are still batched."""
    from openjev.engines.http.sglang_protocol import sglang

    fake = FakeSGLang(batch_drops_namespace=True)
    engine = _engine(fake, sglang(batch=True, prefill_only=True, keeps_namespace=False), strategy="all")
    try:
        await engine.run(_in("salt-a", _plan()))
        namespaced = len(fake.calls)
        await engine.run(_plan())
    finally:
        await engine.close()
    assert namespaced == 4 and all(c["body"]["extra_key"] == "salt-a" for c in fake.calls[:4])
    assert len(fake.calls) == 5  # the keyless plan: one batched call
    assert set(fake.namespaces[:4]) == {"salt-a"}
