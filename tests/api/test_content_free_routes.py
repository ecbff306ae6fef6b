"""Content-free calibration at the edge, on every decision route: a choice whose fit divides
out its content-free answer costs one more engine call the first time a key asks it (read
beside the request, charged and counted in its usage), none after, and another key reads
its own (core/content_free.py)."""

from __future__ import annotations

import pytest

from tests.api.conftest import running_app
from tests.api.test_every_route import EVERY, IDS
from tests.support.calibration_files import fake_model_calibration

CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Payments", "tech": "Bugs"}}
OPENAI_CHOICE = {
    "type": "choice",
    "name": "q",
    "instructions": "Which team?",
    "choices": [{"value": "billing", "description": "Payments"}, {"value": "tech", "description": "Bugs"}],
}


def _calibration(tmp_path) -> str:
    fits = [{"readout": "letters", "types": {"choice": {"temperature": 0.7, "content_free": True}}}]
    return fake_model_calibration(tmp_path, "fake-model-content-free", fits, {"readout": "letters", "rotations": 1})


def _usage(route, r) -> int:
    body = r.json()
    return (body[0] if route.batch else body)["usage"]["input_tokens"]


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_a_keys_first_choice_reads_its_twin_once_and_is_charged_for_it(tmp_path, route):
    async with running_app(calibration=_calibration(tmp_path), api_keys=("key-a", "key-b")) as (client, engine):
        body = route.body("I was charged twice.", OPENAI_CHOICE if route.openai else CHOICE)
        a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
        status, error, first = await route.post(client, body, a)
        assert status == 200, error
        assert first.headers.get("x-openjev-calibration", "fake-model-content-free") == "fake-model-content-free"
        assert len(engine.plans) == 2  # the request and its content-free twin
        twin_tokens = engine.plans[1].unique_tokens
        status, error, again = await route.post(client, body, a)
        assert status == 200, error
        assert len(engine.plans) == 3  # cached for key-a
        assert _usage(route, first) == _usage(route, again) + twin_tokens
        status, error, _ = await route.post(client, body, b)
        assert status == 200, error
        assert len(engine.plans) == 5  # key-b reads its own
        metrics = (await client.get("/metrics")).text
        for line in ("openjev_content_free_entries 2.0", "openjev_content_free_hits_total 1.0"):
            assert line in metrics.splitlines(), line
        assert "openjev_content_free_misses_total 2.0" in metrics.splitlines()
