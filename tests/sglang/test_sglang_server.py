"""openjev's SGLang engine against real SGLang-protocol servers on CPU, parametrized over the
server kind (tests/sglang/server.py: KINDS): SGLang-JAX ("jax") and the real SGLang 0.5.23 on
PyTorch ("torch").

`make test-sglang` runs the jax kind (it installs SGLang-JAX with scripts/setup_sglang_jax.sh),
`make test-sglang-torch` the torch kind (scripts/setup_sglang_torch.sh), so `make test` stays
fast. The server loads the embedded model's converted float32 weights (the same the in-process
engine uses), so every strategy must give the in-process engine's answers.

    OPENJEV_SGLANG_JAX=1 .venv/bin/python -m pytest tests/sglang
    OPENJEV_SGLANG_TORCH=1 .venv/bin/python -m pytest tests/sglang
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.sglang import server as sgl

# Opt-in (`make test-sglang` sets OPENJEV_SGLANG_JAX=1, `make test-sglang-torch`
# OPENJEV_SGLANG_TORCH=1): minutes of CPU. Once asked for, a missing install is a failure, not a skip.
pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not sgl.enabled_kinds(), reason="the real SGLang suites run with `make test-sglang` / `make test-sglang-torch`"
    ),
]

from openjev.config import MAX_CHOICE_OPTIONS, load_settings  # noqa: E402
from openjev.core.prompts import PromptCompiler  # noqa: E402
from openjev.core.scoring import softmax  # noqa: E402
from openjev.core.types import (  # noqa: E402
    ChoiceQuestion,
    DecisionRequest,
    NoulQuestion,
    Option,
    ScoreQuestion,
    State,
    Turn,
)
from openjev.engines.http.engine import HTTPEngine  # noqa: E402
from openjev.engines.http.protocol import HTTPProtocol  # noqa: E402
from openjev.engines.http.remote import PROBE_TEXT  # noqa: E402
from openjev.engines.http.sglang import capabilities, verify_tokenizer  # noqa: E402
from openjev.engines.http.sglang_protocol import SGLANG  # noqa: E402
from openjev.errors import ModelUnsuitable  # noqa: E402
from tests.support.models import EMBEDDED  # noqa: E402
from tests.support.tickets import QUESTIONS, TEXT  # noqa: E402

STRATEGIES = ("all", "warmup", "staged", "auto")
MORE_QUESTIONS = (
    ("late", NoulQuestion("Is the order late?")),
    ("channel", ChoiceQuestion("Where should the answer go?", (Option("email", None), Option("phone", None)))),
    ("urgency", ScoreQuestion("How urgent is this?", ("Low", "Medium", "High"))),
)


def state(n: int) -> State:
    """About 220 tokens; distinct `n`, distinct states (never cached by another test)."""
    return State((Turn("user", TEXT.format(n=n) * 4),))


@pytest.fixture(scope="module")
def loaded():
    """The in-process engine on the embedded model (its first load also writes the
    converted safetensors folder the server reads)."""
    from openjev.engines import load_engine

    return load_engine(load_settings({**EMBEDDED, "dtype": "float32"}, environ={}))  # the server runs float32


@pytest.fixture(scope="module")
def compiler(loaded):
    return PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)


@pytest.fixture(scope="module")
def server(sgl_server):
    """The kind's shared server (tests/sglang/conftest.py: sgl_server)."""
    return sgl_server


def reference_engine(loaded):
    from openjev.engines.torch.engine import TransformersEngine

    return TransformersEngine(loaded.engine.model, prefix_cache_bytes=0)


@pytest.fixture(scope="module")
def protocol(loaded, server) -> HTTPProtocol:
    """What the engine speaks to this server, probed as `openjev serve` probes it at start-up."""
    return capabilities(server.url, loaded.tokenizer.encode(PROBE_TEXT)[:8])


def remote(server, strategy: str, protocol: HTTPProtocol = SGLANG) -> HTTPEngine:
    return HTTPEngine(server.url, protocol, strategy=strategy, call_timeout_s=600)  # a CPU forward takes seconds


