"""Cache namespaces at the API edge: each key its own, a cache_group's keys one, none
without keys; the namespace reaches the engine on the Plan (single and batch)."""

import pytest

from openjev.api.identity.keys import KeyRing, parse_keys_file
from openjev.core.types import Share
from openjev.errors import ConfigError
from tests.api.conftest import running_app
from tests.api.test_systemone import VALID

KEYS = """
alice:alice-key
bob:bob-key
carol:carol-key cache_group=team-a
dave:dave-key   cache_group=team-a requests_per_min=100 weight=2
"""


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


def test_keys_file_cache_group_option():
    entries = {e.name: e for e in parse_keys_file(KEYS)}
    assert entries["alice"].cache_group is None
    assert entries["carol"].cache_group == entries["dave"].cache_group == "team-a"
    assert entries["dave"].requests_per_min == 100
    assert (entries["dave"].weight, entries["alice"].weight) == (2, 1)
    bad_lines = ("a:k cache_group=", "a:k cache_group=bad/name", "a:k cache_groups=x", "a:k weight=0", "a:k weight=x")
    for bad in (*bad_lines, "a:k weight=1001"):
        with pytest.raises(ConfigError):
            parse_keys_file(bad)


def test_each_key_its_own_namespace_and_a_group_one(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    ring = KeyRing(("flag-key",), str(path))
    ns = {name: ring.identify(f"{name}-key").cache_namespace for name in ("alice", "bob", "carol", "dave", "flag")}
    assert ns["carol"] == ns["dave"]
    assert len({ns["alice"], ns["bob"], ns["carol"], ns["flag"]}) == 4
    for name, salt in ns.items():
        assert len(salt) == 43 and name not in salt  # an HMAC, not the name
    # the same keys give the same namespaces (replicas of one deployment agree)
    again = KeyRing(("flag-key",), str(path))
    assert again.identify("alice-key").cache_namespace == ns["alice"]


async def test_the_namespace_reaches_the_engine_on_the_plan(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    async with running_app(api_keys_file=str(path)) as (client, engine):
        for name in ("alice", "bob", "carol", "dave"):
            r = await client.post("/v1/systemone", json=VALID, headers=_auth(f"{name}-key"))
            assert r.status_code == 200
        r = await client.post(
            "/v1/systemone/batch",
            json={"requests": [VALID, VALID]},
            headers={**_auth("alice-key"), "Accept": "application/json"},
        )
        assert r.status_code == 200
    alice, bob, carol, dave, *batch = (p.cache_namespace for p in engine.plans)
    assert alice and bob and alice != bob and carol == dave != alice
    assert batch == [alice, alice]  # a batch's items share the cache within its key's namespace


async def test_without_keys_every_request_shares_the_one_namespace():
    async with running_app() as (client, engine):
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200
    assert engine.plans[0].cache_namespace == ""


async def test_a_batch_over_many_states_is_served_from_its_keys_share(tmp_path):
    path = tmp_path / "keys"
    path.write_text(KEYS)
    body = {"questions": VALID["questions"], "states": ["7 7", "7 7 7"]}
    async with running_app(api_keys_file=str(path)) as (client, engine):
        r = await client.post(
            "/v1/systemone/batch", json=body, headers={**_auth("carol-key"), "Accept": "application/json"}
        )
        assert r.status_code == 200
    assert [p.share.tenant for p in engine.plans] == ["carol", "carol"]  # its key, not its cache_group
    async with running_app(api_keys_file=str(path)) as (client, engine):
        assert (await client.post("/v1/systemone", json=VALID, headers=_auth("dave-key"))).status_code == 200
    assert engine.plans[0].share == Share("dave", 2)  # the keys file's weight=2
