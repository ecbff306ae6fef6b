"""The real embedded model (SmolLM2-135M-Instruct) through the in-process engine."""

import asyncio
import math

import pytest
import torch

from openjev.core.plan import Plan
from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService
from openjev.core.types import ChoiceQuestion, DecisionRequest, Option, State, Turn
from openjev.engines.torch.engine import TransformersEngine
from tests.support.limits import limits_of
from tests.support.tickets import QUESTIONS as TICKET_QUESTIONS
from tests.support.tickets import TEXT

STATE = State((Turn("user", TEXT.format(n=4471) * 4),))
QUESTIONS = (
    *TICKET_QUESTIONS,
    ("lang", ChoiceQuestion(None, tuple(Option(f"Language {i}", None) for i in range(40)))),
    ("team2", ChoiceQuestion("Which team should handle this first?", (Option("a", None), Option("b", None)))),
)


@pytest.fixture(scope="module")
def compiler(embedded):
    return PromptCompiler(embedded.tokenizer, max_labels=255)


def _engine(embedded, **kw) -> TransformersEngine:
    kw.setdefault("prefix_cache_bytes", 0)
    return TransformersEngine(embedded.engine.model, **kw)


def _independent(model, plan: Plan) -> list[list[float]]:
    """Reference: every branch prefilled on its own through the full model, nothing shared."""
    out = []
    with torch.inference_mode():
        for b in plan.branches:
            logits = model(torch.tensor([b.input_ids])).logits[0, -1].float()
            out.append(torch.log_softmax(logits, -1)[list(b.label_ids)].tolist())
    return out


def _max_diff(reference, result) -> float:
    return max(
        abs(a - b)
        for ref, got in zip(reference, result.branches, strict=True)
        for a, b in zip(ref, got.logprobs, strict=True)
    )


def _run(engine, *plans):
    async def go():
        try:
            return await asyncio.gather(*(engine.run(p) for p in plans))
        finally:
            await engine.close()

    return asyncio.run(go())


def test_255_labels_are_single_tokens_in_context(compiler):
    assert len(compiler.labels) == 255
    assert compiler.labels.texts[:26] == tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert len(set(compiler.labels.ids)) == 255


@pytest.mark.parametrize(
    "kw", [{}, {"attention_budget": 4_000, "batch_tokens": 64}], ids=["default", "sliced-and-chunked"]
)
def test_trie_execution_equals_independent_prefills_at_the_floor(embedded, compiler, kw):
    plan = compiler.compile(DecisionRequest(STATE, QUESTIONS)).plan
    assert plan.shared_prefix_len > 200  # the state is shared
    assert any(node.children for child in plan.root.children for node in [child])  # a deeper shared run
    [result] = _run(_engine(embedded, **kw), plan)
    assert _max_diff(_independent(embedded.engine.model, plan), result) < 1e-4
    assert result.computed_tokens == plan.unique_tokens  # every distinct token once
    assert result.cached_tokens == 0
    assert plan.prompt_tokens - plan.unique_tokens >= 4 * plan.shared_prefix_len  # what naive prefills pay


def test_single_question_branch_ending_at_the_root(embedded, compiler):
    plan = compiler.compile(DecisionRequest(STATE, QUESTIONS[:1])).plan
    assert plan.root.ends == (0,)  # one branch: all of it is "shared prefix"
    [result] = _run(_engine(embedded), plan)
    assert _max_diff(_independent(embedded.engine.model, plan), result) < 1e-4


def test_prefix_cache_serves_a_seen_state_across_requests(embedded, compiler):
    engine = _engine(embedded, prefix_cache_bytes=1 << 28)
    first = compiler.compile(DecisionRequest(STATE, QUESTIONS[:2])).plan
    second = compiler.compile(DecisionRequest(STATE, QUESTIONS[2:])).plan  # same state, new questions

    async def go():
        try:
            a = await engine.run(first)
            b = await engine.run(second)
            return a, b
        finally:
            await engine.close()

    a, b = asyncio.run(go())
    assert a.cached_tokens == 0
    assert b.cached_tokens >= first.shared_prefix_len > 200  # the state (and then some) came from cache
    assert b.computed_tokens == second.unique_tokens - b.cached_tokens
    assert _max_diff(_independent(embedded.engine.model, second), b) < 1e-4


def test_concurrent_requests_share_forwards_and_stay_exact(embedded, compiler):
    plans = [
        compiler.compile(DecisionRequest(State((Turn("user", TEXT.format(n=n) * 2),)), QUESTIONS[:3])).plan
        for n in range(4)
    ]
    alone = _engine(embedded)
    _run(alone, plans[0])
    together = _engine(embedded, batch_window_s=0.05)
    results = _run(together, *plans)
    for plan, result in zip(plans, results, strict=True):
        assert _max_diff(_independent(embedded.engine.model, plan), result) < 1e-4
        assert result.computed_tokens == plan.unique_tokens
    # four requests in far fewer forwards than four times one request's
    assert together.scheduler.forwards < 4 * alone.scheduler.forwards


