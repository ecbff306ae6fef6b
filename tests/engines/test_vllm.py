"""The vLLM protocol against a faithful fake of vLLM's token-in route (httpx MockTransport): its
replies, label chunking, context bound, start-up checks and cache namespace. The run loop shared
with SGLang (failures, timeouts, aborts) is tested over both fakes in test_http_engine.py."""

import math

import httpx
import pytest

from openjev.core.plan import Branch, Plan
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.vllm import check_server, child_args, verify_tokenizer
from openjev.engines.http.vllm_batch import batch_abort_bodies, batch_body, parse_batch_reply
from openjev.engines.http.vllm_protocol import MAX_IDS_PER_CALL, VLLM, VLLM_BATCHED, parse_reply, request_body
from openjev.errors import ConfigError, EngineError, ModelUnsuitable, TokensExceeded
from tests.support.fakes import FakeVLLM, fake_logprobs

LABELS = (10, 11, 12)
STATE = tuple(range(100, 400))  # a 300-token shared prefix


def _plan(n: int = 4, state=STATE, labels=LABELS) -> Plan:
    branches = []
    for i in range(n):
        group = tuple(range(1000 + 100 * (i % 2), 1040 + 100 * (i % 2)))
        branches.append(Branch(state + group + (5000 + i, 5001 + i), labels))
    return Plan.from_branches(branches)


def _engine(fake: FakeVLLM, **kw) -> HTTPEngine:
    return HTTPEngine("http://vllm.test", VLLM, transport=fake.transport(), **kw)


async def _run(engine: HTTPEngine, plan: Plan):
    try:
        return await engine.run(plan)
    finally:
        await engine.close()


# ---- replies


def _reply(entries, cached=2, **choice):
    sampled, *_rest = entries
    usage = {"prompt_tokens": 5, "completion_tokens": 1}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "token_ids": [sampled["token_id"]],
                "logprobs": {"content": [{**sampled, "top_logprobs": entries}]},
                **choice,
            }
        ],
        "usage": usage,
    }


def _e(token, logprob):
    return {"token_id": token, "logprob": logprob, "rank": 1}


def test_reply_is_read_by_token_id_not_position():
    values, prompt, cached = parse_reply(_reply([_e(12, -3.0), _e(10, -1.0), _e(11, -2.0)]), LABELS)
    assert values == (-1.0, -2.0, -3.0) and (prompt, cached) == (5, 2)


def test_clamped_minus_9999_is_minus_infinity_and_cached_tokens_may_be_absent():
    values, _, cached = parse_reply(_reply([_e(10, -1.0), _e(11, -9999.0), _e(12, -2.0)], cached=None), LABELS)
    assert values[1] == -math.inf and cached is None


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"error": {"message": "x"}}, "no single choice"),
        (_reply([_e(10, -1.0), _e(11, -2.0)]), "no log-probs for label tokens"),
        (_reply([_e(10, -9999.0), _e(11, -9999.0), _e(12, -9999.0)]), "probability zero"),
        (_reply([_e(10, float("nan")), _e(11, -1.0), _e(12, -1.0)]), "invalid"),
        (_reply([_e(10, 0.5), _e(11, -1.0), _e(12, -1.0)]), "invalid"),  # a log-prob above 0
        (_reply([_e(10, -1.0), _e(11, -1.0), _e(12, -1.0)], token_ids=[10, 11]), "expected 1"),
        (_reply([_e(10, -1.0), _e(11, -1.0), _e(12, -1.0)], finish_reason="abort"), "aborted"),
        (_reply([_e(10, -1.0)], logprobs=None), "no logprobs"),
    ],
)
def test_unusable_replies_are_engine_errors(body, why):
    with pytest.raises(EngineError, match=why):
        parse_reply(body, LABELS)


def test_request_is_one_prefill_with_raw_label_logprobs_and_a_label_as_the_sampled_token():
    body = request_body("r1", [1, 2, 3], LABELS)
    params = body["sampling_params"]
    assert body["token_ids"] == [1, 2, 3] and body["request_id"] == "r1" and body["output_mode"] == "tokens"
    assert params["max_tokens"] == 1 and params["logprob_token_ids"] == list(LABELS)
    assert params["logprobs"] == len(LABELS)  # without it vLLM returns no log-probs at all
    assert params["allowed_token_ids"] == list(LABELS)  # else the sampled token pushes the last label out


# ---- protocol


