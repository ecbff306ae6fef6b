import asyncio
import math

import pytest

from openjev.core import calibration as calib
from openjev.core.abstain import AbstainRule
from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService
from openjev.core.service_limits import ServiceLimits
from openjev.core.types import ChoiceAnswer, DecisionRequest, NoulAnswer, ScoreAnswer
from openjev.errors import EngineError, EngineTimeout, Overloaded, TokensExceeded
from tests.core.test_prompts import QUESTIONS, STATE
from tests.support.fakes import FakeEngine, FakeTokenizer, fake_logprobs

LIMITS = ServiceLimits(
    max_branch_tokens=10_000,
    max_request_tokens=100_000,
    max_in_flight=2,
    engine_timeout_s=5,
    retry_after_s=3,
    temperature=1.0,
    rotation_max_options=26,
    max_branches=4096,
    max_prompt_tokens=4_194_304,
    context_tokens=None,
)


def _service(engine=None, **overrides):
    limits = ServiceLimits(**{**LIMITS.__dict__, **overrides})
    return DecisionService(PromptCompiler(FakeTokenizer(), max_labels=255), engine or FakeEngine(), limits)


async def test_answers_keep_order_ids_and_types():
    engine = FakeEngine()
    result = await _service(engine).decide(DecisionRequest(STATE, QUESTIONS))
    assert [qid for qid, _ in result.answers] == ["refund", "team", "anger"]
    refund, team, anger = (a for _, a in result.answers)
    assert isinstance(refund, NoulAnswer) and isinstance(team, ChoiceAnswer) and isinstance(anger, ScoreAnswer)
    # the scores follow from the engine's log-probs
    plan = engine.plans[0]
    lp = fake_logprobs(plan.branches[0].input_ids, 2)
    assert refund.p_true == pytest.approx(math.exp(lp[0]) / (math.exp(lp[0]) + math.exp(lp[1])))
    assert [name for name, _ in team.probabilities] == ["billing", "tech"]
    assert math.fsum(p for _, p in team.probabilities) == pytest.approx(1.0)
    assert anger.legend == ("Calm", "Annoyed", "Furious")
    assert result.usage.input_tokens == plan.unique_tokens < plan.prompt_tokens
    assert result.prefix_tokens == plan.shared_prefix_len > 0
    assert {"prepare", "prefill", "branches", "engine"} <= set(result.timings_ms)


async def test_over_budget_never_reaches_the_engine():
    engine = FakeEngine()
    with pytest.raises(TokensExceeded, match="per branch"):
        await _service(engine, max_branch_tokens=20).decide(DecisionRequest(STATE, QUESTIONS))
    with pytest.raises(TokensExceeded, match="per request"):
        await _service(engine, max_request_tokens=50).decide(DecisionRequest(STATE, QUESTIONS))
    assert engine.plans == []


async def test_in_flight_cap_gives_overloaded_with_retry_after():
    engine = FakeEngine(delay_s=0.3)
    service = _service(engine)
    request = DecisionRequest(STATE, QUESTIONS[:1])
    results = await asyncio.gather(*(service.decide(request) for _ in range(3)), return_exceptions=True)
    overloaded = [r for r in results if isinstance(r, Overloaded)]
    assert len(overloaded) == 1 and overloaded[0].headers["Retry-After"] == "3"
    assert service.in_flight == 0


async def test_deadline_cancels_engine_work():
    engine = FakeEngine(delay_s=5)
    with pytest.raises(EngineTimeout):
        await _service(engine, engine_timeout_s=0.05).decide(DecisionRequest(STATE, QUESTIONS[:1]))
    assert engine.cancelled == 1


async def test_unusable_logprobs_are_an_engine_error():
    class AllZero(FakeEngine):
        async def run(self, plan):
            result = await super().run(plan)
            from openjev.core.ports import BranchResult

            return type(result)(tuple(BranchResult((-math.inf,) * len(b.logprobs)) for b in result.branches), 0, 0)

    with pytest.raises(EngineError):
        await _service(AllZero()).decide(DecisionRequest(STATE, QUESTIONS[:1]))