def test_a_large_request_does_not_starve_a_small_one(embedded, compiler):
    engine = _engine(embedded, batch_tokens=128)
    big = compiler.compile(DecisionRequest(State((Turn("user", TEXT.format(n=1) * 12),)), QUESTIONS)).plan
    small = compiler.compile(DecisionRequest(State((Turn("user", "Where is my parcel?"),)), QUESTIONS[:1])).plan
    assert big.unique_tokens > 6 * 128
    finished = []

    async def go():
        async def tagged(name, plan, delay):
            await asyncio.sleep(delay)
            await engine.run(plan)
            finished.append(name)

        try:
            await asyncio.gather(tagged("big", big, 0), tagged("small", small, 0.3))
        finally:
            await engine.close()

    asyncio.run(go())
    assert finished == ["small", "big"]


def test_cancelled_request_stops_its_work(embedded, compiler):
    engine = _engine(embedded, batch_tokens=128)
    big = compiler.compile(DecisionRequest(State((Turn("user", TEXT.format(n=2) * 12),)), QUESTIONS)).plan

    async def go():
        task = asyncio.create_task(engine.run(big))
        for _ in range(600):  # under way: its first forward is done
            if engine.scheduler.forwards:
                break
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        at_cancel = engine.scheduler.forwards
        # Several 128-token rounds' time (each well under a second here). Waiting a fixed
        # time after the cancel and then expecting no further forward raced the forward in
        # flight at the cancel, which may finish late on a loaded machine.
        await asyncio.sleep(3.0)
        return at_cancel

    at_cancel = asyncio.run(go())
    assert engine.scheduler.forwards <= at_cancel + 1  # at most the forward in flight at the cancel
    assert big.unique_tokens / 128 > at_cancel + 3  # and several forwards were left to compute
    asyncio.run(engine.close())


def test_answers_are_well_formed_distributions(embedded, compiler):
    service = DecisionService(compiler, embedded.engine, limits_of(max_in_flight=4))
    result = asyncio.run(service.decide(DecisionRequest(STATE, QUESTIONS)))
    refund, team, anger, lang, _ = (a for _, a in result.answers)
    assert 0 <= refund.p_true <= 1
    for answer in (team, lang):
        probs = [p for _, p in answer.probabilities]
        assert math.isclose(sum(probs), 1.0, abs_tol=1e-9) and all(0 <= p <= 1 for p in probs)
        assert 0 <= answer.confidence <= 1
    assert 0 <= anger.score <= 3 and math.isclose(sum(anger.probabilities), 1.0, abs_tol=1e-9)
    # the model does put its mass on the labels (it understood the format)
    assert min(a.label_mass for _, a in result.answers) > 0.3


def test_canonical_readout_answers_the_same_for_any_option_order_on_the_real_model(embedded, compiler):
    """The default readout: the same request with its options reversed is the same plan, so
    the real model gives each option the same probability (order flips are 0, not rare)."""
    from openjev.core.readouts import LettersReadout

    readout = LettersReadout(compiler.labels.texts, compiler.labels.ids, canonical=True)
    team = dict(TICKET_QUESTIONS)["team"]
    assert isinstance(team, ChoiceQuestion)
    shuffled = ChoiceQuestion(team.instructions, team.options[::-1])
    plans = [compiler.compile(DecisionRequest(STATE, (("team", q),)), readout).plan for q in (team, shuffled)]
    assert plans[0] == plans[1] and not plans[0].branches[0].parallel  # one plain reading, the same tokens
    [result] = _run(_engine(embedded), plans[0])
    lp = [list(result.branches[0].logprobs)]
    by_name = [
        dict(zip((o.name for o in q.options), readout.combine(q, lp).probs, strict=True)) for q in (team, shuffled)
    ]
    assert by_name[0] == by_name[1]
    plain = LettersReadout(compiler.labels.texts, compiler.labels.ids)  # letters in the caller's order differ
    assert plain.readings(team) != plain.readings(shuffled)


def test_parallel_readout_is_order_free_and_exact_on_the_real_model(embedded, compiler):
    from openjev.core.plan import Branch
    from openjev.core.readouts import ParallelReadout

    readout = ParallelReadout(compiler.labels.texts, compiler.labels.ids)
    team = dict(TICKET_QUESTIONS)["team"]
    assert isinstance(team, ChoiceQuestion)
    shuffled = ChoiceQuestion(team.instructions, team.options[::-1])
    plans = [compiler.compile(DecisionRequest(STATE, (("team", q),)), readout).plan for q in (team, shuffled)]
    assert plans[0] == plans[1]  # the caller's order does not reach the model
    [layout] = plans[0].branches
    assert len(layout.parallel) == len(team.options)
    linear = Branch(layout.input_ids, layout.label_ids)  # the same tokens, read one after another
    one_span = Branch(layout.input_ids, layout.label_ids, parallel=((layout.parallel[0][0], layout.parallel[-1][1]),))
    probe = Plan.from_branches([layout, linear, one_span])
    [whole] = _run(_engine(embedded), probe)
    [sliced] = _run(_engine(embedded, batch_tokens=16, attention_budget=4_000), probe)
    assert _max_diff([list(b.logprobs) for b in whole.branches], sliced) < 1e-4  # slices see earlier ones exactly
    reference = _independent(embedded.engine.model, Plan.from_branches([linear]))[0]
    # one span covering every option line is a linear reading: equal to an independent prefill
    assert max(abs(a - b) for a, b in zip(reference, whole.branches[2].logprobs, strict=True)) < 1e-4
    # side by side is not one after another: the layout is honoured
    assert max(abs(a - b) for a, b in zip(reference, whole.branches[0].logprobs, strict=True)) > 1e-3
    assert whole.computed_tokens == probe.unique_tokens