async def test_branches_get_their_own_logprobs_and_token_accounting_adds_up():
    fake = FakeVLLM()
    plan = _plan()
    result = await _run(_engine(fake, strategy="staged", stage_min_tokens=1), plan)
    for b, r in zip(plan.branches, result.branches, strict=True):
        assert r.logprobs == fake_logprobs(b.input_ids, len(LABELS))
    assert result.computed_tokens + result.cached_tokens == plan.prompt_tokens
    assert result.cached_tokens >= len(STATE) // 16 * 16 * (len(plan.branches) - 1)  # the state came from cache


async def test_more_than_128_labels_take_a_second_call_on_the_cached_prefix():
    labels = tuple(range(2000, 2000 + 200))
    fake = FakeVLLM()
    plan = _plan(1, labels=labels)
    result = await _run(_engine(fake), plan)
    assert [len(c["body"]["sampling_params"]["logprob_token_ids"]) for c in fake.calls] == [MAX_IDS_PER_CALL, 72]
    ids = plan.branches[0].input_ids
    assert result.branches[0].logprobs == (fake_logprobs(ids, MAX_IDS_PER_CALL) + fake_logprobs(ids, 72))
    # the second call found the first one's prompt cached (whole blocks); both calls counted
    assert result.cached_tokens == (len(ids) - 1) // 16 * 16
    assert result.computed_tokens + result.cached_tokens == 2 * len(ids)


async def test_a_branch_longer_than_the_servers_context_is_a_clear_4xx():
    with pytest.raises(TokensExceeded, match="max-model-len"):
        await _run(_engine(FakeVLLM(), max_prompt_tokens=100), _plan())


# ---- failures


# ---- start-up checks


def _client(fake: FakeVLLM) -> httpx.Client:
    return httpx.Client(base_url="http://vllm.test", transport=fake.sync_transport())


def test_check_server_learns_the_model_and_its_context():
    info = check_server("http://vllm.test", range(300, 555), client=_client(FakeVLLM(max_model_len=4096)))
    assert info == {"model": "/models/fake", "max_model_len": 4096, "cached_tokens": True, "protocol": VLLM_BATCHED}


def test_check_server_falls_back_to_a_call_per_branch_where_completions_does_not_batch():
    info = check_server("http://vllm.test", range(300, 555), client=_client(FakeVLLM(batch=False)))
    assert info["protocol"] is VLLM


def test_check_server_does_not_batch_a_server_whose_completions_read_otherwise():
    class Skewed(FakeVLLM):  # a completions route that answers, with other values than the token route
        async def _completions(self, body):
            response = await super()._completions(body)
            reply = response.json()
            for choice in reply["choices"]:
                top = choice["logprobs"]["top_logprobs"][0]
                choice["logprobs"]["top_logprobs"][0] = {k: v - 0.5 for k, v in top.items()}
            return httpx.Response(200, json=reply)

    assert check_server("http://vllm.test", LABELS, client=_client(Skewed()))["protocol"] is VLLM


@pytest.mark.parametrize(
    ("fake", "why"),
    [
        (FakeVLLM(route_status=403), "--enable-scale-out"),
        (FakeVLLM(route_status=404), "token-in route"),
        (FakeVLLM(max_logprobs=20), "--max-logprobs 128"),
    ],
)
def test_check_server_refuses_a_server_without_what_the_engine_needs(fake, why):
    with pytest.raises(ConfigError, match=why):
        check_server("http://vllm.test", range(300, 555), client=_client(fake))


def test_check_server_without_prompt_tokens_details_warns_and_reports_unknown(caplog):
    info = check_server("http://vllm.test", LABELS, client=_client(FakeVLLM(report_cached=False)))
    assert info["cached_tokens"] is False and "--enable-prompt-tokens-details" in caplog.text


def test_child_gets_the_required_flags_once():
    assert child_args(()) == ("--enable-scale-out", "--enable-prompt-tokens-details", "--max-logprobs", "128")
    given = ("--max-logprobs", "255", "--enable-scale-out", "--dtype", "float32")
    assert child_args(given) == (*given, "--enable-prompt-tokens-details")


class CharTokenizer:
    def render(self, turns, *, add_generation_prompt):
        return "".join(f"[{t.role}]{t.content}" for t in turns) + ("[assistant]" if add_generation_prompt else "")

    def encode(self, text):
        return [ord(c) for c in text]


