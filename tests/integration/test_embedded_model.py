"""The real embedded model (SmolLM2-135M-Instruct) through the in-process engine."""

import asyncio
import math
import threading

import pytest
import torch

from openjev.core.plan import Plan
from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService, ServiceLimits
from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion, Option, ScoreQuestion, State, Turn
from openjev.engines.inprocess import TransformersEngine, _Cancelled

STATE = State((Turn("user", "Hello, I ordered a blue jacket (order #4471) three weeks ago. It still has not arrived, "
                            "and yesterday my card was charged a second time for the same order. I want the duplicate "
                            "charge refunded today, or I will dispute it with my bank. " * 4),))
QUESTIONS = (
    ("refund", NoulQuestion("Does the customer ask for a refund?")),
    ("team", ChoiceQuestion("Which team should handle this?", (
        Option("billing", "Payments, charges and refunds"), Option("shipping", "Delivery and tracking"),
        Option("tech", None)))),
    ("anger", ScoreQuestion("How frustrated is the customer?", ("Calm", "Annoyed", "Angry", "Furious"))),
    ("lang", ChoiceQuestion(None, tuple(Option(f"Language {i}", None) for i in range(40)))),
)


@pytest.fixture(scope="module")
def compiler(embedded):
    return PromptCompiler(embedded.tokenizer, max_labels=255)


def _independent(model, plan: Plan) -> list[list[float]]:
    """Reference: every branch prefilled on its own through the full model, nothing shared."""
    out = []
    with torch.inference_mode():
        for b in plan.branches:
            logits = model(torch.tensor([b.input_ids])).logits[0, -1].float()
            out.append(torch.log_softmax(logits, -1)[list(b.label_ids)].tolist())
    return out


def test_255_labels_are_single_tokens_in_context(compiler):
    assert len(compiler.labels) == 255
    assert compiler.labels.texts[:26] == tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert len(set(compiler.labels.ids)) == 255


@pytest.mark.parametrize("budget", [1 << 24, 4_000], ids=["one-batch", "chunked-and-split"])
def test_shared_prefix_equals_independent_prefills(embedded, compiler, budget):
    engine: TransformersEngine = embedded.engine
    plan = compiler.compile(DecisionRequest(STATE, QUESTIONS)).plan
    assert plan.shared_prefix_len > 200  # the state is shared
    reference = _independent(engine._model, plan)
    engine._budget, saved = budget, engine._budget
    try:
        result = asyncio.run(engine.run(plan))
    finally:
        engine._budget = saved
    for ref, got in zip(reference, result.branches):
        assert max(abs(a - b) for a, b in zip(ref, got.logprobs)) < 1e-4
    # the shared prefix is computed once, each branch's own tokens once
    root = plan.shared_prefix_len
    assert result.computed_tokens == root + sum(len(b.input_ids) - root for b in plan.branches)
    assert plan.prompt_tokens - plan.unique_tokens >= 3 * root  # naive prefills read the state 4 times


def test_single_question_branch_ending_at_the_root(embedded, compiler):
    plan = compiler.compile(DecisionRequest(STATE, QUESTIONS[:1])).plan
    assert plan.root.ends == (0,)  # one branch: all of it is "shared prefix"
    result = asyncio.run(embedded.engine.run(plan))
    ref = _independent(embedded.engine._model, plan)[0]
    assert max(abs(a - b) for a, b in zip(ref, result.branches[0].logprobs)) < 1e-4


def test_answers_are_well_formed_distributions(embedded, compiler):
    service = DecisionService(compiler, embedded.engine, ServiceLimits(32_768, 262_144, 4, 120, 1))
    result = asyncio.run(service.decide(DecisionRequest(STATE, QUESTIONS)))
    refund, team, anger, lang = (a for _, a in result.answers)
    assert 0 <= refund.p_true <= 1
    for answer in (team, lang):
        probs = [p for _, p in answer.probabilities]
        assert math.isclose(sum(probs), 1.0, abs_tol=1e-9) and all(0 <= p <= 1 for p in probs)
        assert 0 <= answer.confidence <= 1
    assert 0 <= anger.score <= 3 and math.isclose(sum(anger.probabilities), 1.0, abs_tol=1e-9)
    # the model does put its mass on the labels (it understood the format)
    assert min(a.label_mass for _, a in result.answers) > 0.3


def test_cancelled_run_stops_between_forwards(embedded, compiler):
    engine = embedded.engine
    plan = compiler.compile(DecisionRequest(STATE, QUESTIONS)).plan
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(_Cancelled):
        engine._run_sync(plan, cancel)
