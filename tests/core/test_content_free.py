"""Content-free calibration through the service (core/content_free.py): the twin request is
read beside the first request that needs it, divided out of the answer before the fit's
temperature, cached per namespace, readout and question, and never read for a question a
task calibrates or a type whose fit does not ask for it."""

from __future__ import annotations

import math

import pytest

from openjev.core import calibration as calib
from openjev.core.content_free import STATE as FREE_STATE
from openjev.core.content_free import ContentFreeCache, divide, request_of
from openjev.core.prompts import PromptCompiler
from openjev.core.readouts import ReadoutSpec
from openjev.core.service import DecisionService
from openjev.core.service_limits import ServiceLimits
from openjev.core.task_apply import TaskCalibration
from openjev.core.types import DecisionRequest
from openjev.errors import ConfigError
from tests.core.test_prompts import QUESTIONS, STATE
from tests.core.test_service import LIMITS, _calibration
from tests.support.fakes import FakeEngine, FakeTokenizer

SPEC = ReadoutSpec("letters")
FIT = calib.TypeFit(2.0, content_free=True)


def _service(engine: FakeEngine, **fits: calib.TypeFit) -> DecisionService:
    compiler = PromptCompiler(FakeTokenizer(), max_labels=255)
    cal = _calibration(SPEC, **(fits or {"choice": FIT}))
    return DecisionService(compiler, engine, ServiceLimits(**LIMITS.__dict__), calibration=cal)


def _probs(answer) -> list[float]:
    return [p for _, p in answer.probabilities]


async def test_the_twin_is_read_once_divided_out_before_the_temperature_and_then_cached():
    engine = FakeEngine()
    service = _service(engine)
    request = DecisionRequest(STATE, QUESTIONS)
    first = await service.decide(request)
    assert len(engine.plans) == 2  # the request, and its twin (the choice question on "N/A")
    twin_plan = engine.plans[1]
    assert len(twin_plan.branches) == 1  # one question, one ordering
    raw = await service.decide(request, calibrate=False)
    free = await service.decide(request_of(request, [QUESTIONS[1]]), calibrate=False)
    expected = calib.apply(calib.TypeFit(2.0), divide(_probs(dict(raw.answers)["team"]), _probs(free.answers[0][1])))
    assert _probs(dict(first.answers)["team"]) == pytest.approx(list(expected))
    assert dict(first.answers)["refund"].p_true == dict(raw.answers)["refund"].p_true  # no fit for noul
    assert first.usage.input_tokens == engine.plans[0].unique_tokens + twin_plan.unique_tokens

    plans = len(engine.plans)
    again = await service.decide(request)
    assert len(engine.plans) == plans + 1  # cached: the request alone
    assert again.answers == first.answers
    assert again.usage.input_tokens == engine.plans[-1].unique_tokens


async def test_a_namespace_never_reads_anothers_cached_twin():
    engine = FakeEngine()
    service = _service(engine)
    await service.decide(DecisionRequest(STATE, QUESTIONS, cache_namespace="key-a"))
    await service.decide(DecisionRequest(STATE, QUESTIONS, cache_namespace="key-b"))
    assert len(engine.plans) == 4
    assert len(service.content_free.cache) == 2


async def test_no_twin_for_a_question_its_task_calibrates_nor_without_calibration():
    engine = FakeEngine()
    service = _service(engine)
    task = TaskCalibration("task-1", SPEC, calib.TypeFit(1.0), service.abstain)
    await service.decide(DecisionRequest(STATE, QUESTIONS), tasks={"team": task})
    await service.decide(DecisionRequest(STATE, QUESTIONS), calibrate=False)
    assert len(engine.plans) == 2  # neither read a twin


async def test_the_content_free_state_says_nothing_and_keeps_the_caller():
    request = DecisionRequest(STATE, QUESTIONS, cache_namespace="key-a")
    twin = request_of(request, [QUESTIONS[0]])
    assert twin.state == FREE_STATE and [t.content for t in twin.state.turns] == ["N/A"]
    assert twin.questions == (QUESTIONS[0],) and twin.cache_namespace == "key-a" and twin.share == request.share


def test_divide_renormalises_and_an_lru_cache_keeps_the_recent():
    assert divide([0.6, 0.4], [0.75, 0.25]) == pytest.approx([1 / 3, 2 / 3])
    with pytest.raises(ValueError, match="content-free answer has 1 options"):
        divide([0.5, 0.5], [1.0])
    cache = ContentFreeCache(size=2)
    for k in "abc":
        cache.put(k, (1.0,))
    assert cache.get("a") is None and cache.get("c") == (1.0,) and len(cache) == 2
    assert math.isclose(cache.hits, 1) and cache.misses == 1


def test_a_calibration_file_turns_it_on_per_type_and_refuses_a_non_boolean():
    doc = {
        "format": calib.FORMAT,
        "id": "c",
        "model": {"name": "m", "fingerprint": "f"},
        "prompt_version": "2",
        "fits": [{"readout": "letters", "types": {"choice": {"temperature": 0.8, "content_free": True}}}],
    }
    assert calib.from_dict(doc).fit_for(SPEC, "choice") == calib.TypeFit(0.8, content_free=True)
    doc["fits"][0]["types"]["choice"]["content_free"] = "yes"
    with pytest.raises(ConfigError, match="content_free must be true or false"):
        calib.from_dict(doc)


async def test_a_failing_read_fails_the_request_with_its_own_error():
    from openjev.errors import Overloaded

    engine = FakeEngine(fail=Overloaded("full", retry_after_s=1))
    service = _service(engine)
    with pytest.raises(Overloaded, match="full"):
        await service.decide(DecisionRequest(STATE, QUESTIONS))
    assert len(engine.plans) == 2  # both were tried; nothing cached
    assert len(service.content_free.cache) == 0
