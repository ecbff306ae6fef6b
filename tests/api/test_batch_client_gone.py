"""The batch route when its work outgrows what the client is owed (issue 28, items 2 and 6):
refused items count toward --max-batch-tokens; a client that leaves stops the batch's
preparation (no thread left computing) and, mid-stream, leaves every unread item recorded
as 499 with its metrics and the batch's access line, no task left pending. The app is
driven as uvicorn drives it (ASGI 2.3: Starlette then watches for the disconnect), with
the FakeEngine at the engine seam."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time

from openjev.api.contract.jev import convert
from openjev.api.operations.logs import ACCESS
from tests.api.conftest import running_app
from tests.api.test_every_route import _sample

NOUL = {"q": {"type": "noul", "instructions": "Is it seven?"}}


def _item(state: str) -> dict:
    return {"model": "jev-latest", "state": state, "questions": NOUL}


async def test_refused_items_count_toward_the_batch_token_limit():
    async with running_app(max_batch_tokens=100_000) as (client, engine):
        refused = [_item("7 " * 40_000) for _ in range(3)]  # each over 32,768 per branch: 40,000 read
        r = await client.post("/v1/systemone/batch", json={"requests": refused}, headers={"accept": "application/json"})
        assert r.status_code == 422, r.text[:300]
        assert "limit 100000 per batch" in r.json()["detail"]["message"]
        assert engine.plans == []
        ok = await client.post("/v1/systemone/batch", json={"requests": [_item("7 7")]})
        assert ok.status_code == 200


async def _leave(app, body: bytes, *, after_lines: int, accept: str = "application/x-ndjson") -> list[dict]:
    """POST the batch as uvicorn would, the client leaving once `after_lines` body chunks
    arrived (0: as soon as the body is sent). The messages the app sent."""
    sent: list[dict] = []
    seen = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        if after_lines:
            await seen.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        lines = sum(1 for m in sent if m["type"] == "http.response.body" and m.get("body"))
        if lines >= after_lines:
            seen.set()

    headers = [(b"host", b"localhost"), (b"content-type", b"application/json"), (b"accept", accept.encode())]
    headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/systemone/batch",
        "raw_path": b"/v1/systemone/batch",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("localhost", 80),
    }
    await app(scope, receive, send)
    return sent


async def test_a_client_that_leaves_stops_the_preparation(monkeypatch):
    converted: list[float] = []
    real = convert.request_of

    def slow(body):
        time.sleep(0.05)  # a long item to prepare (in the worker thread)
        converted.append(time.perf_counter())
        return real(body)

    monkeypatch.setattr(convert, "request_of", slow)
    async with running_app() as (client, engine):
        body = json.dumps({"requests": [_item(f"state {i}") for i in range(100)]}).encode()
        await _leave(client._transport.app, body, after_lines=0)
        await asyncio.sleep(0.2)  # the item in hand when the client left is finished, no other
        count = len(converted)
        await asyncio.sleep(0.3)
        assert len(converted) == count < 50  # stopped within the 0.5 s watch, and stays stopped
        assert engine.plans == []
        assert (await client.post("/v1/systemone", json=_item("7 7"))).status_code == 200


async def test_a_stream_whose_client_leaves_records_its_unread_items(caplog):
    caplog.set_level(logging.INFO, logger=ACCESS)
    async with running_app() as (client, engine):
        engine.delay_s = 2.0
        items = [{"state": "no questions"}, *(_item(f"ticket {i}") for i in range(4))]
        sent = await _leave(client._transport.app, json.dumps({"requests": items}).encode(), after_lines=1)
        assert sent[0]["status"] == 200
        assert engine.cancelled == 4  # the items in the engine were cancelled (and awaited)
        metrics = (await client.get("/metrics")).text
        assert _sample(metrics, "openjev_batch_items_total", status="499") == 4
        assert _sample(metrics, "openjev_batch_items_total", status="422") == 1
        assert _sample(metrics, "openjev_rejections_total", status="499", error_type="client_closed_request") == 4
        gc.collect()
        records = list(caplog.records)
    access = [r.fields for r in records if r.name == ACCESS and r.fields.get("route") == "/v1/systemone/batch"]
    assert sorted(f["status"] for f in access if "item" in f) == [422, 499, 499, 499, 499]
    (whole,) = [f for f in access if "item" not in f]
    assert whole["items"] == 5 and whole["items_failed"] == 5 and whole["items_unread"] == 4
    assert not [r for r in records if "destroyed but it is pending" in r.getMessage()]
