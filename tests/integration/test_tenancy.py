"""A real `openjev serve` with named keys: one key's state is never reported as cached to
another key, while its own repeat and a key of the same cache_group find it."""

import httpx
import pytest

from tests.integration.conftest import start_server, stop_server

KEYS = """
alice:alice-key-0001
bob:bob-key-0002
carol:carol-key-0003 cache_group=team-a
dave:dave-key-0004   cache_group=team-a
"""


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenancy")
    (tmp / "keys").write_text(KEYS)
    server = start_server(tmp, "--api-keys-file", str(tmp / "keys"))
    yield server
    stop_server(server)


def _ask(server, key: str, state: str) -> tuple[int, int]:
    body = {
        "model": "jev-latest",
        "state": state,
        "questions": {"q": {"type": "noul", "instructions": "Is the text about the sea?"}},
    }
    r = httpx.post(server.url + "/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert int(r.headers["x-openjev-cached-tokens"]) == usage["x_cached_tokens"]
    return usage["x_cached_tokens"], usage["x_computed_tokens"]


def test_a_keys_state_is_cached_for_itself_and_its_group_only(tenants):
    state = "The harbour master logged every ship that entered the bay during the storm. " * 6
    cached, computed = _ask(tenants, "alice-key-0001", state)
    assert cached == 0
    bob_cached, bob_computed = _ask(tenants, "bob-key-0002", state)
    assert bob_cached == 0 and bob_computed == computed  # alice's state is news to bob
    alice_again, _ = _ask(tenants, "alice-key-0001", state)
    assert alice_again > 100  # alice's own repeat is served from her namespace
    other = "A lighthouse keeper counted the gulls on the rocks each morning. " * 6
    assert _ask(tenants, "carol-key-0003", other)[0] == 0
    assert _ask(tenants, "dave-key-0004", other)[0] > 100  # team-a shares one namespace
    # alice finds only the prompt head her own first state shared with this one, not team-a's state
    assert _ask(tenants, "alice-key-0001", other)[0] < 40
