"""Tenants by a stable id (api/identity/keys.py `KeyEntry.tenant`): what is stored per key
(tasks) follows the key itself, never its position. A key given with `--api-key` is the
tenant `key-` + a digest of its secret; a named key is its name, whatever its secret. A
key that loses its place on restart never inherits another's tasks."""

from __future__ import annotations

import hashlib

from openjev.api.identity.keys import KeyRing, parse_keys_file
from tests.api.conftest import running_app
from tests.api.test_tasks import QUESTION, auth, examples, fitted

A, B = "AAAA-secret-0000000000000001", "BBBB-secret-0000000000000002"


def test_an_unnamed_key_is_the_tenant_of_its_secret_not_of_its_position():
    first, second = KeyRing((A, B)).identify(A), KeyRing((B,)).identify(B)
    alone = KeyRing((B,)).identify(B)
    assert first is not None and second is not None and alone is not None
    assert first.tenant == "key-" + hashlib.sha256(A.encode()).hexdigest()[:16]
    assert second.name == "key1" and second.tenant == KeyRing((A, B)).identify(B).tenant  # B in either place
    assert alone.tenant != first.tenant


def test_a_named_key_is_the_tenant_of_its_name_whatever_its_secret():
    (old,) = parse_keys_file("alice:old-secret\n")
    (new,) = parse_keys_file("alice:new-secret\n")
    (renamed,) = parse_keys_file("alicia:new-secret\n")
    assert old.tenant == new.tenant == "alice"  # rotating the secret keeps the data
    assert renamed.tenant == "alicia"  # renamed: a new tenant; alice's data stays with alice


async def test_a_key_restarted_into_anothers_place_sees_none_of_its_tasks(tmp_path):
    db = {"tasks_db": str(tmp_path / "tasks.sqlite3")}
    async with running_app(api_keys=(A, B), **db) as (client, _):
        task, _ = await fitted(client, A, {"question": QUESTION, "examples": examples(12)})
        assert (await client.get("/v1/tasks", headers=auth(A))).json()["tasks"][0]["id"] == task["id"]
    async with running_app(api_keys=(B,), **db) as (client, _):  # B is now the first key, "key1"
        assert (await client.get("/v1/tasks", headers=auth(B))).json()["tasks"] == []
        assert (await client.get(f"/v1/tasks/{task['id']}", headers=auth(B))).status_code == 404
        assert (await client.delete(f"/v1/tasks/{task['id']}", headers=auth(B))).status_code == 404
    async with running_app(api_keys=(B, A), **db) as (client, _):  # A back, in another place: its task kept
        assert (await client.get(f"/v1/tasks/{task['id']}", headers=auth(A))).json()["status"] == "ready"


async def test_a_named_keys_rotated_secret_keeps_its_tasks(tmp_path):
    path, db = tmp_path / "keys", {"tasks_db": str(tmp_path / "tasks.sqlite3")}
    path.write_text("alice:old-secret\n")
    async with running_app(api_keys_file=str(path), **db) as (client, _):
        task, _ = await fitted(client, "old-secret", {"question": QUESTION, "examples": examples(12)})
    path.write_text("alice:new-secret\nbob:old-secret\n")
    async with running_app(api_keys_file=str(path), **db) as (client, _):
        assert (await client.get(f"/v1/tasks/{task['id']}", headers=auth("new-secret"))).json()["status"] == "ready"
        assert (await client.get("/v1/tasks", headers=auth("old-secret"))).json()["tasks"] == []  # bob: none
