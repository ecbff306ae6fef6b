"""The hardening that concerns a decision route, run on every decision route: Jev's
/v1/systemone, its alias /api/alpha/decisions, OpenAI's /v1/decisions and, where it
applies, a batch item (issue 27). In-process with the FakeEngine and FakeTokenizer (one
token per " 7").

Each of these guarded a drift between copies of the route on the old main: refused work
not charged on /v1/decisions, its body converted on the event loop, phase_seconds{total}
counted on /v1/systemone alone, an abandoned batch item counted as error_type="unknown",
and OpenAI choices that read the same accepted."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from openjev.api.contract.jev import convert
from openjev.api.contract.openai import convert as openai_convert
from openjev.api.operations.access import AccessLog
from openjev.api.operations.logs import ACCESS
from openjev.api.operations.metrics import Metrics
from openjev.core.types import Share
from tests.api.conftest import running_app


@dataclass(frozen=True)
class Route:
    """A decision route as a client sees it: how to ask one question about a state, and
    how its errors look."""

    path: str
    openai: bool = False
    batch: bool = False

    def body(self, state: str, question: dict[str, Any] | None = None, model: str = "jev-latest") -> dict[str, Any]:
        if self.openai:
            q = question or {"type": "predicate", "name": "q", "instructions": "Is it seven?"}
            return {"model": model, "input": state, "questions": [q]}
        one = {
            "model": model,
            "state": state,
            "questions": {"q": question or {"type": "noul", "instructions": "Is it seven?"}},
        }
        return {"requests": [one]} if self.batch else one

    async def post(self, client, body, headers=None):
        """(status, error) of the decision: the item's line for a batch, the response's else."""
        headers = {**(headers or {}), "accept": "application/json"}
        r = await client.post(self.path, json=body, headers=headers)
        if self.batch and r.status_code == 200:
            (line,) = r.json()
            return line.get("status", 200), line.get("error"), r
        if r.status_code >= 400:
            body = r.json()
            return r.status_code, body.get("error") if self.openai else body["detail"], r
        return r.status_code, None, r

    @property
    def invalid(self) -> int:
        return 400 if self.openai else 422


SINGLE = [Route("/v1/systemone"), Route("/api/alpha/decisions"), Route("/v1/decisions", openai=True)]
EVERY = [*SINGLE, Route("/v1/systemone/batch", batch=True)]
IDS = [r.path for r in EVERY]


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


# ---- costs and charging


@pytest.mark.parametrize("route", EVERY, ids=IDS)
@pytest.mark.usefixtures("limits_store")
async def test_refused_work_is_charged_to_the_key_so_it_is_429_next(route):
    async with running_app(api_keys=("key-a", "key-b"), key_tokens_per_min=50_000) as (client, engine):
        refused = route.body("7 " * 60_000)  # 60,000 state tokens encoded before the per-branch refusal
        status, error, _ = await route.post(client, refused, _auth("key-a"))
        assert status == route.invalid, error
        assert (error["code"] if route.openai else error["error_type"]) in (
            "context_length_exceeded",
            "tokens_exceeded",
        )
        assert engine.plans == []
        status, error, r = await route.post(client, route.body("7 7"), _auth("key-a"))
        if route.batch:  # the item's own line carries the 429 and its retry_after
            assert status == 429 and error["error_type"] == "rate_limit_error"
        else:
            assert status == 429 and int(r.headers["retry-after"]) > 0, r.text
        status, _, _ = await route.post(client, route.body("7 7"), _auth("key-b"))
        assert status == 200  # another key is served
        assert len(engine.plans) == 1


# ---- off-loop conversion


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_a_large_body_is_converted_in_a_worker_thread(route, monkeypatch):
    threads: list[int] = []
    for module in (convert, openai_convert):  # where each format converts its state
        real = module.state_of
        monkeypatch.setattr(module, "state_of", lambda v, real=real: threads.append(threading.get_ident()) or real(v))
    loop_thread = threading.get_ident()
    async with running_app() as (client, _):
        status, error, _ = await route.post(client, route.body("seven" * 14_000))  # 70 KB, one word
        assert status == 200, error
        assert threads and loop_thread not in threads
        threads.clear()
        status, _, _ = await route.post(client, route.body("7 7"))  # small: on the loop, no thread's cost
        assert status == 200 and threads


# ---- input rules


def _choice(route: Route, shown: list[Any]) -> dict[str, Any]:
    """A choice question whose options show the model `shown` (as names, or values)."""
    if route.openai:
        return {"type": "choice", "name": "q", "instructions": "Which?", "choices": [{"value": v} for v in shown]}
    return {"type": "choice", "instructions": "Which?", "criteria": {str(v): None for v in shown}}


def _score(route: Route, levels: list[str]) -> dict[str, Any]:
    if route.openai:
        return {"type": "score", "name": "q", "instructions": "How?", "levels": [{"label": x} for x in levels]}
    return {"type": "score", "instructions": "How?", "criteria": levels}


@pytest.mark.parametrize("route", EVERY, ids=IDS)
@pytest.mark.parametrize(
    "question",
    [
        pytest.param(lambda r: _choice(r, ["yes", " yes ", "no"]), id="yes-and-spaced-yes"),
        pytest.param(lambda r: _choice(r, [" ", "no"]), id="blank-option"),
        pytest.param(lambda r: _score(r, ["", "high"]), id="empty-score-level"),
        pytest.param(lambda r: _choice(r, ["only"]), id="one-option"),
    ],
)
async def test_options_the_model_cannot_tell_apart_are_refused(route, question):
    async with running_app() as (client, engine):
        status, error, r = await route.post(client, route.body("7 7", question(route)))
        assert status == route.invalid, (error, r.text[:300])
        assert engine.plans == []


@pytest.mark.parametrize(
    "choices",
    [
        pytest.param([{"value": "true"}, {"value": True}, {"value": "no"}], id="string-true-then-true"),
        pytest.param([{"value": True}, {"value": "true"}, {"value": "no"}], id="true-then-string-true"),
        pytest.param([{"value": "a", "description": "same"}, {"value": "b", "description": "same"}], id="same-text"),
        pytest.param([{"value": ""}, {"value": " "}], id="empty-and-blank"),
        pytest.param([{"value": "yes"}, {"value": " yes "}], id="spaced-yes"),
        pytest.param([{"value": "a", "description": " "}, {"value": "b"}], id="blank-description"),
    ],
)
async def test_openai_choices_that_read_the_same_are_a_400_naming_them(choices):
    route = SINGLE[2]
    question = {"type": "choice", "name": "q", "instructions": "Which?", "choices": choices}
    async with running_app() as (client, engine):
        status, error, _ = await route.post(client, route.body("7 7", question))
        assert status == 400 and error["type"] == "invalid_request_error", error
        assert error["param"] == "questions[0]", error
        assert engine.plans == []


async def test_openai_score_labels_must_be_readable():
    route = SINGLE[2]
    question = {"type": "score", "name": "q", "instructions": "How?", "levels": [{"label": " "}, {"label": "high"}]}
    async with running_app() as (client, _):
        status, error, _ = await route.post(client, route.body("7 7", question))
        assert status == 400 and error["param"] == "questions[0].levels[0].label", error


# ---- errors


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_errors_leave_in_the_routes_own_format(route):
    async with running_app(max_questions=1) as (client, _):
        status, error, r = await route.post(client, route.body("7 7", model="gpt-unknown"))
        assert status == 404, error
        if route.openai:
            assert error["code"] == "model_not_found" and error["param"] == "model"
            assert "detail" not in r.json()
        else:
            assert error["error_type"] == "not_found"
        two = route.body("7 7")
        if route.openai:
            two["questions"] = [two["questions"][0], {**two["questions"][0], "name": "q2"}]  # names are unique
        else:
            items = two["requests"] if route.batch else [two]
            items[0]["questions"] = {"a": items[0]["questions"]["q"], "b": items[0]["questions"]["q"]}
        status, error, r = await route.post(client, two)
        assert status == route.invalid, error
        message = error["message"] if route.openai or route.batch else error[0]["msg"]
        assert "at most 1 questions" in message


# ---- metrics and access lines


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_every_decision_is_timed_and_has_its_access_line(route, caplog):
    caplog.set_level(logging.INFO, logger=ACCESS)
    async with running_app() as (client, _):
        before = _sample((await client.get("/metrics")).text, "openjev_phase_seconds_count", phase="total")
        status, _, r = await route.post(client, route.body("7 7"))
        assert status == 200
        after = _sample((await client.get("/metrics")).text, "openjev_phase_seconds_count", phase="total")
        assert after == before + 1  # the request, or the batch's one item
    rid = r.headers["x-typesafe-request-id"]
    lines = [rec.fields for rec in caplog.records if rec.name == ACCESS and rec.fields.get("request_id") == rid]
    decided = [f for f in lines if f.get("questions") == 1]
    assert len(decided) == 1 and decided[0]["route"] == route.path and decided[0]["status"] == 200
    assert decided[0]["tokens_distinct"] > 0


def test_a_batch_item_nobody_read_is_client_closed_request_not_unknown():
    metrics = Metrics(dict)
    AccessLog(metrics).record_item({"method": "POST", "state": {}}, 3, 499, None, None, time.perf_counter())
    text = metrics.exposition().decode()
    assert _sample(text, "openjev_rejections_total", status="499", error_type="client_closed_request") == 1
    assert _sample(text, "openjev_rejections_total", status="499", error_type="unknown") == 0
    assert _sample(text, "openjev_batch_items_total", status="499") == 1


@pytest.mark.parametrize("route", EVERY, ids=lambda r: r.path)
async def test_the_callers_key_reaches_the_engine_as_its_share(route, tmp_path):
    (tmp_path / "keys").write_text("alice:alice-key\nbob:bob-key\n")
    async with running_app(api_keys_file=str(tmp_path / "keys")) as (client, engine):
        for key in ("alice-key", "bob-key"):
            status, _, _ = await route.post(client, route.body("7 7"), {"Authorization": f"Bearer {key}"})
            assert status == 200
    assert [(p.share.tenant, p.share.weight) for p in engine.plans] == [("alice", 1), ("bob", 1)]
    async with running_app() as (client, engine):
        assert (await route.post(client, route.body("7 7")))[0] == 200
    assert engine.plans[0].share == Share()  # no keys: one share, today's order
