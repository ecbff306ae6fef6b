"""The llama.cpp engine on the embedded GGUF, for real (llama-cpp-python; `make test-llamacpp`).

The in-process PyTorch engine dequantizes the same GGUF (Q4_1) to float32 and computes in
float32 here (explicitly: `auto` picks bfloat16 on this CPU); llama.cpp computes on the Q4_1
blocks with int8-quantized activations and a float16 KV cache. So the two agree to a
bound, not bitwise: BOUND on every label probability, and every clear choice (the
reference's best option ahead of the next by CLEAR) the same. llama.cpp itself is not
batch-invariant (the same tokens decoded in another batch round otherwise), so a cached
state's answers are held to the same bound against a recompute.

    OPENJEV_LLAMACPP=1 .venv/bin/python -m pytest tests/llamacpp
"""

from __future__ import annotations

import asyncio
import os

import pytest

# Opt-in: `make test-llamacpp` installs the binding and sets OPENJEV_LLAMACPP=1; once asked
# for, a missing binding is a failure, not a skip.
pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        os.environ.get("OPENJEV_LLAMACPP") != "1", reason="the llama.cpp suite runs with `make test-llamacpp`"
    ),
]

from openjev.config import MAX_CHOICE_OPTIONS, load_settings  # noqa: E402
from openjev.core.prompts import PromptCompiler  # noqa: E402
from openjev.core.scoring import softmax  # noqa: E402
from openjev.core.service import DecisionService  # noqa: E402
from openjev.core.types import ChoiceAnswer, ChoiceQuestion, DecisionRequest, NoulAnswer, Option, State, Turn  # noqa: E402
from tests.support.limits import limits_of  # noqa: E402
from tests.support.models import EMBEDDED  # noqa: E402
from tests.support.tickets import QUESTIONS, TEXT  # noqa: E402

BOUND = 0.05  # largest label-probability difference against the PyTorch engine in float32
CLEAR = 0.1  # a choice is clear where its probability leads the next option's by this much
MANY = ChoiceQuestion("Which product line is this about?", tuple(Option(f"Line {i}", None) for i in range(40)))
MORE = (("late", QUESTIONS[0][1].__class__("Is the order late?")),)


def state(n: int, paragraphs: int = 4) -> State:
    """About 55 tokens a paragraph; distinct `n`, distinct states (never cached by another test)."""
    return State((Turn("user", TEXT.format(n=n) * paragraphs),))


@pytest.fixture(scope="module")
def llama():
    from openjev.engines import load_engine

    loaded = load_engine(load_settings({**EMBEDDED, "engine": "llamacpp"}, environ={}))
    yield loaded
    asyncio.run(loaded.engine.close())


@pytest.fixture(scope="module")
def torch32():
    from openjev.engines import load_engine

    loaded = load_engine(load_settings({**EMBEDDED, "dtype": "float32"}, environ={}))
    yield loaded
    asyncio.run(loaded.engine.close())


@pytest.fixture(scope="module")
def compiler(llama):
    return PromptCompiler(llama.tokenizer, max_labels=MAX_CHOICE_OPTIONS)


def worst_difference(got, want) -> float:
    worst = 0.0
    for a, b in zip(got.branches, want.branches, strict=True):
        assert len(a.logprobs) == len(b.logprobs)
        worst = max(worst, *(abs(x - y) for x, y in zip(softmax(a.logprobs), softmax(b.logprobs), strict=True)))
    return worst


def clear_argmax_agree(got, want) -> int:
    """Asserts every clear argmax is the same; returns how many branches were clear."""
    clear = 0
    for a, b in zip(got.branches, want.branches, strict=True):
        pa, pb = softmax(a.logprobs), softmax(b.logprobs)
        ranked = sorted(range(len(pb)), key=pb.__getitem__, reverse=True)
        if len(pb) < 2 or pb[ranked[0]] - pb[ranked[1]] >= CLEAR:
            clear += 1
            assert max(range(len(pa)), key=pa.__getitem__) == ranked[0]
    return clear


def test_tokenizer_is_the_in_process_engines(llama, torch32):
    text = "Hello <|im_start|> world, order #1234"
    assert llama.tokenizer.encode(text) == torch32.tokenizer.encode(text)
    turns = (Turn("user", "Hi"),)
    assert llama.tokenizer.render(turns, add_generation_prompt=True) == torch32.tokenizer.render(
        turns, add_generation_prompt=True
    )
    assert llama.card.fingerprint == torch32.card.fingerprint  # the same GGUF: the same calibration


async def test_every_distinct_token_is_computed_once_and_matches_the_pytorch_engine(llama, torch32, compiler):
    plan = compiler.compile(DecisionRequest(state(1), (*QUESTIONS, ("line", MANY)))).plan
    assert len(plan.branches) > 2 and plan.shared_prefix_len > 200
    before = llama.engine.computed_tokens
    got = await llama.engine.run(plan)
    assert got.computed_tokens == plan.unique_tokens == llama.engine.computed_tokens - before
    assert got.cached_tokens == 0 and plan.unique_tokens < plan.prompt_tokens
    want = await torch32.engine.run(plan)
    worst = worst_difference(got, want)
    clear = clear_argmax_agree(got, want)
    print(f"max probability difference {worst:.2e} over {len(plan.branches)} branches ({clear} clear)")
    assert worst < BOUND


