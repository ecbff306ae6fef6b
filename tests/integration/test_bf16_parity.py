"""bfloat16 against float32 on the embedded model: the same decisions, probabilities within
a stated tolerance (the CPU fast path, `--dtype auto` on CPUs with native bfloat16).

float32 is exact to 1e-4 against independent prefills (test_embedded_model.py); bfloat16
rounds every activation to 8 bits of mantissa, so it is held to its own, looser bounds:
- the largest difference of any answer probability stays under BF16_MAX_PROB_DIFF;
- the argmax (the chosen option; for noul, p_true on the same side of 0.5) agrees on every
  question whose float32 top-two margin is wider than twice that bound (closer calls may
  flip by rounding alone), and on at least BF16_MIN_AGREEMENT of all questions.
"""

import asyncio

import pytest

from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService
from openjev.core.types import (
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
from openjev.engines.torch.dtype import cpu_flags, native_bf16
from tests.support.limits import limits_of
from tests.support.tickets import QUESTIONS as TICKET_QUESTIONS

pytestmark = pytest.mark.model

# The bound depends on how the CPU computes bfloat16. Native (AMX, AVX512-BF16, Arm bf16: the
# path `--dtype auto` takes): 0.05. Without native support torch emulates bfloat16 with float32
# arithmetic and rounds at other points; forced there (`--dtype bfloat16`, never chosen by auto)
# the largest difference measured was 0.058 on a 2-core AMD EPYC with AVX2 only (every clear
# argmax still agreed), so that path is held to 0.08. Emulation is also ~30x slower, so it is
# checked on the first three states only (the states are independent requests).
NATIVE = native_bf16(cpu_flags()) is not None
BF16_MAX_PROB_DIFF = 0.05 if NATIVE else 0.08
BF16_MIN_AGREEMENT = 0.9

STATES = (
    "Hello, I ordered a blue jacket (order #4471) three weeks ago. It still has not arrived, and yesterday my card "
    "was charged a second time for the same order. I want the duplicate charge refunded today.",
    "The app crashes every time I open the settings page on my phone since the last update. I reinstalled it twice.",
    "Thanks a lot, the replacement arrived this morning and it works perfectly. Great service!",
    "I want to return the shoes I bought last week, they are one size too small. Can I exchange them instead?",
    "This is the third time I write. Nobody answers. If my money is not back by Friday I am calling my lawyer.",
    "Could you tell me whether you ship to Norway, and how long delivery usually takes?",
    "My password reset email never arrives. I checked the spam folder. I cannot log in to pay my invoice.",
    "The parcel was delivered to the wrong address, a neighbour brought it over, but the box was damaged and "
    "the lamp inside is broken.",
)[: None if NATIVE else 3]
EXTRA_QUESTIONS = (
    ("positive", NoulQuestion("Is the customer satisfied?")),
    (
        "lang",
        ChoiceQuestion(
            "Which language is the message written in?",
            (Option("English", None), Option("French", None), Option("German", None)),
        ),
    ),
    (
        "kind",
        ChoiceQuestion(
            "What kind of message is this?",
            (
                Option("complaint", "The customer reports a problem"),
                Option("question", "The customer asks something"),
                Option("praise", "The customer is happy"),
            ),
        ),
    ),
    ("priority", ScoreQuestion("How urgent is it?", ("Low", "Medium", "High"))),
)
QUESTIONS = (*TICKET_QUESTIONS, *EXTRA_QUESTIONS)


def _distribution(answer) -> list[float]:
    if isinstance(answer, NoulAnswer):
        return [answer.p_true, 1 - answer.p_true]
    if isinstance(answer, ChoiceAnswer):
        return [p for _, p in answer.probabilities]
    return list(answer.probabilities)


def _answers(loaded) -> list[list[float]]:
    service = DecisionService(
        PromptCompiler(loaded.tokenizer, max_labels=255), loaded.engine, limits_of(engine_timeout_s=600)
    )

    async def go():
        return [await service.decide(DecisionRequest(State((Turn("user", s),)), QUESTIONS)) for s in STATES]

    return [_distribution(a) for result in asyncio.run(go()) for _, a in result.answers]


def bf16_parity(reference: list[list[float]], candidate: list[list[float]]) -> dict:
    """Largest probability difference and argmax agreement of candidate against reference."""
    worst, agree, clear, clear_agree = 0.0, 0, 0, 0
    for ref, got in zip(reference, candidate, strict=True):
        worst = max(worst, *(abs(a - b) for a, b in zip(ref, got, strict=True)))
        same = max(range(len(ref)), key=ref.__getitem__) == max(range(len(got)), key=got.__getitem__)
        agree += same
        top = sorted(ref, reverse=True)
        if top[0] - top[1] > 2 * BF16_MAX_PROB_DIFF:
            clear += 1
            clear_agree += same
    return {
        "questions": len(reference),
        "max_prob_diff": worst,
        "argmax_agreement": agree / len(reference),
        "clear_questions": clear,
        "clear_agreement": clear_agree,
    }


def test_bfloat16_answers_match_float32_within_tolerance(embedded, embedded_bf16):
    parity = bf16_parity(_answers(embedded), _answers(embedded_bf16))
    print(parity)
    assert parity["questions"] == len(STATES) * len(QUESTIONS)
    assert parity["max_prob_diff"] < BF16_MAX_PROB_DIFF, parity
    assert parity["clear_agreement"] == parity["clear_questions"] > 0, parity
    assert parity["argmax_agreement"] >= BF16_MIN_AGREEMENT, parity


def test_the_prefix_cache_holds_a_bfloat16_state_in_half_the_bytes(embedded, embedded_bf16):
    from openjev.engines.torch.engine import TransformersEngine

    request = DecisionRequest(State((Turn("user", STATES[0]),)), QUESTIONS[:2])
    sizes = {}
    for name, loaded in (("float32", embedded), ("bfloat16", embedded_bf16)):
        plan = PromptCompiler(loaded.tokenizer, max_labels=255).compile(request).plan
        engine = TransformersEngine(loaded.engine.model, prefix_cache_bytes=1 << 28)

        async def go(engine=engine, plan=plan):
            try:
                await engine.run(plan)
            finally:
                await engine.close()

        asyncio.run(go())
        assert len(engine.cache) == 1
        sizes[name] = engine.cache.nbytes
    assert sizes["bfloat16"] * 2 == sizes["float32"] > 0