def test_the_server_takes_batched_prefill_only_calls(server, protocol):
    """SGLang 0.5.23 takes a stage's branches in one /generate, prefill-only (the probe's
    replies were read as the engine reads them); SGLang-JAX takes what its probe showed."""
    print(f"{server.kind}: batched {protocol.batch_body is not None}, prefill-only {protocol.prefill_only}")
    if server.kind == "torch":
        assert protocol.batch_body is not None and protocol.prefill_only


async def run_with(engine, plan):
    try:
        return await engine.run(plan)
    finally:
        await engine.close()


async def while_busy(server, engine, plan, tag: int):
    """Run `plan` while the server is busy with an unrelated prefill.

    An idle CPU server starts on the first branch that arrives, alone, and its siblings
    (arriving milliseconds later) queue behind it and find the prefix cached: `all` gets
    staged by accident. A busy server, the case strategies are for, queues them together.
    """
    import httpx

    filler = [1000 + (tag * 7 + i) % 40000 for i in range(400)]
    async with httpx.AsyncClient(timeout=600) as client:
        blocker = asyncio.create_task(
            client.post(
                server.url + "/generate",
                json={
                    "input_ids": filler,
                    "sampling_params": {"max_new_tokens": 1},
                    "return_logprob": True,
                    "logprob_start_len": -1,
                    "token_ids_logprob": [5],
                },
            )
        )
        await asyncio.sleep(0.5)  # it is being prefilled now
        result = await run_with(engine, plan)
        (await blocker).raise_for_status()
    return result


@pytest.mark.parametrize("strategy", [*STRATEGIES, "per-branch"])
async def test_every_strategy_gives_the_in_process_probabilities(loaded, compiler, server, protocol, strategy):
    """Over the protocol the server takes (batched, prefill-only on SGLang 0.5.23), and over
    the per-branch calls older servers get (`per-branch`: one token generated per call)."""
    if strategy == "per-branch":
        strategy, protocol = "staged", SGLANG
        tag = 100 + len(STRATEGIES)
    else:
        tag = 100 + STRATEGIES.index(strategy)
    plan = compiler.compile(DecisionRequest(state(tag), QUESTIONS)).plan
    assert plan.shared_prefix_len > 200
    engine = remote(server, strategy, protocol)
    got = await run_with(engine, plan)
    local = await run_with(reference_engine(loaded), plan)
    assert len(got.branches) == len(local.branches) == len(plan.branches)
    worst = 0.0
    for b, r, loc in zip(plan.branches, got.branches, local.branches, strict=True):
        assert len(r.logprobs) == len(loc.logprobs) == len(b.label_ids)
        pr, pl = softmax(r.logprobs), softmax(loc.logprobs)
        worst = max(worst, *(abs(x - y) for x, y in zip(pr, pl, strict=True)))
    assert worst < 1e-3, f"{strategy}: max probability difference {worst:.2e}"
    expected = "staged" if strategy == "auto" else strategy  # a cold, long shared prefix
    assert engine.strategies_used == {expected: 1}


async def test_cached_tokens_are_reported_and_staging_computes_less(compiler, server, protocol):
    cold_all = compiler.compile(DecisionRequest(state(200), QUESTIONS)).plan
    cold_staged = compiler.compile(DecisionRequest(state(201), QUESTIONS)).plan
    warm = compiler.compile(DecisionRequest(state(201), MORE_QUESTIONS)).plan  # same state, new questions
    assert cold_all.prompt_tokens == cold_staged.prompt_tokens  # equally long: comparable costs

    assert sgl.flush_cache(server.url), "POST /flush_cache failed"
    a = await while_busy(server, remote(server, "all", protocol), cold_all, 1)
    assert sgl.flush_cache(server.url), "POST /flush_cache failed"
    s = await while_busy(server, remote(server, "staged", protocol), cold_staged, 2)
    w = await run_with(remote(server, "all", protocol), warm)

    for result, plan in ((a, cold_all), (s, cold_staged), (w, warm)):
        assert result.cached_tokens is not None and result.computed_tokens is not None  # reported
        assert result.computed_tokens + result.cached_tokens == plan.prompt_tokens
    assert s.computed_tokens < a.computed_tokens, (s, a)
    assert s.computed_tokens <= cold_staged.unique_tokens + len(cold_staged.branches)  # about the floor
    assert w.cached_tokens >= warm.shared_prefix_len, (w, warm.shared_prefix_len)