# ---- readouts and calibration through the service


def _calibration(spec, **types):
    from openjev.core import calibration as calib

    return calib.Calibration(
        id="cal-x",
        model_name="m",
        fingerprint="f",
        prompt_version="2",
        base_temperature=1.0,
        fits=(calib.ReadoutFit(spec, types),),
    )


async def test_yesno_reads_one_branch_per_candidate_sharing_the_question():
    from openjev.core.readouts import ReadoutSpec

    engine = FakeEngine()
    result = await _service(engine).decide(DecisionRequest(STATE, QUESTIONS), readout=ReadoutSpec("yesno"))
    plan = engine.plans[0]
    assert len(plan.branches) == 1 + 2 + 3  # noul, two options, three levels
    assert result.readout == "yesno" and result.calibration is None
    team = dict(result.answers)["team"]
    assert math.fsum(p for _, p in team.probabilities) == pytest.approx(1.0)
    # the two options of "team" share the state and the question: a trie node above both
    b1, b2 = plan.branches[1].input_ids, plan.branches[2].input_ids
    common = next(i for i, (x, y) in enumerate(zip(b1, b2, strict=True)) if x != y)
    assert common > plan.shared_prefix_len


async def test_rotations_add_branches_and_order_agreement():
    from openjev.core.readouts import ReadoutSpec

    engine = FakeEngine()
    result = await _service(engine).decide(DecisionRequest(STATE, QUESTIONS), readout=ReadoutSpec("letters", 4))
    assert len(engine.plans[0].branches) == 2 + 2 + 2  # noul and 2 options: 2 rotations; a scale: 2 orders
    assert result.readout == "letters;rotations=2"  # asked 4; no question had more than 2 orders
    assert all(a.order_agreement in (0.5, 1.0) for _, a in result.answers)


async def test_calibration_applies_to_its_readout_only_and_can_be_switched_off():
    from openjev.core import calibration as calib
    from openjev.core.readouts import ReadoutSpec

    limits = ServiceLimits(**LIMITS.__dict__)
    compiler = PromptCompiler(FakeTokenizer(), max_labels=255)
    cal = _calibration(ReadoutSpec("letters"), choice=calib.TypeFit(3.0), noul=calib.TypeFit(1.0, (0.0, 2.0)))
    service = DecisionService(compiler, FakeEngine(), limits, calibration=cal)
    request = DecisionRequest(STATE, QUESTIONS)
    raw = await service.decide(request, calibrate=False)
    fitted = await service.decide(request)
    other = await service.decide(request, readout=ReadoutSpec("yesno"))
    assert raw.calibration is None and fitted.calibration == "cal-x" and other.calibration is None
    raw_a, fit_a = dict(raw.answers), dict(fitted.answers)
    raw_team = [p for _, p in raw_a["team"].probabilities]
    assert [p for _, p in fit_a["team"].probabilities] == pytest.approx(list(calib.apply(calib.TypeFit(3.0), raw_team)))
    assert fit_a["refund"].p_true < raw_a["refund"].p_true  # the prior moved mass to "false"
    assert fit_a["anger"].probabilities == raw_a["anger"].probabilities  # no fit for score


async def test_an_unavailable_readout_is_refused_before_any_engine_work():
    from openjev.core.readouts import ReadoutSpec
    from openjev.errors import Unsupported

    engine = FakeEngine()
    compiler = PromptCompiler(FakeTokenizer(), max_labels=255)
    compiler.yes_no = None  # Yes/No not single tokens for this model
    service = DecisionService(compiler, engine, ServiceLimits(**LIMITS.__dict__))
    with pytest.raises(Unsupported, match="yesno"):
        await service.decide(DecisionRequest(STATE, QUESTIONS), readout=ReadoutSpec("yesno"))
    assert engine.plans == []


