"""--docs public|auth|off: who may read /docs, /redoc and /openapi.json. The default (auth)
is open without keys (like the API) and needs the API's key when keys are configured."""

import pytest

from tests.api.conftest import running_app

DOCS = ("/docs", "/redoc", "/openapi.json")
KEY = {"authorization": "Bearer k1"}


async def test_default_without_keys_the_docs_are_open():
    async with running_app() as (client, _):
        for path in DOCS:
            assert (await client.get(path)).status_code == 200, path


async def test_default_with_keys_the_docs_need_the_key():
    async with running_app(api_keys=("k1",)) as (client, _):
        for path in DOCS:
            r = await client.get(path)
            assert r.status_code == 401 and r.json()["detail"]["error_type"] == "authentication_error", path
            assert r.headers["www-authenticate"] == "Bearer"
            assert (await client.get(path, headers={"authorization": "Bearer wrong"})).status_code == 401
            assert (await client.get(path, headers=KEY)).status_code == 200, path
        # the docs page's assets too (the largest responses: open, anyone could hold
        # connections with them unread); the playground stays open
        assert (await client.get("/static-offline-docs/swagger-ui.css")).status_code == 401
        assert (await client.get("/static-offline-docs/swagger-ui.css", headers=KEY)).status_code == 200
        assert (await client.get("/")).status_code == 200


async def test_public_docs_are_open_with_keys():
    async with running_app(api_keys=("k1",), docs="public") as (client, _):
        for path in DOCS:
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/v1/limits")).status_code == 401  # the API itself is not


@pytest.mark.parametrize("keys", [(), ("k1",)])
async def test_off_serves_no_docs_but_the_playground_and_api(keys):
    async with running_app(api_keys=keys, docs="off") as (client, _):
        for path in DOCS:
            assert (await client.get(path, headers=KEY)).status_code == 404, path
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/playground")).status_code == 200
        assert (await client.get("/v1/limits", headers=KEY)).status_code == 200
