"""The task store (api/server/task_store.py) on real SQLite files: per owner, durable across
reopening, migrations versioned, a foreign or damaged file refused and never reset, a fit
written only for the examples it was fitted on."""

import sqlite3

import pytest

from openjev.api.server.task_schema import APPLICATION_ID, MIGRATIONS
from openjev.api.server.task_store import open_store
from openjev.errors import ConfigError

QUESTION = {"type": "noul", "instructions": "Is a refund asked?"}
EXAMPLES = [{"state": f"text {i}", "answer": i % 2 == 0} for i in range(12)]


def test_a_task_survives_reopening_and_belongs_to_its_owner(tmp_path):
    path = tmp_path / "tasks.sqlite3"
    store = open_store(path)
    task = store.create("alice", QUESTION, "w1", EXAMPLES, 0.9)
    assert (task.status, task.examples, task.generation) == ("queued", 12, 0)
    store.close()
    again = open_store(path)
    assert again.get("alice", task.id) == task
    assert again.get("bob", task.id) is None
    assert again.page("bob", 10) == ([], False)
    assert [t.id for t in again.page("alice", 10)[0]] == [task.id]
    assert again.examples(task.id) == EXAMPLES
    assert not again.delete("bob", task.id)
    assert again.add_examples("bob", task.id, EXAMPLES[:1]) is None
    assert again.get("alice", task.id).examples == 12
    assert again.delete("alice", task.id)
    assert again.get("alice", task.id) is None
    assert again.examples(task.id) == []  # its examples went with it


def test_the_file_carries_its_id_and_schema_version(tmp_path):
    path = tmp_path / "t.sqlite3"
    open_store(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_fit_is_kept_only_for_the_examples_it_read(tmp_path):
    store = open_store(tmp_path / "t.sqlite3")
    task = store.create("alice", QUESTION, "w1", EXAMPLES, 0.9)
    assert store.progress(task.id, task.generation, "fitting", 0, 12)
    more = store.add_examples("alice", task.id, EXAMPLES[:3])
    assert (more.examples, more.generation, more.status) == (15, 1, "queued")
    assert not store.finish(task.id, task.generation, {"temperature": 2.0})  # fitted on the 12: dropped
    assert store.get("alice", task.id).fit is None
    assert store.finish(task.id, more.generation, {"temperature": 2.0})
    done = store.get("alice", task.id)
    assert (done.status, done.fit) == ("ready", {"temperature": 2.0})
    assert store.by_wording("alice", "w1").id == task.id
    assert store.by_wording("bob", "w1") is None
    store.delete("alice", task.id)
    assert not store.finish(task.id, more.generation, {"temperature": 3.0})  # deleted while fitting: nothing
    assert not store.progress(task.id, more.generation, "fitting", 1, 15)


def test_unfinished_jobs_are_found_at_start(tmp_path):
    store = open_store(tmp_path / "t.sqlite3")
    a = store.create("alice", QUESTION, "w1", EXAMPLES, 0.9)
    b = store.create("alice", QUESTION, "w2", EXAMPLES, 0.9)
    store.finish(b.id, b.generation, {"x": 1})
    assert [t.id for t in store.unfinished()] == [a.id]


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "t.sqlite3"
    path.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(ConfigError, match="not an SQLite database"):
        open_store(path)
    assert path.read_bytes() == b"not a database at all, " * 100


def test_another_programs_database_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "t.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="another program"):
        open_store(path)
    assert path.read_bytes() == before


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "t.sqlite3"
    open_store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        open_store(path)


def test_a_damaged_file_is_refused(tmp_path):
    path = tmp_path / "t.sqlite3"
    store = open_store(path)
    for i in range(50):
        store.create("alice", QUESTION, f"w{i}", EXAMPLES, 0.9)
    store.close()
    data = bytearray(path.read_bytes())
    data[4096 : 4096 + 512] = b"\xff" * 512  # a page's header and cells overwritten
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"damaged|not an SQLite"):
        open_store(path)