async def test_parallel_runs_where_the_engine_runs_layouts_and_falls_back_elsewhere():
    from openjev.core.readouts import ReadoutSpec

    spec = ReadoutSpec("parallel")
    limits = ServiceLimits(**LIMITS.__dict__)
    compiler = PromptCompiler(FakeTokenizer(), max_labels=255)
    engine = FakeEngine()
    able = DecisionService(compiler, engine, limits, readout=spec, parallel_layouts=True)
    result = await able.decide(DecisionRequest(STATE, QUESTIONS))
    assert result.readout == "parallel" and able.default_readout == spec
    plan = engine.plans[0]
    assert len(plan.branches) == 3 and [bool(b.parallel) for b in plan.branches] == [False, True, False]
    assert len(plan.branches[1].parallel) == 2  # one span per option

    remote = FakeEngine()
    unable = DecisionService(compiler, remote, limits, readout=spec)
    result = await unable.decide(DecisionRequest(STATE, QUESTIONS))
    # parallel's sequential twin: choice options in the canonical order (this one has two: both
    # orders), the scale both ways, the noul once
    assert unable.default_readout.describe() == "canonical" and result.readout == "canonical"
    assert not any(b.parallel for b in remote.plans[0].branches) and len(remote.plans[0].branches) == 5
    result = await unable.decide(DecisionRequest(STATE, QUESTIONS), readout=spec)  # a per-request ask too
    assert result.readout == "canonical"


async def test_abstain_rule_marks_exactly_the_answers_below_its_floors():
    engine = FakeEngine()
    request = DecisionRequest(STATE, QUESTIONS)
    plain = await _service(engine).decide(request)
    assert not any(a.abstain for _, a in plain.answers)  # no rule: nothing declined
    masses = sorted(a.label_mass for _, a in plain.answers)
    floor = (masses[0] + masses[1]) / 2  # between the weakest reading and the next
    limits = ServiceLimits(**LIMITS.__dict__)
    ruled = DecisionService(
        PromptCompiler(FakeTokenizer(), max_labels=255), engine, limits, abstain=AbstainRule(min_label_mass=floor)
    )
    result = await ruled.decide(request)
    declined = [qid for qid, a in result.answers if a.abstain]
    assert declined == [qid for qid, a in plain.answers if a.label_mass < floor] and len(declined) == 1
    # the declined answer keeps its probabilities (a face decides how to show it)
    assert [a.label_mass for _, a in result.answers] == [a.label_mass for _, a in plain.answers]


