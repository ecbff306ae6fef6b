"""The outcome store and recorder with a real SQLite file: retention per key and by age,
another key's decisions absent, all-or-nothing answers, a full queue dropping (counted)
rather than blocking, and what 100,000 kept decisions cost."""

from __future__ import annotations

import threading
import time

import pytest

from openjev.api.server.outcomes.recorder import Decided, Recorder, Retention
from openjev.api.server.outcomes.store import DecisionRecord, QuestionReading, open_outcomes
from openjev.api.server.task_store import open_store
from openjev.core.types import DecisionResult, Usage
from openjev.errors import NotFound

QUESTION = '{"type":"noul","instructions":"Is it seven?"}'


def record(owner, rid, created, gold_logs=(-0.1, -2.3)):
    q = QuestionReading(0, "q", "w" * 32, QUESTION, '{"readout":"letters"}', gold_logs, "task:x")
    return DecisionRecord(owner, rid, created, (q,))


@pytest.fixture
def stores(tmp_path):
    path = tmp_path / "tasks.sqlite3"
    tasks = open_store(path)
    outcomes = open_outcomes(path)
    yield tasks, outcomes
    outcomes.close()
    tasks.close()


def test_decisions_are_a_keys_own_and_answers_all_or_nothing(stores):
    _, store = stores
    assert store.write([record("alice", "d1", 1.0), record("alice", "d2", 2.0), record("bob", "d3", 3.0)]) == 3
    assert store.write([record("alice", "d1", 9.0)]) == 0  # an id kept already keeps its first decision
    assert store.asked("bob", "d1", "q") is None and store.asked("alice", "d1", "q") is not None
    assert store.asked("alice", "d1", 0).name == "q" and store.asked("alice", "d1", 1) is None
    with pytest.raises(NotFound):
        store.answer("alice", [("d1", 0, 1), ("d3", 0, 1)], 10.0)  # bob's: the whole call refused
    assert store.outcomes("alice", "w" * 32) == []
    assert store.answer("alice", [("d2", 0, 0), ("d1", 0, 1)], 10.0) == ["new", "new"]
    assert store.answer("alice", [("d1", 0, 1), ("d2", 0, 1)], 11.0) == ["same", "changed"]
    kept = store.outcomes("alice", "w" * 32)
    assert [(o.decision, o.gold, o.fit) for o in kept] == [("d1", 1, "task:x"), ("d2", 1, "task:x")]  # decided order
    assert store.counts("alice", "w" * 32, 10.5) == (2, 1, 11.0)


def test_retention_holds_per_key_and_by_age(stores):
    _, store = stores
    now = time.time()
    store.write([record("alice", f"a{i}", now - 100 + i) for i in range(50)])
    store.write([record("bob", f"b{i}", now - 100 + i) for i in range(5)])
    store.write([record("bob", "old", now - 10_000)])
    assert store.prune(["alice"], 20, now - 1000) == 30 + 1
    assert store.count("alice") == 20 and store.count("bob") == 5
    assert store.asked("alice", "a29", "q") is None and store.asked("alice", "a30", "q") is not None


class _Runtime:
    service = None
    loaded = None


class _BlockedStore:
    """A store whose writes wait on `gate` (a disk that stalls)."""

    def __init__(self):
        self.gate = threading.Event()
        self.written = 0

    def write(self, records):
        self.gate.wait(10)
        self.written += len(records)
        return len(records)

    def count(self, owner):
        return 0

    def prune(self, owners, per_key, older_than):
        return 0


def test_a_full_queue_drops_and_counts_and_never_blocks(monkeypatch):
    store = _BlockedStore()
    recorder = Recorder(store, Retention(10, 60.0), _Runtime(), 1.0, queue_size=4)  # type: ignore[arg-type]
    monkeypatch.setattr(recorder, "record_of", lambda item: record(item.owner, item.id, item.created))
    recorder.start()
    result = DecisionResult(answers=(), usage=Usage(1, 1, None, None), prefix_tokens=0)
    t0 = time.perf_counter()
    for i in range(50):
        recorder.decided(Decided("alice", f"d{i}", 0.0, (), result, None))
    assert time.perf_counter() - t0 < 0.5  # never waited on the stalled store
    assert recorder.dropped._value.get() >= 50 - 4 - 1  # the queue's 4, and one the writer holds
    store.gate.set()
    assert recorder.flush(5.0)
    assert store.written + recorder.dropped._value.get() == 50
    recorder.close()