def test_tokenizer_agreement_accepts_the_same_tokenizer_and_refuses_another():
    same = FakeVLLM(tokenize=lambda text: [1] + [ord(c) for c in text])  # with a BOS
    verify_tokenizer("http://vllm.test", CharTokenizer(), client=_client(same))
    other = FakeVLLM(tokenize=lambda text: [ord(c) + 1 for c in text])
    with pytest.raises(ModelUnsuitable, match="differs from ours"):
        verify_tokenizer("http://vllm.test", CharTokenizer(), client=_client(other))


async def test_auto_sends_everything_at_once_since_vllm_shares_prefixes_within_a_batch():
    fake = FakeVLLM()
    engine = _engine(fake, strategy="auto", warmup_min_tokens=16)
    try:
        await engine.run(_plan())  # a long cold prefix: SGLang's auto would stage this
    finally:
        await engine.close()
    assert engine.strategies_used == {"all": 1}


# ---- settings


def test_flags_after_double_dash_go_to_the_vllm_child(monkeypatch, tmp_path):
    from openjev.cli import _settings, build_parser
    from openjev.engines import preflight_engine as preflight  # the sections of --engine vllm

    for name in ("OPENJEV_ENGINE", "OPENJEV_VLLM_ARGS", "OPENJEV_SGLANG_ARGS"):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(
        [
            "serve",
            "--engine",
            "vllm",
            "--vllm-python",
            "/x/python",
            "--model",
            str(tmp_path),
            "--vllm-arg=--dtype=float32",
        ]
    )
    s = _settings(args, ["--block-size", "32"])
    assert s.remote.vllm_args == ("--dtype=float32", "--block-size", "32") and s.remote.sglang_args == ()
    preflight(s)  # a consistent set
    s = _settings(build_parser().parse_args(["serve", "--engine", "sglang"]), ["--tp", "2"])
    assert s.remote.sglang_args == ("--tp", "2") and s.remote.vllm_args == ()


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ([], "exactly one of --connect"),
        (["--connect", "http://v", "--vllm-python", "/x/python"], "exactly one of --connect"),
        (["--vllm-python", "/x/python"], "needs --model"),
        (["--connect", "http://v"], "tokenizes here"),
        (["--connect", "http://v", "--model", "{tmp}", "--strategy", "eager"], "--strategy"),
        (["--connect", "http://v", "--model", "{tmp}", "--vllm-arg=--no-enable-prefix-caching"], "prefix cache"),
    ],
)
def test_preflight_refuses_settings_that_cannot_work(flags, why, tmp_path, monkeypatch):
    from openjev.cli import _settings, build_parser
    from openjev.engines import preflight_engine as preflight  # the sections of --engine vllm

    for name in ("OPENJEV_CONNECT", "OPENJEV_MODEL", "OPENJEV_VLLM_PYTHON", "OPENJEV_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    argv = ["serve", "--engine", "vllm", *(f.replace("{tmp}", str(tmp_path)) for f in flags)]
    with pytest.raises(ConfigError, match=why):
        preflight(_settings(build_parser().parse_args(argv)))


# ---- cache namespaces


async def test_the_namespace_goes_to_the_prefix_cache_as_cache_salt():
    fake = FakeVLLM()
    engine = _engine(fake)
    try:
        a = await engine.run(Plan.from_branches(_plan().branches, cache_namespace="salt-a"))
        b = await engine.run(Plan.from_branches(_plan().branches, cache_namespace="salt-b"))
        a_again = await engine.run(Plan.from_branches(_plan().branches, cache_namespace="salt-a"))
        keyless = await engine.run(_plan())
    finally:
        await engine.close()
    bodies = [c["body"] for c in fake.calls]
    assert [body.get("cache_salt") for body in bodies] == ["salt-a"] * 4 + ["salt-b"] * 4 + ["salt-a"] * 4 + [None] * 4
    assert b.cached_tokens == a.cached_tokens  # b finds nothing of a's state
    assert a_again.cached_tokens > a.cached_tokens and keyless.cached_tokens == a.cached_tokens


# ---- batched: a stage in one /v1/completions (VLLM_BATCHED)


def _batched(fake: FakeVLLM, **kw) -> HTTPEngine:
    return HTTPEngine("http://vllm.test", VLLM_BATCHED, transport=fake.transport(), **kw)


def test_batch_body_asks_every_item_for_the_union_of_labels_as_token_ids():
    body = batch_body(["r1", "r2"], [((1, 2, 3), (10, 11)), ((1, 2), (11, 12))], "salt")
    assert body["prompt"] == [[1, 2, 3], [1, 2]] and body["request_id"] == "r1" and body["cache_salt"] == "salt"
    assert body["logprob_token_ids"] == body["allowed_token_ids"] == [10, 11, 12] and body["logprobs"] == 3
    assert body["max_tokens"] == 1 and body["return_tokens_as_token_ids"] and not body["stream"]
    assert batch_abort_bodies(["r1", "r2"]) == [{"request_ids": ["cmpl-r1-0", "cmpl-r1-1"]}]


async def test_a_stage_is_one_completions_call_and_each_branch_reads_its_own_labels():
    fake = FakeVLLM()
    plan = _plan()
    got = await _run(_batched(fake, strategy="all"), plan)
    assert [c["body"].get("prompt") is not None for c in fake.calls] == [True]  # one call, every branch
    for branch, result in zip(plan.branches, got.branches, strict=True):
        assert result.logprobs == fake_logprobs(branch.input_ids, len(LABELS))
    assert got.computed_tokens is None and got.cached_tokens is None  # vLLM reports one item's cached tokens


async def test_branches_with_other_labels_are_read_by_token_id_from_the_union():
    fake = FakeVLLM()
    plan = Plan.from_branches([Branch((*STATE, 7, 8), (10, 11)), Branch((*STATE, 9), (12, 10))])
    got = await _run(_batched(fake, strategy="all"), plan)
    assert len(fake.calls) == 1 and fake.calls[0]["body"]["logprob_token_ids"] == [10, 11, 12]
    for branch, result in zip(plan.branches, got.branches, strict=True):
        union = fake_logprobs(branch.input_ids, 3)
        assert result.logprobs == tuple(union[[10, 11, 12].index(t)] for t in branch.label_ids)


async def test_a_lone_branch_and_a_union_over_128_labels_take_the_token_route():
    fake = FakeVLLM()
    lone = await _run(_batched(fake), Plan.from_branches([Branch((*STATE, 7), LABELS)]))
    assert "token_ids" in fake.calls[0]["body"] and lone.cached_tokens is not None  # accounting known
    wide = Plan.from_branches([Branch((*STATE, 7), tuple(range(1, 100))), Branch((*STATE, 8), tuple(range(100, 200)))])
    fake = FakeVLLM()
    await _run(_batched(fake, strategy="all"), wide)
    assert ["token_ids" in c["body"] for c in fake.calls] == [True, True]


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda r: r["choices"].pop(), "choices for a batch"),
        (lambda r: r["choices"][0].update(index=5), "indices"),
        (lambda r: r["choices"][1]["logprobs"]["top_logprobs"][0].pop("token_id:11"), "no log-probs for label"),
        (lambda r: r["choices"][0].update(finish_reason="abort"), "aborted"),
        (lambda r: r["choices"][0]["logprobs"].update(top_logprobs=[]), "1 token"),
    ],
)
def test_unusable_batch_replies_are_engine_errors(mutate, why):
    reply = {
        "choices": [
            {
                "index": i,
                "finish_reason": "length",
                "logprobs": {"top_logprobs": [{"token_id:10": -1.0, "token_id:11": -2.0}]},
            }
            for i in range(2)
        ]
    }
    assert [r[0] for r in parse_batch_reply(reply, ["a", "b"], [(11, 10), (10,)])] == [(-2.0, -1.0), (-1.0,)]
    mutate(reply)
    with pytest.raises(EngineError, match=why):
        parse_batch_reply(reply, ["a", "b"], [(11, 10), (10, 11)])


async def test_a_namespaced_stage_is_batched_under_its_cache_salt():
    fake = FakeVLLM()
    await _run(_batched(fake, strategy="all"), Plan.from_branches(_plan().branches, cache_namespace="salt-a"))
    assert [c["body"].get("cache_salt") for c in fake.calls] == ["salt-a"]


async def test_a_branch_of_over_128_labels_goes_alone_and_the_others_stay_batched():
    fake = FakeVLLM()
    plan = Plan.from_branches(
        [Branch((*STATE, 7), LABELS), Branch((*STATE, 8), tuple(range(1, 201))), Branch((*STATE, 9), LABELS)]
    )
    got = await _run(_batched(fake, strategy="all"), plan)
    shapes = sorted(len(c["body"]["prompt"]) if "prompt" in c["body"] else 0 for c in fake.calls)
    assert shapes == [0, 0, 2]  # the 200-label branch in two token-route calls, the others in one batch
    assert got.branches[0].logprobs == fake_logprobs(plan.branches[0].input_ids, len(LABELS))
    assert len(got.branches[1].logprobs) == 200