async def test_the_server_keeps_each_cache_namespace_to_itself(compiler, server, protocol):
    """Per-key namespaces (api/identity/tenancy.py) reach the server as `extra_key`, which its radix
    cache keys on (SGLang-JAX and SGLang alike): a state sent under one namespace is found cached by that namespace's
    repeat, and computed again under another."""

    def plan_for(namespace: str):
        return compiler.compile(DecisionRequest(state(300), QUESTIONS, cache_namespace=namespace)).plan

    alice, bob = plan_for("alice-salt"), plan_for("bob-salt")
    assert alice.cache_namespace == "alice-salt" and alice.prompt_tokens == bob.prompt_tokens
    first = await run_with(remote(server, "staged", protocol), alice)
    again = await run_with(remote(server, "staged", protocol), alice)
    other = await run_with(remote(server, "staged", protocol), bob)
    print(
        f"computed/cached: alice {first.computed_tokens}/{first.cached_tokens}, "
        f"alice again {again.computed_tokens}/{again.cached_tokens}, bob {other.computed_tokens}/{other.cached_tokens}"
    )
    assert first.computed_tokens >= alice.shared_prefix_len  # cold
    assert again.computed_tokens < alice.shared_prefix_len  # the state came from alice's cache
    assert other.computed_tokens >= bob.shared_prefix_len  # not from alice's
    # bob, cold in his namespace, finds no more than alice did cold in hers (SGLang-JAX
    # 0.1.0rc0 dropped a batch's extra_key: bob then found 629 cached where alice found 68)
    assert other.cached_tokens <= first.cached_tokens + len(bob.branches), (first, other)


@pytest.mark.parametrize("readout", ["yesno", "letters-r2"])
async def test_other_readouts_give_the_in_process_probabilities(loaded, compiler, server, protocol, readout):
    """Readouts are ordinary branches of the trie: the SGLang engine runs them unchanged."""
    from openjev.core.readouts import LettersReadout, YesNoReadout

    ro = (
        YesNoReadout(*compiler.yes_no)
        if readout == "yesno"
        else LettersReadout(compiler.labels.texts, compiler.labels.ids, rotations=2)
    )
    request = DecisionRequest(state(300 + len(readout)), QUESTIONS)
    compiled = compiler.compile(request, ro)
    plan = compiled.plan
    assert len(plan.branches) > len(QUESTIONS)
    got = await run_with(remote(server, "auto", protocol), plan)
    local = await run_with(reference_engine(loaded), plan)
    worst = 0.0
    for (_, question), (start, count) in zip(request.questions, compiled.spans, strict=True):
        a = ro.combine(question, [r.logprobs for r in got.branches[start : start + count]])
        b = ro.combine(question, [r.logprobs for r in local.branches[start : start + count]])
        worst = max(worst, *(abs(x - y) for x, y in zip(a.probs, b.probs, strict=True)))
    assert worst < 1e-3, f"{readout}: max answer probability difference {worst:.2e}"


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


def only(server, *kinds: str) -> None:
    if server.kind not in kinds:
        pytest.skip(f"checked on the {'/'.join(kinds)} kind only (not yet run against {server.kind})")


