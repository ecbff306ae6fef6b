"""The model's context enforced on every engine (issue 48, item 3): a branch longer than the
model's positions (`ModelCard.context_length`, which the in-process engines read from the
model: transformers' `max_position_embeddings`, llama.cpp's trained context) is a 4xx
before any engine work, with the limit in the message (`context_length_exceeded` on the
OpenAI face, `tokens_exceeded` on Jev's), on every decision route; the limit is in
/v1/models. The issue's: SmolLM2-135M (8,192 positions) computed a 9,574-token state for
28.5 s and answered 200 with label mass 0.024."""

from __future__ import annotations

import dataclasses

import pytest

from tests.api.conftest import CARD, running_app
from tests.api.test_every_route import EVERY, IDS

SMOLLM2 = dataclasses.replace(CARD, context_length=8_192)


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_a_state_past_the_models_8192_positions_is_refused_before_any_work(route):
    async with running_app(card=SMOLLM2) as (client, engine):
        status, error, _ = await route.post(client, route.body("7 " * 9_574))
        assert status == route.invalid, error
        if route.openai:
            assert error["code"] == "context_length_exceeded", error
        else:
            assert error["error_type"] == "tokens_exceeded", error
        message = error["message"]
        assert "limit 8192 per branch: the model's context length" in message, message
        assert engine.plans == []
        status, error, _ = await route.post(client, route.body("7 " * 8_000))  # within it: served
        assert status == 200, error
        assert len(engine.plans) == 1


async def test_the_context_length_is_in_v1_models():
    async with running_app(card=SMOLLM2) as (client, _):
        (model,) = (await client.get("/v1/models")).json()["models"]
        assert model["x_context_length"] == 8_192
    async with running_app() as (client, _):  # an engine that does not say: null, its server checks
        (model,) = (await client.get("/v1/models")).json()["models"]
        assert model["x_context_length"] is None


async def test_a_budget_below_the_context_keeps_its_own_message():
    async with running_app(card=SMOLLM2, max_branch_tokens=4_000) as (client, engine):
        r = await client.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": "7 " * 5_000,
                "questions": {"q": {"type": "noul", "instructions": "?"}},
            },
        )
        assert r.status_code == 422 and "(limit 4000 per branch)" in r.text, r.text
        assert engine.plans == []
