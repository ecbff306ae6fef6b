"""Transport concerns: auth, body limits and encodings, health while loading, docs."""

import asyncio
import gc
import gzip
import json
import threading

import zstandard

from tests.api.conftest import healthy, running_app
from tests.api.test_systemone import VALID


async def test_keys_configured_missing_and_wrong_are_401_with_challenge():
    async with running_app(api_keys=("k1", "k2")) as (client, engine):
        missing = await client.post("/v1/systemone", json=VALID)
        wrong = await client.post("/v1/systemone", json=VALID, headers={"Authorization": "Bearer nope"})
        for r in (missing, wrong):
            assert r.status_code == 401
            assert r.json()["detail"]["error_type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.headers["x-typesafe-request-id"]
        assert engine.plans == []
        ok = await client.post("/v1/systemone", json=VALID, headers={"Authorization": "Bearer k2"})
        assert ok.status_code == 200
        # health stays open; the /v1 reads do not
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/health/live")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401


async def test_no_keys_configured_bearer_is_ignored(api):
    client, _ = api
    r = await client.post("/v1/systemone", json=VALID, headers={"Authorization": "Bearer anything"})
    assert r.status_code == 200


async def test_body_over_limit_is_413_before_parsing():
    async with running_app(max_body_bytes=512) as (client, engine):
        big = {**VALID, "state": "x" * 600}
        r = await client.post("/v1/systemone", json=big)
        assert r.status_code == 413
        assert r.json()["detail"]["error_type"] == "payload_too_large"
        assert r.headers["x-typesafe-request-id"]

        async def chunks():  # chunked: no Content-Length to trust
            for _ in range(10):
                yield b"x" * 100

        r = await client.post("/v1/systemone", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert engine.plans == []


async def test_gzip_and_zstd_bodies_are_decoded(api):
    client, _ = api
    raw = json.dumps(VALID).encode()
    for encoding, data in (("gzip", gzip.compress(raw)), ("zstd", zstandard.ZstdCompressor().compress(raw))):
        r = await client.post(
            "/v1/systemone", content=data, headers={"content-type": "application/json", "content-encoding": encoding}
        )
        assert r.status_code == 200, (encoding, r.text)


async def test_decoded_size_is_limited_too():
    async with running_app(max_body_bytes=4096) as (client, engine):
        bomb = json.dumps({**VALID, "state": "a" * 100_000}).encode()
        for encoding, data in (("gzip", gzip.compress(bomb)), ("zstd", zstandard.ZstdCompressor().compress(bomb))):
            assert len(data) < 4096
            r = await client.post(
                "/v1/systemone",
                content=data,
                headers={"content-type": "application/json", "content-encoding": encoding},
            )
            assert r.status_code == 413, encoding
        assert engine.plans == []


async def test_bad_encodings_are_4xx(api):
    client, _ = api
    r = await client.post(
        "/v1/systemone",
        content=b"not gzip at all",
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert r.status_code == 400 and r.json()["detail"]["error_type"] == "invalid_request"
    r = await client.post(
        "/v1/systemone", content=b"{}", headers={"content-type": "application/json", "content-encoding": "br"}
    )
    assert r.status_code == 415


async def test_health_is_503_while_loading_and_live_answers():
    gate = threading.Event()
    async with running_app(gate=gate, wait=False) as (client, _):
        r = await client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert (await client.get("/health/live")).status_code == 200
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 503 and r.headers["retry-after"]
        gate.set()
        await healthy(client)
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200


async def test_load_failure_is_reported_and_fatal():
    fatal = []
    async with running_app(fail=RuntimeError("weights are corrupt"), on_fatal=fatal.append, wait=False) as (client, _):
        for _ in range(200):
            if fatal:
                break
            await asyncio.sleep(0.01)
        r = await client.get("/health")
        # The kind of failure, never the exception's text (it may name paths and URLs).
        assert r.status_code == 503 and r.json()["error"].startswith("the model failed to load")
        assert "weights are corrupt" not in r.text
        r = await client.post("/v1/systemone", json=VALID)
        assert r.status_code == 503 and "weights are corrupt" not in r.text
    assert isinstance(fatal[0], RuntimeError)


async def test_the_loaded_hook_runs_once_before_the_first_decision():
    """`on_loaded` (the CLI's settle_heap) runs once the service is built, before the
    service answers: a request meanwhile gets the same 503 as during the load."""
    calls, entered, release = [], threading.Event(), threading.Event()

    def hook():
        calls.append(threading.current_thread() is threading.main_thread())
        entered.set()
        release.wait(10)

    async with running_app(on_loaded=hook, wait=False) as (client, _):
        await asyncio.to_thread(entered.wait, 10)
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 503
        release.set()
        await healthy(client)
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200
    assert calls == [False]  # once, off the event loop's thread


def test_settle_heap_freezes_what_is_alive():
    from openjev.cli import settle_heap

    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


async def test_models_limits_and_request_ids(api):
    client, _ = api
    models = (await client.get("/v1/models")).json()
    (model,) = models["models"]
    assert {k: model[k] for k in ("name", "description", "release_date")} == {
        "name": "fake-model-1",
        "description": "a fake",
        "release_date": "2026-01-01",
    }
    assert all(k.startswith("x_") for k in model if k not in ("name", "description", "release_date"))
    limits = (await client.get("/v1/limits")).json()
    assert limits["max_questions"] == 64 and limits["max_choice_options"] == 255
    a, b = (await client.get("/health/live")), (await client.get("/health/live"))
    assert a.headers["x-typesafe-request-id"] != b.headers["x-typesafe-request-id"]
    r = await client.get("/no/such/route")
    assert r.status_code == 404 and r.json()["detail"]["error_type"] == "not_found"


async def test_openapi_and_docs_are_served_without_a_cdn(api):
    client, _ = api
    spec = (await client.get("/openapi.json")).json()
    assert "/v1/systemone" in spec["paths"]
    docs = await client.get("/docs")
    assert docs.status_code == 200
    assert "cdn" not in docs.text.lower() and "https://" not in docs.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        url = next(part.split('"')[0] for part in docs.text.split('"') if part.endswith(asset))
        assert (await client.get(url)).status_code == 200