async def test_answers_through_the_service_agree_with_the_pytorch_engine(llama, torch32, compiler):
    limits = limits_of(engine_timeout_s=600)
    request = DecisionRequest(state(2), (*QUESTIONS, *MORE, ("line", MANY)))
    got = await DecisionService(compiler, llama.engine, limits).decide(request)
    want = await DecisionService(compiler, torch32.engine, limits).decide(request)
    for (qa, a), (qb, b) in zip(got.answers, want.answers, strict=True):
        assert qa == qb and type(a) is type(b)
        if isinstance(a, NoulAnswer):
            assert abs(a.p_true - b.p_true) < BOUND
        elif isinstance(a, ChoiceAnswer):
            ranked = sorted((p for _, p in b.probabilities), reverse=True)
            if ranked[0] - ranked[1] >= CLEAR:
                assert a.choice == b.choice
            assert max(abs(x - y) for (_, x), (_, y) in zip(a.probabilities, b.probabilities, strict=True)) < BOUND
        else:
            assert max(abs(x - y) for x, y in zip(a.probabilities, b.probabilities, strict=True)) < BOUND
    assert got.usage.computed_tokens is not None and got.usage.cached_tokens is not None


async def test_a_seen_state_comes_from_the_cache_and_gives_the_cold_answers(llama, compiler):
    cold_plan = compiler.compile(DecisionRequest(state(3), QUESTIONS)).plan
    warm_plan = compiler.compile(DecisionRequest(state(3), MORE)).plan
    await llama.engine.run(cold_plan)
    warm = await llama.engine.run(warm_plan)
    assert warm.cached_tokens > 200 and warm.computed_tokens + warm.cached_tokens == warm_plan.unique_tokens
    fresh = compiler.compile(DecisionRequest(state(3), MORE, cache_namespace="fresh")).plan
    cold = await llama.engine.run(fresh)  # another namespace: computed again, never from the cache
    assert cold.cached_tokens == 0 and cold.computed_tokens == fresh.unique_tokens
    worst = worst_difference(warm, cold)
    print(f"cached vs recomputed: max probability difference {worst:.2e}")
    # llama.cpp is not batch-invariant: a suffix decoded over cached cells rounds otherwise
    # than the same tokens in one batch (measured 3.1e-2 here), as bfloat16 does in PyTorch
    assert worst < BOUND


async def test_a_cancelled_request_stops_and_the_next_one_is_answered(llama, compiler):
    engine = llama.engine
    plan = compiler.compile(
        DecisionRequest(state(4, paragraphs=40), QUESTIONS)
    ).plan  # ~2,300 tokens: decode calls of up to 512
    start = engine.decodes
    task = asyncio.create_task(engine.run(plan))
    while engine.decodes == start:  # the first decode call has finished
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    at_cancel = engine.computed_tokens
    small = compiler.compile(DecisionRequest(state(5), QUESTIONS)).plan
    result = await engine.run(small)
    assert len(result.branches) == len(small.branches)
    # the cancelled plan stopped at its next decode call (the one in flight, at most 512
    # tokens, may finish): beyond it, only the small plan's tokens were computed
    assert engine.computed_tokens - at_cancel <= 512 + result.computed_tokens
    # the cancelled root was never cached: only the chat template's head is shared with it
    assert result.cached_tokens < 100
    assert engine.cache.lookup(plan.root.tokens)[0] < 100


def test_jevcompat_is_conformant_over_this_engine(tmp_path):
    from tests.integration.conftest import start_server, stop_server
    from tests.integration.test_live_server import run_jevcompat

    server = start_server(tmp_path, "--engine", "llamacpp", key="test-key-llamacpp")
    try:
        run_jevcompat(server.url, server.key or "", tmp_path)
    finally:
        stop_server(server)


def test_an_ollama_store_name_is_served_from_its_blob(tmp_path):
    """`--model smollm2:135m` through an Ollama store laid out around the embedded GGUF: the
    blob served as it is, under the name as Ollama shows it; its tokenizer built from the GGUF
    on the first start and saved into the (empty) cache."""
    import httpx

    from openjev.engines.models.source import embedded_gguf
    from tests.integration.conftest import start_server, stop_server
    from tests.support.ollama_store import add_model

    store, cache = tmp_path / "ollama", tmp_path / "cache"
    blob = add_model(store, "smollm2", "135m", embedded_gguf())
    env = {"OLLAMA_MODELS": str(store)}
    server = start_server(
        tmp_path, "--engine", "llamacpp", "--model", "smollm2:135m", "--cache-dir", str(cache), env=env
    )
    try:
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["smollm2:135m"]
        body = {
            "model": "smollm2:135m",
            "state": "The parcel arrived two weeks late and the box was crushed.",
            "questions": {"late": {"type": "noul", "instructions": "Did the parcel arrive late?"}},
        }
        r = httpx.post(server.url + "/v1/systemone", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "smollm2:135m" and 0.0 <= r.json()["answers"]["late"]["noul"] <= 1.0
    finally:
        stop_server(server)
    saved = [p for p in (cache / "gguf").iterdir() if p.name.endswith("-tokenizer")]
    assert len(saved) == 1 and saved[0].name.startswith(blob.name)


def test_a_prestarted_load_is_taken_over_by_load():
    from openjev.engines import load_engine, prestart_engine
    from openjev.engines.llamacpp import load as llamacpp_load

    settings = load_settings({**EMBEDDED, "engine": "llamacpp"}, environ={})
    prestart_engine(settings)
    prestart_engine(settings)  # once per model: the second call finds the first's load
    (begun,) = llamacpp_load._started.values()
    loaded = load_engine(settings)
    try:
        assert not llamacpp_load._started and loaded.engine.backend is begun.result()
    finally:
        asyncio.run(loaded.engine.close())
