"""POST /v1/decisions in OpenAI's Decisions format, in-process with a fake engine at the
engine seam: the conversion to the core (what the model reads), typed choice values, names
and order, refusals, usage, cache partitions, and every error in OpenAI's shape with `param`.
The real SDK against the real model: tests/integration/test_openai_sdk.py."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from openjev.api.contract.openai.convert import request_of
from openjev.api.contract.openai.schemas import DecisionCreate
from tests.api.conftest import running_app
from tests.api.test_systemone import VALID as JEV_VALID

TICKET = "I was charged twice for order #1234. Please refund me today!"
VALID = {
    "model": "jev-latest",
    "input": TICKET,
    "questions": [
        {"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."},
        {
            "type": "choice",
            "name": "team",
            "instructions": "Which team?",
            "choices": [{"value": "billing", "description": "Payments and refunds"}, {"value": "technical"}],
        },
        {
            "type": "score",
            "instructions": "How angry?",
            "levels": [{"label": "Calm"}, {"label": "Annoyed"}, {"label": "Furious", "description": "shouting"}],
        },
    ],
}
JSON = {"content-type": "application/json"}


def error_of(r, status: int = 400, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    assert err["param"] == param, err
    return err


async def test_answers_keep_order_names_types_and_usage(api):
    client, engine = api
    r = await client.post("/v1/decisions", json=VALID)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "fake-model-1"
    refund, team, anger = body["answers"]
    assert (refund["type"], refund["name"]) == ("predicate", "refund") and 0 <= refund["probability"] <= 1
    assert (team["type"], team["name"]) == ("choice", "team")
    assert [p["value"] for p in team["probabilities"]] == ["billing", "technical"]
    assert math.isclose(sum(p["probability"] for p in team["probabilities"]), 1.0)
    assert team["choice"] == max(team["probabilities"], key=lambda p: p["probability"])["value"]
    assert (anger["type"], anger["name"]) == ("score", None)
    assert [(p["label"], p["value"]) for p in anger["probabilities"]] == [("Calm", 0), ("Annoyed", 1), ("Furious", 2)]
    assert anger["score"] == pytest.approx(sum(p["value"] * p["probability"] for p in anger["probabilities"]))
    usage = body["usage"]
    assert usage["output_tokens"] == 0 and usage["output_tokens_details"] == {"reasoning_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] == engine.plans[0].unique_tokens
    assert set(usage["input_tokens_details"]) == {"cached_tokens", "cache_write_tokens"}
    # the same headers as /v1/systemone
    for header in ("x-openjev-readout", "x-openjev-calibration", "x-openjev-prefix-tokens", "x-typesafe-request-id"):
        assert header in r.headers


async def test_the_same_question_reads_the_same_as_on_systemone(api):
    """One core: a question asked on both routes becomes the same branches (same token ids)."""
    client, engine = api
    jev = {
        "model": "jev-latest",
        "state": TICKET,
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "Payments and refunds", "technical": None},
            },
            "anger": {"type": "score", "instructions": "How angry?", "criteria": ["Calm", "Annoyed", "Furious"]},
        },
    }
    oa = {
        "model": "jev-latest",
        "input": TICKET,
        "questions": [
            VALID["questions"][1],
            {
                "type": "score",
                "instructions": "How angry?",
                "levels": [{"label": x} for x in ("Calm", "Annoyed", "Furious")],
            },
        ],
    }
    a = await client.post("/v1/systemone", json=jev)
    b = await client.post("/v1/decisions", json=oa)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert [br.input_ids for br in engine.plans[0].branches] == [br.input_ids for br in engine.plans[1].branches]
    ja, jb = a.json()["answers"], b.json()["answers"]
    assert [p["probability"] for p in jb[0]["probabilities"]] == list(ja["team"]["probabilities"].values())
    assert [p["probability"] for p in jb[1]["probabilities"]] == list(ja["anger"]["probabilities"].values())


async def test_choice_values_are_typed(api):
    client, _ = api
    q = {
        "type": "choice",
        "instructions": "Is it true?",
        "choices": [
            {"value": "true", "description": "the text true"},
            {"value": True, "description": "yes"},
            {"value": False, "description": "no"},
            {"value": "false", "description": "the text false"},
        ],
    }
    # One reading: the fake engine's arbitrary log-probs must not meet the abstain rule
    # (order agreement needs several orders), which is not what this test is about.
    r = await client.post("/v1/decisions", json={**VALID, "questions": [q]}, headers={"x-openjev-rotations": "1"})
    assert r.status_code == 200, r.text
    (answer,) = r.json()["answers"]
    values = [p["value"] for p in answer["probabilities"]]
    assert values == ["true", True, False, "false"] and [type(v) for v in values] == [str, bool, bool, str]
    assert any(answer["choice"] is v or (answer["choice"] == v and type(answer["choice"]) is type(v)) for v in values)
    # duplicates are refused; "true" and true are not duplicates
    dup = {**q, "choices": [{"value": True}, {"value": "x"}, {"value": True}]}
    err = error_of(await client.post("/v1/decisions", json={**VALID, "questions": [dup]}), param="questions[0]")
    assert "more than once" in err["message"]
    for bad_value, where in ((1, "questions[0].choices[1].value"), (None, "questions[0].choices[1].value")):
        bad = {**q, "choices": [{"value": "a"}, {"value": bad_value}]}
        error_of(await client.post("/v1/decisions", json={**VALID, "questions": [bad]}), param=where)


async def test_input_items_become_readable_turns(api):
    client, engine = api
    items = [
        {"role": "developer", "content": "You triage support tickets."},
        {"role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "My order"}, {"type": "input_json", "data": {"order": 1234}}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}], "phase": "commentary"},
        {"type": "function_call", "call_id": "c1", "name": "lookup_order", "arguments": '{"id": 1234}'},
        {"type": "function_call_output", "call_id": "c1", "output": "charged twice"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "refund", "namespace": "billing", "input": "1234"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "done"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot share that."}]},
    ]
    body = {**VALID, "input": items, "questions": VALID["questions"][:1]}
    r = await client.post("/v1/decisions", json=body)
    assert r.status_code == 200, r.text
    turns = request_of(DecisionCreate.model_validate(body), 64).state.turns
    assert [(t.role, t.content) for t in turns] == [
        ("system", "You triage support tickets."),
        ("system", "Be brief."),
        ("user", 'My order\n\n{"order":1234}'),
        ("assistant", "Let me look."),
        ("assistant", '[tool call c1: lookup_order, arguments: {"id": 1234}]'),
        ("user", "[tool output c1 from lookup_order]\ncharged twice"),
        ("assistant", "[tool call c2: billing.refund, input: 1234]"),
        ("user", "[tool output c2 from billing.refund]\ndone"),
        ("assistant", "I cannot share that."),
    ]
    # the rendered turns are what the engine read: the plan's shared part grew by all of them
    assert engine.plans[-1].shared_prefix_len > 60


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a.png"}]}]},
            "input[0].content[0]",
            "input_image",
        ),
        (
            {"questions": [{"type": "predicate", "instructions": [{"type": "input_image", "image_url": "data:,"}]}]},
            "questions[0].instructions[0]",
            "input_image",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input[0].call_id",
            "call_id",
        ),
        ({"input": []}, "input", "at least one"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0]", "an input item is a message"),
        ({"questions": []}, "questions", "at least 1"),
        ({"questions": [{"type": "noul", "instructions": "x"}]}, "questions[0]", "predicate"),
        (
            {"questions": [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}]},
            "questions[0].choices",
            "at least 2",
        ),
        (
            {"questions": [{"type": "score", "instructions": "x", "levels": [{"label": "a"}, {"name": "b"}]}]},
            "questions[0].levels[1].label",
            "required",
        ),
        ({"questions": [{"type": "predicate"}]}, "questions[0].instructions", "required"),
        ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl", "30m"),
        ({"temperature": 0.5}, "temperature", "not permitted"),
        ({"model": 5}, "model", "string"),
    ],
)
async def test_invalid_bodies_are_400_naming_the_field(api, change, param, says):
    client, engine = api
    err = error_of(await client.post("/v1/decisions", json={**VALID, **change}), param=param)
    assert err["type"] == "invalid_request_error" and says in err["message"], err
    assert engine.plans == []


async def test_a_jev_body_is_pointed_to_systemone(api):
    client, _engine = api
    err = error_of(await client.post("/v1/decisions", json=JEV_VALID))
    assert "/v1/systemone" in err["message"]
    # /api/alpha/decisions stays a Jev alias
    assert (await client.post("/api/alpha/decisions", json=JEV_VALID)).status_code == 200


async def test_wire_refusals_are_400_on_this_face(api):
    client, engine = api
    raw = {
        b'{"model": "jev-latest", "input": "x", "questions": [], "questions": []}': "questions",
        b'{"model": "jev-latest", "input": NaN, "questions": []}': "input",
        b'{"model": "jev-latest", "input": "\\ud800", "questions": []}': "input",
        b'{"model": "jev-latest", "input"': None,
        b"\xff\xfe": None,
    }
    for body, param in raw.items():
        err = error_of(await client.post("/v1/decisions", content=body, headers=JSON), param=param)
        assert err["type"] == "invalid_request_error"
    deep = ('{"model": "jev-latest", "input": ' + "[" * 100 + "]" * 100 + ', "questions": []}').encode()
    err = error_of(await client.post("/v1/decisions", content=deep, headers=JSON), param=None)
    assert "nest" in err["message"]
    err = error_of(await client.post("/v1/decisions", content=b"{}", headers={"content-type": "text/plain"}), 415)
    assert err["code"] == "unsupported_media_type"
    err = error_of(
        await client.post("/v1/decisions", json=VALID, headers={"x-openjev-rotations": "0"}),
        param="x-openjev-rotations",
    )
    assert engine.plans == []


async def test_limits_404_413_and_questions_beyond_the_server_limit():
    async with running_app(max_questions=2, max_body_bytes=4096) as (client, _engine):
        err = error_of(await client.post("/v1/decisions", json=VALID), param="questions")
        assert "at most 2 questions" in err["message"] and "--max-questions" in err["message"]
        one = {**VALID, "questions": VALID["questions"][:1]}
        err = error_of(await client.post("/v1/decisions", json={**one, "model": "gpt-6-luna"}), 404, param="model")
        assert err["code"] == "model_not_found"
        big = {**VALID, "input": "x" * 5000}
        err = error_of(await client.post("/v1/decisions", json=big), 413)
        assert err["type"] == "invalid_request_error"
        packed = gzip.compress(json.dumps({**VALID, "input": "y" * 100_000}).encode())
        error_of(await client.post("/v1/decisions", content=packed, headers={**JSON, "content-encoding": "gzip"}), 413)
        long = {**VALID, "questions": VALID["questions"][:1]}
        assert (await client.post("/v1/decisions", json=long)).status_code == 200


async def test_token_budget_is_a_400_naming_the_question():
    async with running_app(max_branch_tokens=40) as (client, engine):
        err = error_of(await client.post("/v1/decisions", json=VALID))
        assert err["code"] == "context_length_exceeded" and "questions[0]" in err["message"]
        assert engine.plans == []


@pytest.mark.usefixtures("limits_store")
async def test_401_and_429_in_openai_shape_with_their_headers():
    async with running_app(api_keys=("k1",), key_requests_per_min=1) as (client, _engine):
        err = error_of(await client.post("/v1/decisions", json=VALID), 401)
        assert err["type"] == "authentication_error"
        auth = {"Authorization": "Bearer k1"}
        assert (await client.post("/v1/decisions", json=VALID, headers=auth)).status_code == 200
        r = await client.post("/v1/decisions", json=VALID, headers=auth)
        err = error_of(r, 429)
        assert err["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1
        # the canonical shape stays on the Jev route
        r = await client.post("/v1/systemone", json=JEV_VALID)
        assert r.status_code == 401 and "detail" in r.json()


async def test_refusal_is_per_question():
    """A floor no reading reaches declines every question; the answers keep their names and order."""
    async with running_app(abstain_min_label_mass=1.0, abstain_min_order_agreement=0.0) as (client, _):
        r = await client.post("/v1/decisions", json=VALID)
        assert r.status_code == 200, r.text
        assert r.json()["answers"] == [
            {"type": "refusal", "name": "refund"},
            {"type": "refusal", "name": "team"},
            {"type": "refusal", "name": None},
        ]
        jev = (await client.post("/v1/systemone", json=JEV_VALID)).json()["answers"]
        assert all(a["x_abstain"] is True and "type" in a for a in jev.values())
        limits = (await client.get("/v1/limits")).json()
        assert limits["abstain"] == {"min_label_mass": 1.0, "min_order_agreement": 0.0, "min_confidence": 0.0}
        models = (await client.get("/v1/models")).json()["models"][0]
        assert models["x_abstain"] == limits["abstain"]  # the rule in force, said in both places


async def test_prompt_cache_key_partitions_the_namespace(api):
    client, engine = api
    for key in (None, "tenant-a", "tenant-a", "tenant-b"):
        body = {**VALID, "prompt_cache_key": key, "prompt_cache_options": {"mode": "implicit", "ttl": "30m"}}
        assert (await client.post("/v1/decisions", json=body)).status_code == 200
    spaces = [plan.cache_namespace for plan in engine.plans]
    assert spaces[0] == "" and spaces[1] == spaces[2] and len({spaces[0], spaces[1], spaces[3]}) == 3


async def test_safety_identifier_is_logged_only_as_a_hash(api, caplog):
    client, _ = api
    caplog.set_level("INFO")
    secret = "user-4711-secret"
    r = await client.post("/v1/decisions", json={**VALID, "safety_identifier": secret})
    assert r.status_code == 200
    logged = [getattr(rec, "fields", {}) for rec in caplog.records]
    assert any("safety_identifier_hmac" in f for f in logged)
    assert secret not in caplog.text and all(secret not in json.dumps(f, default=str) for f in logged)


async def test_openapi_documents_the_route_with_openai_bodies(api):
    client, _ = api
    doc = (await client.get("/openapi.json")).json()
    op = doc["paths"]["/v1/decisions"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/DecisionCreate")
    assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Decision")
    for status in ("400", "401", "404", "413", "415", "429", "503", "529"):
        assert op["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("/DecisionErrorBody")
    assert "422" not in op["responses"]