async def test_a_batch_mixing_logprob_and_plain_requests_is_served(server):
    """sgl-project/sglang#34719: SGLang 0.5.19 crashed on a batch that mixed requests with and
    without `return_logprob`, so every call we send asks for selected log-probs, warm-ups
    included (sglang_protocol.py). This checks the server at hand: on SGLang 0.5.23 the mix is
    served (the workaround is kept for older servers; it costs one label's log-prob)."""
    import httpx

    only(server, "torch")
    assert sgl.flush_cache(server.url), "POST /flush_cache failed"
    mark = len(server.log_path.read_text(errors="replace"))

    def body(i: int) -> dict:
        b: dict = {"input_ids": [4000 + i] * 40 + list(range(5000, 5060)), "sampling_params": {"max_new_tokens": 1}}
        if i % 2 == 0:
            b.update(return_logprob=True, logprob_start_len=-1, token_ids_logprob=[9, 10])
        return b

    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        # A prefill in progress first, so that the eight below queue and are admitted together.
        blocker = asyncio.create_task(
            client.post("/generate", json={**body(100), "input_ids": list(range(6000, 6400))})
        )
        await asyncio.sleep(0.5)
        replies = await asyncio.gather(*(client.post("/generate", json=body(i)) for i in range(8)))
        (await blocker).raise_for_status()
        healthy = (await client.get("/health")).status_code
    for i, r in enumerate(replies):
        assert r.status_code == 200, (i, r.text[:300])
        meta = r.json()["meta_info"]
        assert meta["completion_tokens"] == 1
        if i % 2 == 0:
            assert [e[1] for e in meta["output_token_ids_logprobs"][0]] == [9, 10]
    assert healthy == 200
    log = server.log_path.read_text(errors="replace")[mark:]
    batches = [int(line.split("#new-seq: ")[1].split(",")[0]) for line in log.splitlines() if "#new-seq: " in line]
    print("prefill batches (new sequences each):", batches)
    assert max(batches) >= 2, "the mixed requests never shared a batch: nothing was tested"


async def test_a_cancelled_request_is_aborted_on_the_server(compiler, server, protocol):
    """A request cancelled mid-plan (client gone, deadline) aborts its calls on the server
    (`/abort_request`), which drops them: what was still queued is never computed.

    The server is paused (SIGSTOP) from its first prefill of the plan until the aborts are
    posted, so the plan is mid-prefill when it is cancelled on a CPU of any speed (a Xeon
    with AMX prefilled the whole plan within the 2 s this test once waited). The server
    schedules first come, first served, so when a request sent after the cancellation is
    answered, every call still queued before it would have been computed too; asking for
    the plan again then shows, in computed tokens, what was dropped."""
    only(server, "torch")
    questions = (*QUESTIONS, *MORE_QUESTIONS)
    plan = compiler.compile(DecisionRequest(State((Turn("user", TEXT.format(n=400) * 14),)), questions)).plan
    assert len(plan.branches) >= 6 and plan.prompt_tokens > 5000 and max(len(b.input_ids) for b in plan.branches) < 1024
    assert sgl.flush_cache(server.url), "POST /flush_cache failed"
    mark = len(server.log_tail(10**9))
    engine = remote(server, "all", protocol)  # every branch at once: most of them wait in the server's queue
    run = asyncio.ensure_future(engine.run(plan))
    try:
        deadline = time.monotonic() + 60
        while not server.logged_since(mark, "#new-seq: "):  # its first prefill batch has begun
            assert not run.done() and time.monotonic() < deadline, "the server never began the plan"
            await asyncio.sleep(0.02)
        with server.paused():
            await asyncio.sleep(0.5)
            assert not run.done(), "the plan was answered before it could be cancelled: nothing was tested"
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await asyncio.sleep(0.5)  # the aborts are posted: they wait in the paused server's sockets
    finally:
        run.cancel()
        await engine.close()  # waits for the aborts it sent
    after = compiler.compile(DecisionRequest(state(401), QUESTIONS[:1])).plan
    await run_with(remote(server, "all", protocol), after)  # queued behind whatever was not dropped
    again = await run_with(remote(server, "all", protocol), plan)
    print(f"plan {plan.prompt_tokens} tokens in {len(plan.branches)} branches; again computed {again.computed_tokens}")
    # Not aborted, each branch would be cached but for its last token (computed == branches).
    assert again.computed_tokens > 10 * len(plan.branches), again


def test_server_info_names_the_model_through_a_current_route(server):
    """openjev reads the server's settings (radix cache on? which model?) from /server_info,
    falling back to the older /get_server_info (SGLang-JAX): SGLang 0.5.23 answers the new
    route, so no deprecation warning lands in its log for each start-up check."""
    from openjev.engines.http.sglang import server_info

    info = server_info(server.url)
    assert info.get("model_path"), sorted(info)[:20]
    assert not info.get("disable_radix_cache")  # on, or not said (then openjev assumes on)
    if server.kind == "torch":
        assert "'/get_server_info' is deprecated" not in server.log_tail(100_000)
