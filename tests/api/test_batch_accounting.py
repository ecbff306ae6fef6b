"""Batch items count as requests (issue 16, findings 7-9): each item in the metrics and with
an access-log line of its own under the batch's request id, each one of its key's
requests/min, each admitted to the engine on its own (a 529 line carries `retry_after`),
and a drain that runs out of time ends an NDJSON stream with a 503 line per unfinished
item and the summary. Over the fake engine, in process."""

import asyncio
import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from openjev.api.operations.logs import ACCESS
from tests.api.conftest import running_app
from tests.api.test_systemone import VALID
from tests.support.fakes import FakeEngine

AUTH = {"Authorization": "Bearer k1"}


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _lines(r) -> list[dict]:
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


def _access(caplog) -> list[dict]:
    return [r.fields for r in caplog.records if r.name == ACCESS]


def _ops(client):
    return client._transport.app.state.ops  # the app behind running_app's in-process client


def _items(n: int, tag: str) -> list[dict]:
    return [{**VALID, "state": f"{tag} ticket number {i}"} for i in range(n)]


async def test_every_batch_item_is_in_the_metrics_and_has_its_own_access_line(caplog):
    caplog.set_level(logging.INFO, logger=ACCESS)
    async with running_app(api_keys=("k1",)) as (client, engine):
        items = [*_items(2, "counted"), {"state": "no questions"}]
        r = await client.post("/v1/systemone/batch", json={"requests": items}, headers=AUTH)
        assert r.status_code == 200
        lines = _lines(r)
        assert sorted(line.get("status", 200) for line in lines[:-1]) == [200, 200, 422]
        assert "questions" in next(line for line in lines if line.get("status") == 422)["error"]["message"]
        assert len(engine.plans) == 2  # the invalid item never reached the engine

        m = _samples((await client.get("/metrics")).text)
        assert m[("openjev_batch_items_total", (("key", "key1"), ("status", "200")))] == 2
        assert m[("openjev_batch_items_total", (("key", "key1"), ("status", "422")))] == 1
        assert m[("openjev_rejections_total", (("error_type", "invalid_request"), ("status", "422")))] == 1
        assert m[("openjev_answers_total", (("type", "choice"),))] == 2  # one choice question per item
        assert m[("openjev_answers_total", (("type", "noul"),))] == 2
        distinct = sum(line["usage"]["input_tokens"] for line in lines[:-1] if "usage" in line)
        assert m[("openjev_tokens_total", (("kind", "distinct"),))] == distinct > 0

        rid = r.headers["x-typesafe-request-id"]
        access = [f for f in _access(caplog) if f["request_id"] == rid]
        per_item = sorted((f["item"], f["status"]) for f in access if "item" in f)
        assert per_item == [(0, 200), (1, 200), (2, 422)]
        assert all(f["key"] == "key1" and f["route"] == "/v1/systemone/batch" for f in access)
        answered = [f for f in access if f.get("item") in (0, 1)]
        assert all(f["questions"] == 3 and f["tokens_distinct"] > 0 for f in answered)
        assert next(f for f in access if f.get("item") == 2)["error_type"] == "invalid_request"
        [whole] = [f for f in access if "item" not in f]
        assert whole["status"] == 200 and whole["items"] == 3
        assert whole["items_succeeded"] == 2 and whole["items_failed"] == 1

        assert (await client.post("/v1/systemone", json=VALID, headers=AUTH)).status_code == 200


@pytest.mark.usefixtures("limits_store")
async def test_per_key_requests_per_minute_count_batch_items():
    async with running_app(api_keys=("k1",), key_requests_per_min=5) as (client, engine):
        # A full bucket lets a batch larger than the limit through once (a request is never
        # refused forever), and leaves the key in debt for its items.
        r = await client.post("/v1/systemone/batch", json={"requests": _items(8, "debt")}, headers=AUTH)
        assert r.status_code == 200 and len(engine.plans) == 8
        r = await client.post("/v1/systemone", json=VALID, headers=AUTH)
        assert r.status_code == 429, r.text  # was 200: the batch had counted as one request
        assert "'key1'" in r.json()["detail"]["message"] and int(r.headers["retry-after"]) >= 1
        assert len(engine.plans) == 8  # nothing reached the engine


@pytest.mark.usefixtures("limits_store")
async def test_a_batch_is_refused_when_its_items_exceed_what_the_key_has_left():
    async with running_app(api_keys=("k1",), key_requests_per_min=6) as (client, engine):
        for _ in range(3):
            assert (await client.post("/v1/systemone", json=VALID, headers=AUTH)).status_code == 200
        r = await client.post("/v1/systemone/batch", json={"requests": _items(4, "left")}, headers=AUTH)
        assert r.status_code == 429, r.text
        assert "one per item" in r.json()["detail"]["message"] and int(r.headers["retry-after"]) >= 1
        assert len(engine.plans) == 3
        r = await client.post("/v1/systemone/batch", json={"requests": _items(1, "one")}, headers=AUTH)
        assert r.status_code == 200  # two left: a one-item batch still fits


async def test_batch_items_are_admitted_one_by_one_and_529_lines_carry_retry_after():
    engine = FakeEngine(delay_s=0.3)
    async with running_app(engine, max_queue_wait_s=0.45) as (client, _):
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200  # measures the rate
        r = await client.post("/v1/systemone/batch", json={"requests": _items(4, "admitted")})
        assert r.status_code == 200
        lines = _lines(r)[:-1]
        refused = [line for line in lines if line.get("status") == 529]
        assert len(refused) == 3 and sum("answers" in line for line in lines) == 1
        for line in refused:
            assert line["error"]["error_type"] == "rate_limit_error"
            assert "queue is too long" in line["error"]["message"]
            assert isinstance(line["retry_after"], int) and line["retry_after"] >= 1
        assert len(engine.plans) == 2  # the refused items never reached the engine
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200


async def test_a_drained_ndjson_stream_ends_with_503_lines_and_its_summary(caplog):
    caplog.set_level(logging.INFO, logger=ACCESS)
    engine = FakeEngine(delay_s=30)  # far beyond the drain timeout
    async with running_app(engine, drain_timeout_s=0.5) as (client, _):
        drain = _ops(client).drain
        batch = asyncio.ensure_future(client.post("/v1/systemone/batch", json={"requests": _items(3, "cut")}))
        for _ in range(500):
            if len(engine.plans) == 3:
                break
            await asyncio.sleep(0.01)
        assert len(engine.plans) == 3  # all three in the engine
        drain.begin(lambda: None)
        r = await asyncio.wait_for(batch, 20)
        assert r.status_code == 200  # the headers had gone out before the drain
        lines = _lines(r)
        assert sorted(line["index"] for line in lines[:-1]) == [0, 1, 2]  # one line per item ...
        for line in lines[:-1]:
            assert line["status"] == 503 and line["retry_after"] >= 1
            assert "shut down before this item finished" in line["error"]["message"]
        summary = lines[-1]["summary"]  # ... then the summary, last
        assert summary["items"] == 3 and summary["failed"] == 3 and summary["drained"] == 3
        assert engine.cancelled == 3  # the engine work was abandoned
        rid = r.headers["x-typesafe-request-id"]
        access = [f for f in _access(caplog) if f["request_id"] == rid]
        assert sorted(f["status"] for f in access if "item" in f) == [503, 503, 503]
        [whole] = [f for f in access if "item" not in f]
        assert whole["items_drained"] == 3 and whole["items_failed"] == 3
