import asyncio
import math

import pytest

from openjev.errors import EngineUnavailable
from tests.api.conftest import running_app
from tests.support.fakes import FakeEngine

TICKET = "I was charged twice for order #1234. Please refund me today!"
VALID = {
    "model": "jev-latest",
    "state": TICKET,
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "team": {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "Payments and refunds", "technical": None},
        },
        "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Annoyed", "Furious"]},
    },
}


async def test_valid_request_answers_every_question_in_order(api):
    client, engine = api
    r = await client.post("/v1/systemone", json=VALID)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "fake-model-1"
    assert list(body["answers"]) == ["refund", "team", "anger"]
    refund, team, anger = body["answers"].values()
    assert refund["type"] == "noul" and 0 <= refund["noul"] <= 1 and "confidence" not in refund
    assert set(team["probabilities"]) == {"billing", "technical"}
    assert math.isclose(sum(team["probabilities"].values()), 1.0)
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert anger["legend"] == {"0": "Calm", "1": "Annoyed", "2": "Furious"}
    assert anger["score"] == pytest.approx(sum(int(k) * p for k, p in anger["probabilities"].items()))
    assert all(
        k in ("type", "noul", "choice", "score", "probabilities", "confidence", "legend") or k.startswith("x_")
        for a in body["answers"].values()
        for k in a
    )
    usage = body["usage"]
    assert set(usage) == {"input_tokens", "output_tokens", "x_prompt_tokens", "x_computed_tokens", "x_cached_tokens"}
    plan = engine.plans[0]
    assert (usage["input_tokens"], usage["x_prompt_tokens"]) == (plan.unique_tokens, plan.prompt_tokens)
    assert usage["x_computed_tokens"] == plan.unique_tokens and usage["x_cached_tokens"] == 0
    assert isinstance(body["usage"]["input_tokens"], int) and body["usage"]["output_tokens"] == 0
    assert r.headers["x-typesafe-request-id"].startswith("req_")
    assert int(r.headers["x-openjev-prefix-tokens"]) == engine.plans[0].shared_prefix_len > 0
    assert r.headers["x-openjev-cached-tokens"] == "0"
    timing = r.headers["server-timing"]
    assert "prepare;dur=" in timing and "prefill;dur=" in timing and "branches;dur=" in timing


@pytest.mark.parametrize("model", ["jev-latest", "jev-1.13.0", "fake-model-1"])
async def test_model_aliases_answer_with_the_concrete_name(api, model):
    client, _ = api
    r = await client.post("/v1/systemone", json={**VALID, "model": model})
    assert r.status_code == 200 and r.json()["model"] == "fake-model-1"


async def test_unknown_model_is_404_not_found_and_never_reaches_the_engine(api):
    client, engine = api
    r = await client.post("/v1/systemone", json={**VALID, "model": "gpt-5"})
    assert r.status_code == 404
    assert r.json()["detail"]["error_type"] == "not_found"
    assert engine.plans == []


async def test_unicode_ids_and_option_names_round_trip_and_ids_stay_hidden(api):
    client, _engine = api
    questions = {
        "질문 1 🙂": {"type": "choice", "criteria": {"Fakturierung ✓": None, "技术": "Technik", "x.y-z": None}},
        "q.with spaces-and.dots": {"type": "noul", "instructions": {"ask": "refund?", "lang": ["en", "de"]}},
    }
    r = await client.post("/v1/systemone", json={**VALID, "questions": questions})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert list(answers) == list(questions)
    assert set(answers["질문 1 🙂"]["probabilities"]) == {"Fakturierung ✓", "技术", "x.y-z"}


@pytest.mark.parametrize(
    "state",
    [
        "plain text",
        {"ticket": 1, "text": "charged twice"},
        ["a", 1, None],
        [{"role": "user", "content": "charged twice"}, {"role": "assistant", "content": "sorry"}],
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]},
    ],
)
async def test_every_state_shape_is_accepted(api, state):
    client, _ = api
    r = await client.post("/v1/systemone", json={**VALID, "state": state})
    assert r.status_code == 200, r.text


async def test_legacy_document_field_and_unknown_fields(api):
    client, _ = api
    payload = {k: v for k, v in VALID.items() if k != "state"} | {"document": TICKET, "x_trace": {"a": 1}}
    r = await client.post("/v1/systemone", json=payload)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "criteria",
    [
        None,
        {"true": "asks for money back"},
        {"false": "is satisfied"},
        {"true": None, "false": "happy"},
        {"true": ["structured", {"a": 1}], "false": {"k": "v"}},
    ],
)
async def test_noul_criteria_forms(api, criteria):
    client, _ = api
    q = {"type": "noul", "instructions": "Refund?"}
    if criteria is not None:
        q["criteria"] = criteria
    r = await client.post("/v1/systemone", json={**VALID, "questions": {"q": q}})
    assert r.status_code == 200, r.text


async def test_noul_without_instructions_but_with_criteria(api):
    client, _ = api
    q = {"type": "noul", "criteria": {"true": "The customer wants money back"}}
    assert (await client.post("/v1/systemone", json={**VALID, "questions": {"q": q}})).status_code == 200


