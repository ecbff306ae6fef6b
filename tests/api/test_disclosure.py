"""What a failure tells the client (the kind of failure, the request id) and what only
the log sees (the backend's URL and reply, a foreign exception's text)."""

import httpx

from openjev.api.operations.logs import JsonFormatter
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.sglang_protocol import SGLANG
from openjev.errors import EngineUnavailable
from tests.api.conftest import running_app
from tests.api.test_ops import Captured
from tests.api.test_systemone import VALID
from tests.support.fakes import FakeEngine

BACKEND = "http://10.9.8.7:30000"
REPLY = "Traceback: /srv/models/secret-model/config.json token=hunter2"


def _leaks(text: str) -> bool:
    return any(s in text for s in ("10.9.8.7", "hunter2", "/srv/models"))


def _sglang(handler) -> HTTPEngine:
    return HTTPEngine(BACKEND, SGLANG, transport=httpx.MockTransport(handler))


async def _post_and_log(engine, path="/v1/systemone", body=VALID, **headers):
    with Captured(JsonFormatter()) as logs:
        async with running_app(engine) as (client, _):
            r = await client.post(path, json=body, headers=headers)
    return r, logs


def _access_line(logs, r):
    rid = r.headers["x-typesafe-request-id"]
    (line,) = [a for a in logs.access() if a.get("request_id") == rid]
    return line


async def test_a_backend_error_reply_reaches_the_log_not_the_client():
    r, logs = await _post_and_log(_sglang(lambda request: httpx.Response(500, text=REPLY)))
    assert r.status_code == 502 and r.json()["detail"]["message"] == "the engine answered 500"
    assert not _leaks(r.text) and not _leaks(str(r.headers))
    line = _access_line(logs, r)
    assert "hunter2" in line["error_detail"] and BACKEND in line["error_detail"]


async def test_an_unreachable_backend_is_named_in_the_log_only():
    def refuse(request):
        raise httpx.ConnectError(f"connection refused by {BACKEND}")

    r, logs = await _post_and_log(_sglang(refuse))
    assert r.status_code == 503 and r.json()["detail"]["message"] == "cannot reach the engine"
    assert not _leaks(r.text)
    assert BACKEND in _access_line(logs, r)["error_detail"]


async def test_a_batch_item_failure_keeps_its_detail_for_the_log():
    engine = FakeEngine(fail=EngineUnavailable("cannot reach the engine", detail=f"{BACKEND}: {REPLY}"))
    r, logs = await _post_and_log(engine, "/v1/systemone/batch", {"requests": [VALID]}, accept="application/json")
    (item,) = r.json()
    assert item["status"] == 503 and item["error"]["message"] == "cannot reach the engine"
    assert not _leaks(r.text)
    rid = r.headers["x-typesafe-request-id"]
    assert any(
        rec.get("request_id") == rid and "hunter2" in rec["msg"]
        for rec in logs.json_lines()
        if rec["logger"] == "openjev.api.server.batch"
    )


async def test_a_startup_error_that_reaches_a_request_says_internal_error():
    from openjev.errors import ConfigError

    r, logs = await _post_and_log(FakeEngine(fail=ConfigError("--model '/srv/models/secret-model': unreadable")))
    assert r.status_code == 500 and r.json()["detail"]["message"] == "internal error"
    assert not _leaks(r.text)
    assert "/srv/models" in _access_line(logs, r)["error_detail"]


async def test_a_full_server_does_not_tell_how_busy_the_others_keep_it():
    import asyncio
    import re

    with Captured(JsonFormatter()) as logs:
        async with running_app(FakeEngine(delay_s=0.3), max_in_flight=1) as (client, _):
            first = asyncio.ensure_future(client.post("/v1/systemone", json=VALID))
            await asyncio.sleep(0.1)
            r = await client.post("/v1/systemone", json=VALID)
            assert (await first).status_code == 200
    assert r.status_code == 529 and r.headers["retry-after"]
    assert not re.search(r"\d", r.json()["detail"]["message"])  # no counts, no limits
    assert "1 evaluations in flight" in _access_line(logs, r)["error_detail"]


async def test_a_corrupt_body_is_named_without_the_decoders_text():
    async with running_app() as (client, _):
        r = await client.post(
            "/v1/systemone",
            content=b"not gzip at all",
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
    assert r.status_code == 400 and r.json()["detail"]["message"] == "body is not valid gzip"