def test_abstain_rule_floors():
    rule = AbstainRule(min_label_mass=0.5, min_order_agreement=0.75)
    assert rule.refuses(0.4, None) and rule.refuses(0.9, 0.5)
    assert not rule.refuses(0.5, 0.75) and not rule.refuses(0.9, None)  # one ordering: nothing to disagree
    assert not AbstainRule().enabled and not AbstainRule().refuses(0.0, 0.0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        AbstainRule(min_label_mass=1.5)
    confident = AbstainRule(min_confidence=0.7)
    assert confident.enabled and confident.refuses(1.0, None, 0.69) and not confident.refuses(1.0, None, 0.7)
    assert not confident.refuses(1.0, 1.0)  # a caller that measures no confidence is never declined for it
    with pytest.raises(ValueError, match="between 0 and 1"):
        AbstainRule(min_confidence=-0.1)


async def test_the_confidence_floor_reads_the_calibrated_top_probability():
    """The floor sees each answer's top probability after calibration: a temperature that
    flattens every reading can push an answer below the floor that its raw reading cleared."""
    engine = FakeEngine()
    request = DecisionRequest(STATE, QUESTIONS)
    plain = await _service(engine).decide(request)
    tops = {qid: _top(a) for qid, a in plain.answers}
    floor = sorted(tops.values())[1]  # the weakest answer falls below it, the others do not
    limits = ServiceLimits(**LIMITS.__dict__)
    ruled = DecisionService(
        PromptCompiler(FakeTokenizer(), max_labels=255), engine, limits, abstain=AbstainRule(min_confidence=floor)
    )
    result = await ruled.decide(request)
    assert [qid for qid, a in result.answers if a.abstain] == [q for q, t in tops.items() if t < floor]
    flat = calib.Calibration(
        id="flat",
        model_name="fake",
        fingerprint="",
        prompt_version="",
        base_temperature=1.0,
        fits=(
            calib.ReadoutFit(ruled.default_readout, {t: calib.TypeFit(50.0, ()) for t in ("noul", "choice", "score")}),
        ),
    )
    flattened = DecisionService(
        PromptCompiler(FakeTokenizer(), max_labels=255),
        engine,
        limits,
        abstain=AbstainRule(min_confidence=floor),
        calibration=flat,
    )
    assert all(a.abstain for _, a in (await flattened.decide(request)).answers)  # near-uniform: all below


def _top(answer) -> float:
    if isinstance(answer, NoulAnswer):
        return max(answer.p_true, 1.0 - answer.p_true)
    if isinstance(answer, ChoiceAnswer):
        return max(p for _, p in answer.probabilities)
    return max(answer.probabilities)


async def test_a_position_prior_is_applied_by_the_letters_the_options_were_shown_at():
    """canonical reads a choice in the canonical order: the fit's prior divides each option by
    the prior of the letter it was shown at, not of its place in the request."""
    from openjev.core.readouts import ReadoutSpec, canonical_order

    limits = ServiceLimits(**LIMITS.__dict__)
    compiler = PromptCompiler(FakeTokenizer(), max_labels=255)
    from openjev.core.types import ChoiceQuestion, Option

    team = ChoiceQuestion("Which team?", (Option("s", "Shipping"), Option("b", "Billing"), Option("a", "Accounts")))
    n = len(team.options)
    prior = tuple(float(2 ** (n - j)) for j in range(n))
    prior = tuple(p / sum(prior) for p in prior)
    cal = _calibration(ReadoutSpec("canonical"), choice=calib.TypeFit(1.0, (), {n: prior}))
    service = DecisionService(compiler, FakeEngine(), limits, readout=ReadoutSpec("canonical"), calibration=cal)
    request = DecisionRequest(STATE, (("team", team),))
    raw = [p for _, p in dict((await service.decide(request, calibrate=False)).answers)["team"].probabilities]
    fitted = [p for _, p in dict((await service.decide(request)).answers)["team"].probabilities]
    shown = canonical_order(team)
    assert shown != tuple(range(n))  # the letters do not follow the request's order here
    assert fitted == pytest.approx(list(calib.apply(calib.TypeFit(1.0, (), {n: prior}), raw, shown)))
    assert fitted != pytest.approx(list(calib.apply(calib.TypeFit(1.0, (), {n: prior}), raw, tuple(range(n)))))


async def test_a_scale_read_both_ways_gets_its_prior_symmetrised():
    """canonical reads a scale and its reverse; the fit's score prior applies symmetrised
    (core.calibration.apply, mirrored: what keeps a reversed scale's answer mirrored, tested
    there), not as the prior of one ordering's letters."""
    from openjev.core.readouts import ReadoutSpec
    from openjev.core.types import ScoreQuestion

    limits = ServiceLimits(**LIMITS.__dict__)
    compiler = PromptCompiler(FakeTokenizer(), max_labels=255)
    prior = (0.1, 0.4, 0.3, 0.2)
    cal = _calibration(ReadoutSpec("canonical"), score=calib.TypeFit(1.0, (), {4: prior}))
    service = DecisionService(compiler, FakeEngine(), limits, readout=ReadoutSpec("canonical"), calibration=cal)
    asked = DecisionRequest(STATE, (("u", ScoreQuestion("How urgent?", ("none", "low", "high", "urgent"))),))
    raw = list(dict((await service.decide(asked, calibrate=False)).answers)["u"].probabilities)
    fitted = list(dict((await service.decide(asked)).answers)["u"].probabilities)
    fit = calib.TypeFit(1.0, (), {4: prior})
    assert fitted == pytest.approx(list(calib.apply(fit, raw, (0, 1, 2, 3), mirrored=True)))
    assert fitted != pytest.approx(list(calib.apply(fit, raw, (0, 1, 2, 3)))) and fitted != pytest.approx(raw)