@pytest.mark.parametrize("n", [2, 255])
async def test_choice_option_bounds_accepted(api, n):
    client, engine = api
    q = {"type": "choice", "criteria": {f"Queue {i:03d}": None for i in range(n)}}
    r = await client.post("/v1/systemone", json={**VALID, "questions": {"q": q}})
    assert r.status_code == 200, r.text
    assert len(r.json()["answers"]["q"]["probabilities"]) == n
    assert len(engine.plans[-1].branches[0].label_ids) == n


@pytest.mark.parametrize("n", [2, 10])
async def test_score_level_bounds_accepted(api, n):
    client, _ = api
    q = {"type": "score", "criteria": [f"Level {i}" for i in range(n)]}
    r = await client.post("/v1/systemone", json={**VALID, "questions": {"q": q}})
    assert r.status_code == 200 and len(r.json()["answers"]["q"]["legend"]) == n


def _with(question):
    return {**VALID, "questions": {"q": question}}


INVALID = {
    "missing-state": {k: v for k, v in VALID.items() if k != "state"},
    "null-state": {**VALID, "state": None},
    "number-state": {**VALID, "state": 42},
    "missing-questions": {k: v for k, v in VALID.items() if k != "questions"},
    "empty-questions": {**VALID, "questions": {}},
    "empty-question-id": {**VALID, "questions": {"": {"type": "noul", "instructions": "x"}}},
    "missing-type": _with({"instructions": "Refund?"}),
    "unknown-type": _with({"type": "boolean", "instructions": "Refund?"}),
    "noul-says-nothing": _with({"type": "noul"}),
    "noul-null-sides": _with({"type": "noul", "criteria": {"true": None, "false": None}}),
    "noul-unknown-side": _with({"type": "noul", "instructions": "x", "criteria": {"yes": "a"}}),
    "choice-no-options": _with({"type": "choice", "criteria": {}}),
    "choice-1": _with({"type": "choice", "criteria": {"a": None}}),
    "choice-256": _with({"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}),
    "choice-empty-name": _with({"type": "choice", "criteria": {"": None, "b": None}}),
    "choice-list": _with({"type": "choice", "criteria": ["a", "b"]}),
    "score-map": _with({"type": "score", "criteria": {"0": "Calm", "1": "Angry"}}),
    "score-1": _with({"type": "score", "criteria": ["Calm"]}),
    "score-11": _with({"type": "score", "criteria": [f"L{i}" for i in range(11)]}),
    "score-null-level": _with({"type": "score", "criteria": ["Calm", None]}),
    "number-instructions": _with({"type": "noul", "instructions": 5}),
    "questions-list": {**VALID, "questions": [{"type": "noul", "instructions": "x"}]},
    "body-array": [VALID],
}


@pytest.mark.parametrize("case", sorted(INVALID))
async def test_invalid_requests_get_422_detail_list_and_never_reach_the_engine(api, case):
    client, engine = api
    r = await client.post("/v1/systemone", json=INVALID[case])
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, list) and detail and {"loc", "msg", "type"} <= set(detail[0])
    assert engine.plans == []


async def test_malformed_json_is_422(api):
    client, engine = api
    r = await client.post(
        "/v1/systemone",
        content=b'{"model": "jev-latest", "state": "x", "questions": {',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and isinstance(r.json()["detail"], list)
    assert engine.plans == []


async def test_too_many_questions_is_422():
    async with running_app(max_questions=2) as (client, engine):
        q = {"type": "noul", "instructions": "x"}
        r = await client.post("/v1/systemone", json={**VALID, "questions": {"a": q, "b": q, "c": q}})
        assert r.status_code == 422 and "at most 2 questions" in r.json()["detail"][0]["msg"]
        assert engine.plans == []


async def test_assets_are_refused_clearly(api):
    client, engine = api
    r = await client.post("/v1/systemone", json={**VALID, "assets": {"img": {"url": "data:..."}}})
    assert r.status_code == 422 and r.json()["detail"]["error_type"] == "unsupported"
    assert engine.plans == []


async def test_token_budget_is_422_tokens_exceeded_before_engine_work():
    async with running_app(max_branch_tokens=30) as (client, engine):
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 422
        assert r.json()["detail"]["error_type"] == "tokens_exceeded"
        assert engine.plans == []
    async with running_app(max_request_tokens=60) as (client, engine):
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 422 and "per request" in r.json()["detail"]["message"]
        assert engine.plans == []


async def test_overload_is_529_with_retry_after_and_recovers():
    async with running_app(FakeEngine(delay_s=0.5), max_in_flight=1, retry_after_s=2) as (client, engine):
        first = asyncio.create_task(client.post("/v1/systemone", json=VALID))
        while not engine.plans:
            await asyncio.sleep(0.01)
        second = await client.post("/v1/systemone", json=VALID)
        assert second.status_code == 529
        assert second.headers["retry-after"] == "2"
        assert second.json()["detail"]["error_type"] == "rate_limit_error"
        assert (await first).status_code == 200
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200


async def test_engine_deadline_is_504_timeout():
    async with running_app(FakeEngine(delay_s=5), engine_timeout_s=0.05) as (client, engine):
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 504 and r.json()["detail"]["error_type"] == "timeout"
        assert engine.cancelled == 1


async def test_engine_outage_is_503():
    async with running_app(FakeEngine(fail=EngineUnavailable("engine down"))) as (client, _):
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 503 and r.json()["detail"]["message"] == "engine down"
