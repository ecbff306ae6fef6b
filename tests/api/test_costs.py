"""Issue 16, findings 1, 3 and 5, through the app (in-process, FakeEngine and FakeTokenizer):
every cost bomb is a 422 that names the limit, nothing reaches the engine, the work a
refusal cost is charged to the caller's key, every limit is in /v1/limits, and the next
valid request is answered. (tests/integration/test_costs_live.py sends the issue's own
bodies to a real server with the embedded model and measures CPU, memory and liveness.)"""

from __future__ import annotations

import re

import pytest

from openjev.api.contract.jev import convert
from tests.api.conftest import running_app
from tests.support import bombs

YESNO = {"x-openjev-readout": "yesno"}


def _bomb(state_tokens: int) -> dict:
    body = bombs.yesno_compile_bomb()
    body["state"] = "7 " * state_tokens  # the fake tokenizer: one token per " 7"
    return body


async def _next_is_answered(client, engine, headers=None) -> None:
    r = await client.post("/v1/systemone", json=bombs.SMALL, headers=headers or {})
    assert r.status_code == 200, r.text
    assert len(engine.plans) == 1


def _refused(r, pattern: str) -> None:
    assert r.status_code == 422, r.text[:300]
    detail = r.json()["detail"]
    assert detail["error_type"] == "tokens_exceeded"
    assert re.search(pattern, detail["message"]), detail["message"]


async def test_every_cost_bound_is_published():
    async with running_app(max_branches=1000, max_prompt_tokens=123_456) as (client, _):
        limits = (await client.get("/v1/limits")).json()
    assert limits["max_branches"] == 1000 and limits["max_prompt_tokens"] == 123_456
    for name in (
        "max_branch_tokens",
        "max_request_tokens",
        "max_batch_tokens",
        "max_batch_items",
        "max_body_bytes",
        "max_rotations",
        "rotation_max_options",
    ):
        assert name in limits


async def test_yesno_compile_bomb_is_refused_from_the_state_alone():
    async with running_app() as (client, engine):
        r = await client.post("/v1/systemone", json=_bomb(97_500), headers=YESNO)
        _refused(r, r"question 'q0': the state and this question take more than \d+ tokens \(limit 32768 per branch\)")
        assert engine.plans == []
        await _next_is_answered(client, engine)


async def test_default_readout_compile_bomb_is_refused():
    async with running_app() as (client, engine):
        body = bombs.letters_compile_bomb(40_000)
        body["state"] = "1 2 3 4 5 6 7 8 9 0 " * 4000
        r = await client.post("/v1/systemone", json=body)
        _refused(r, r"the state and this question take more than \d+ tokens \(limit 32768 per branch\)")
        assert engine.plans == []
        await _next_is_answered(client, engine)


async def test_branch_count_and_branch_tokens_added_up_are_refused_before_compiling():
    async with running_app(max_branches=1000) as (client, engine):
        r = await client.post("/v1/systemone", json=_bomb(10), headers=YESNO)
        _refused(r, r"the request reads 1020 branches \(limit 1000 per request")
        assert engine.plans == []
        await _next_is_answered(client, engine)
    async with running_app(max_prompt_tokens=1_000_000) as (client, engine):
        r = await client.post("/v1/systemone", json=_bomb(2_000), headers=YESNO)  # 1020 x 2000+ tokens
        _refused(r, r"the request's 1020 branches take at least \d+ tokens in all.*\(limit 1000000 per request\)")
        assert engine.plans == []
        await _next_is_answered(client, engine)


async def test_many_empty_chat_turns_are_refused_by_their_count():
    async with running_app() as (client, engine):
        r = await client.post("/v1/systemone", json=bombs.empty_turns_bomb())
        _refused(r, r"the state's 66000 chat turns alone take at least \d+ tokens \(limit 32768 per branch\)")
        assert engine.plans == []
        await _next_is_answered(client, engine)


async def test_batch_states_bomb_converts_its_questions_once_and_stops_at_the_first_item_over(monkeypatch):
    calls = []
    real = convert.question_of
    monkeypatch.setattr(convert, "question_of", lambda q: calls.append(1) or real(q))
    async with running_app() as (client, engine):
        r = await client.post("/v1/systemone/batch", json=bombs.batch_states_bomb())
        _refused(r, r"the batch takes more than \d+ distinct tokens by item (\d+), its items' added up")
        stopped_at = int(r.json()["detail"]["message"].split("by item ")[1].split(",")[0])
        assert stopped_at < 127  # the items after the first over the limit were never compiled
        assert len(calls) == 64  # the 64 shared questions, converted once for the 128 states
        assert engine.plans == []
        await _next_is_answered(client, engine)


async def test_states_form_items_keep_their_own_errors():
    async with running_app() as (client, _):
        body = {
            "questions": {"q": {"type": "noul", "instructions": "Refund?"}},
            "states": ["fine", [{"role": "robot", "content": "x"}], "also fine"],
        }
        r = await client.post("/v1/systemone/batch", json=body, headers={"accept": "application/json"})
        assert r.status_code == 200
        lines = r.json()
        assert [line.get("status") for line in lines] == [None, 422, None]
        assert "state[0].role" in lines[1]["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/systemone/batch"])
@pytest.mark.usefixtures("limits_store")
async def test_refused_compile_work_is_charged_to_the_callers_key(path):
    async with running_app(api_keys=("key-a", "key-b"), key_tokens_per_min=50_000) as (client, engine):
        a, b = ({"Authorization": f"Bearer {k}"} for k in ("key-a", "key-b"))
        body = _bomb(60_000)  # 60,000 state tokens encoded before the per-branch refusal
        if path.endswith("batch"):
            body = {"requests": [body]}
        r = await client.post(path, json=body, headers={**a, **YESNO, "accept": "application/json"})
        if path.endswith("batch"):
            assert r.status_code == 200 and r.json()[0]["status"] == 422
        else:
            _refused(r, "per branch")
        assert engine.plans == []
        again = await client.post("/v1/systemone", json=bombs.SMALL, headers=a)
        assert again.status_code == 429 and "distinct tokens per minute" in again.json()["detail"]["message"]
        await _next_is_answered(client, engine, b)  # another key is not charged


async def test_a_large_body_validated_off_the_loop_reports_errors_as_a_small_one_does():
    async with running_app() as (client, engine):
        for state in ("short", "x " * 50_000):  # the second is over strict_json.THREAD_FROM_BYTES
            body = {"state": state, "questions": {"q": {"type": "choice", "criteria": {"only": None}}}}
            r = await client.post("/v1/systemone", json=body)
            assert r.status_code == 422
            (issue,) = r.json()["detail"]
            assert issue["loc"] == ["body", "questions", "q", "choice", "criteria"], issue
            assert "at least 2" in issue["msg"]
        assert engine.plans == []
        await _next_is_answered(client, engine)
