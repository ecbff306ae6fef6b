"""POST /v1/systemone/batch over the fake engine: both envelopes, per-item errors, ordering,
limits, and the shared-state staging."""

import json

import pytest

from tests.api.conftest import running_app
from tests.api.test_systemone import VALID
from tests.support.fakes import FakeEngine

QUESTIONS = VALID["questions"]


def _lines(r):
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


async def test_requests_form_streams_one_line_per_item_then_a_summary(api):
    client, _engine = api
    items = [VALID, {**VALID, "state": "Second ticket"}, {**VALID, "state": "Third ticket"}]
    r = await client.post("/v1/systemone/batch", json={"requests": items})
    assert r.status_code == 200, r.text
    lines = _lines(r)
    assert sorted(line["index"] for line in lines[:-1]) == [0, 1, 2]
    single = (await client.post("/v1/systemone", json=items[1])).json()
    by_index = {line["index"]: line for line in lines[:-1]}
    assert by_index[1]["answers"] == single["answers"]  # the same engine, the same answers
    assert by_index[1]["model"] == "fake-model-1"
    summary = lines[-1]["summary"]
    assert summary["items"] == 3 and summary["succeeded"] == 3 and summary["failed"] == 0
    assert summary["usage"]["input_tokens"] == sum(line["usage"]["input_tokens"] for line in lines[:-1])


async def test_states_form_asks_the_same_questions_about_each_state(api):
    client, _engine = api
    body = {"model": "jev-latest", "questions": QUESTIONS, "states": ["one", {"ticket": 2}, "three"]}
    r = await client.post("/v1/systemone/batch", json=body, headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    items = r.json()
    assert [item["index"] for item in items] == [0, 1, 2]  # item order
    for item, state in zip(items, body["states"], strict=True):
        single = (await client.post("/v1/systemone", json={**VALID, "state": state})).json()
        assert item["answers"] == single["answers"]


async def test_a_bad_item_fails_alone_with_its_own_error(api):
    client, _ = api
    items = [
        VALID,
        {"state": "no questions"},
        17,
        {**VALID, "model": "gpt-4"},
        {**VALID, "assets": {"img": {"url": "x"}}},
    ]
    r = await client.post("/v1/systemone/batch", json={"requests": items}, headers={"Accept": "application/json"})
    assert r.status_code == 200
    ok, missing, scalar, unknown_model, assets = r.json()
    assert "answers" in ok
    assert missing["status"] == 422 and missing["error"]["error_type"] == "invalid_request"
    assert "questions" in missing["error"]["message"]
    assert scalar["status"] == 422 and set(scalar["error"]) == {"error_type", "message"}
    assert unknown_model["status"] == 404 and unknown_model["error"]["error_type"] == "not_found"
    assert assets["error"]["error_type"] == "unsupported"


async def test_an_item_over_its_token_budget_fails_alone():
    async with running_app(max_branch_tokens=120) as (client, engine):
        items = [VALID, {**VALID, "state": "long " * 200}]
        r = await client.post("/v1/systemone/batch", json={"requests": items}, headers={"Accept": "application/json"})
        ok, over = r.json()
        assert "answers" in ok and over["error"]["error_type"] == "tokens_exceeded"
        assert len(engine.plans) == 1  # the item over budget never reached the engine


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"requests": []},
        {"requests": [VALID], "states": ["x"], "questions": QUESTIONS},
        {"states": ["x"]},
        {"states": ["x"], "questions": {"q": {"type": "choice", "criteria": {"only": None}}}},
        {"requests": [VALID], "surprise": 1},
    ],
)
async def test_a_bad_envelope_is_a_422(api, body):
    client, engine = api
    r = await client.post("/v1/systemone/batch", json=body)
    assert r.status_code == 422 and isinstance(r.json()["detail"], list), r.text
    assert engine.plans == []


async def test_batch_limits_are_enforced_before_engine_work_and_published():
    async with running_app(max_batch_items=2, max_batch_tokens=100) as (client, engine):
        limits = (await client.get("/v1/limits")).json()
        assert limits["max_batch_items"] == 2 and limits["max_batch_tokens"] == 100
        r = await client.post("/v1/systemone/batch", json={"requests": [VALID] * 3})
        assert r.status_code == 422 and "at most 2 items" in r.text
        r = await client.post("/v1/systemone/batch", json={"requests": [VALID, {**VALID, "state": "x " * 40}]})
        assert r.status_code == 422 and r.json()["detail"]["error_type"] == "tokens_exceeded"
        assert engine.plans == []


async def test_items_sharing_a_state_wait_for_their_leader():
    """The leader of a state runs alone; the rest start after it (the prefix cache then has
    the state); distinct states start together."""
    engine = FakeEngine(delay_s=0.05)
    async with running_app(engine) as (client, _):
        items = [{**VALID, "questions": {f"q{i}": QUESTIONS["refund"]}} for i in range(3)]
        items.append({**VALID, "state": "another state"})
        r = await client.post("/v1/systemone/batch", json={"requests": items})
        lines = _lines(r)[:-1]
        order = [line["index"] for line in lines]
        assert order.index(0) < order.index(1) and order.index(0) < order.index(2)
        assert order.index(3) < order.index(1)  # ran beside the leader, not after it


async def test_batch_needs_the_key_when_auth_is_on():
    async with running_app(api_keys=("k1",)) as (client, _):
        assert (await client.post("/v1/systemone/batch", json={"requests": [VALID]})).status_code == 401
        r = await client.post("/v1/systemone/batch", json={"requests": [VALID]}, headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200
