"""GET /v1/limits shows the calling key's own limits (its keys-file options, else the
server's defaults it is held to), beside the server's (issue 28, item 9)."""

from __future__ import annotations

import pytest

from tests.api.conftest import running_app


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.usefixtures("limits_store")
async def test_each_key_sees_its_own_limits(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice:alice-key requests_per_min=7 tokens_per_min=900 weight=3\nbob:bob-key\n")
    settings = {"api_keys_file": str(keys), "key_requests_per_min": 100, "key_tokens_per_min": 50_000}
    async with running_app(**settings) as (client, _):
        alice = (await client.get("/v1/limits", headers=_auth("alice-key"))).json()
        bob = (await client.get("/v1/limits", headers=_auth("bob-key"))).json()
    assert (alice["key"], alice["key_requests_per_min"], alice["key_tokens_per_min"]) == ("alice", 7, 900)
    assert (bob["key"], bob["key_requests_per_min"], bob["key_tokens_per_min"]) == ("bob", 100, 50_000)
    assert (alice["key_weight"], bob["key_weight"]) == (3, 1)  # its share of the engine (default 1)
    assert alice["max_questions"] == bob["max_questions"]  # the server's own limits, the same for all


@pytest.mark.usefixtures("limits_store")
async def test_without_keys_the_defaults_are_shown():
    async with running_app(key_requests_per_min=30) as (client, _):
        limits = (await client.get("/v1/limits")).json()
    assert limits["key_requests_per_min"] == 30 and limits["key_weight"] == 1 and "key" not in limits
