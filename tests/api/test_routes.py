"""The /v1/systemone aliases and the playground page, over the fake engine."""

import pytest

from openjev.api.server.app import SYSTEMONE_ROUTES
from tests.api.conftest import running_app
from tests.api.test_systemone import VALID


@pytest.mark.parametrize("path", SYSTEMONE_ROUTES[1:])
async def test_aliases_answer_exactly_like_systemone(api, path):
    client, _ = api
    want = await client.post("/v1/systemone", json=VALID)
    got = await client.post(path, json=VALID)
    assert got.status_code == 200 and got.json() == want.json()
    for header in ("x-openjev-prefix-tokens", "server-timing"):
        assert header in got.headers
    bad = {**VALID, "questions": {}}
    assert (await client.post(path, json=bad)).json() == (await client.post("/v1/systemone", json=bad)).json()
    assert (await client.get(path)).status_code == 405


@pytest.mark.parametrize("path", SYSTEMONE_ROUTES)
async def test_every_route_needs_the_key_when_auth_is_on(path):
    async with running_app(api_keys=("k1",)) as (client, _):
        r = await client.post(path, json=VALID)
        assert r.status_code == 401 and r.json()["detail"]["error_type"] == "authentication_error"
        assert (await client.post(path, json=VALID, headers={"Authorization": "Bearer k1"})).status_code == 200


async def test_openapi_documents_each_route(api):
    client, _ = api
    paths = (await client.get("/openapi.json")).json()["paths"]
    for path in (*SYSTEMONE_ROUTES, "/v1/systemone/batch"):
        assert "post" in paths[path]
    assert "/" not in paths and "/playground" not in paths


@pytest.mark.parametrize("path", ["/", "/playground"])
async def test_playground_page_is_self_contained(api, path):
    client, _ = api
    r = await client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    # it posts to this server's own routes, one per wire format (the format switch picks one)
    assert "openjev playground" in page and "fetch(FORMATS[format()].path" in page
    assert 'path: "/v1/systemone"' in page and 'path: "/v1/decisions"' in page
    # nothing from elsewhere: no external scripts, styles, fonts or images
    for marker in ("http://", "https://", "//cdn", 'src="http'):
        assert marker not in page.replace("location.origin", ""), marker
