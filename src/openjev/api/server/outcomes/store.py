"""Decisions and their outcomes, per key, in the task store's file (api/server/task_store.py
opens and migrates it; this store has its own connection, so the recorder's writes never
wait on a task's).

Every change is one transaction. A decision id is a key's own: every read and write names
the owner, and another key's decision is as absent as an unknown one. Safe to call from any
thread (one connection behind a lock; the calls are short).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjev.api.server.task_store import TaskRecord
from openjev.core.outcomes.readings import examples_of
from openjev.core.task_fit import Example
from openjev.errors import NotFound

# A refit reads at most this many of the most recent outcomes: about 3.5 s of one core (pure Python).
OUTCOMES_PER_FIT = 500


@dataclass(frozen=True)
class QuestionReading:
    """What a decision keeps of one question: its index `n` and name in the request, the
    wording hash, the Jev question object (JSON), the binding (JSON), the option
    log-probabilities a task's fit reads, and the fit that answered it (None: the raw reading)."""

    n: int
    name: str
    wording: str
    question: str
    binding: str
    logs: tuple[float, ...]
    fit: str | None


@dataclass(frozen=True)
class DecisionRecord:
    owner: str
    id: str
    created: float
    questions: tuple[QuestionReading, ...]


@dataclass(frozen=True)
class Asked:
    """A recorded question of a key's decision, as an outcome names it."""

    decision: str
    n: int
    name: str
    wording: str
    question: dict[str, Any]
    gold: int | None


@dataclass(frozen=True)
class Outcome:
    """A question's outcome beside what answered it: the reading, the gold option's index,
    the fit that answered (None: the raw reading), when it was decided and when the outcome came."""

    decision: str
    name: str
    logs: tuple[float, ...]
    gold: int
    fit: str | None
    decided: float
    answered: float


def open_outcomes(path: Path) -> OutcomeStore:
    """The outcome tables of the task store at `path` (migrated by task_store.open_store first)."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
    conn.execute("PRAGMA foreign_keys = ON")
    return OutcomeStore(conn)


class OutcomeStore:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._bindings: dict[str, int] = {}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _binding_id(self, body: str) -> int:
        """The binding's row id (inserted once; called inside a transaction)."""
        found = self._bindings.get(body)
        if found is None:
            self._conn.execute("INSERT OR IGNORE INTO bindings (body) VALUES (?)", (body,))
            found = self._conn.execute("SELECT id FROM bindings WHERE body = ?", (body,)).fetchone()[0]
            self._bindings[body] = found
        return found

    def write(self, records: Sequence[DecisionRecord]) -> int:
        """Every record in one transaction; the number of decisions stored (a key's decision id
        recorded already keeps its first decision: the later one is not stored)."""
        stored = 0
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for record in records:
                    stored += self._insert(record)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return stored

    def _insert(self, record: DecisionRecord) -> int:
        c = self._conn
        if not c.execute(
            "INSERT OR IGNORE INTO decisions (owner, id, created) VALUES (?, ?, ?)",
            (record.owner, record.id, record.created),
        ).rowcount:
            return 0
        for q in record.questions:
            c.execute(
                "INSERT OR IGNORE INTO questions (owner, wording, body) VALUES (?, ?, ?)",
                (record.owner, q.wording, q.question),
            )
            c.execute(
                "INSERT INTO readings (owner, decision, n, name, wording, binding, logs, fit) VALUES (?,?,?,?,?,?,?,?)",
                (record.owner, record.id, q.n, q.name, q.wording, self._binding_id(q.binding), _dump(q.logs), q.fit),
            )
        return 1

    def prune(self, owners: Iterable[str], per_key: int, older_than: float) -> int:
        """Decisions created before `older_than`, and each of `owners`' oldest beyond `per_key`,
        deleted with their readings and outcomes; how many decisions went."""
        with self._lock:
            gone = self._conn.execute("DELETE FROM decisions WHERE created < ?", (older_than,)).rowcount
            for owner in owners:
                count = self._conn.execute("SELECT count(*) FROM decisions WHERE owner = ?", (owner,)).fetchone()[0]
                if count > per_key:
                    gone += self._conn.execute(
                        "DELETE FROM decisions WHERE rowid IN (SELECT rowid FROM decisions WHERE owner = ?"
                        " ORDER BY created, rowid LIMIT ?)",
                        (owner, count - per_key),
                    ).rowcount
        return gone

    def count(self, owner: str) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM decisions WHERE owner = ?", (owner,)).fetchone()[0])

    def asked(self, owner: str, decision: str, question: str | int) -> Asked | None:
        """The owner's decision's question by name (a string) or index (an integer); None if
        the owner has no such decision (another key's included) or it has no such question."""
        column = "n" if isinstance(question, int) else "name"
        with self._lock:
            row = self._conn.execute(
                "SELECT r.n, r.name, r.wording, q.body, r.gold FROM readings r JOIN questions q"
                f" ON q.owner = r.owner AND q.wording = r.wording WHERE r.owner = ? AND r.decision = ? AND r.{column} = ?",
                (owner, decision, question),
            ).fetchone()
        if row is None:
            return None
        return Asked(decision, row[0], row[1], row[2], json.loads(row[3]), row[4])

    def answer(self, owner: str, outcomes: Sequence[tuple[str, int, int]], now: float) -> list[str]:
        """Each (decision, question index, gold) set in one transaction; per item "new",
        "same" (nothing changed) or "changed" (the latest answer replaces the earlier one).
        NotFound, with nothing changed, where a decision went (pruned) since it was looked up."""
        out = []
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for decision, n, gold in outcomes:
                    row = self._conn.execute(
                        "SELECT gold FROM readings WHERE owner = ? AND decision = ? AND n = ?", (owner, decision, n)
                    ).fetchone()
                    if row is None:
                        raise NotFound(f"this key has no decision {decision!r} (unknown, or past its retention)")
                    if row[0] == gold:
                        out.append("same")
                        continue
                    out.append("new" if row[0] is None else "changed")
                    self._conn.execute(
                        "UPDATE readings SET gold = ?, answered = ? WHERE owner = ? AND decision = ? AND n = ?",
                        (gold, now, owner, decision, n),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return out

    def outcomes(self, owner: str, wording: str, binding: str | None = None, limit: int = 0) -> list[Outcome]:
        """The owner's outcomes of the question with this wording, in the order they were
        decided (as recorded) (the last `limit` where it is positive), each with the fit that answered it;
        only those read under `binding` where it is given. What a drift monitor reads."""
        sql = (
            "SELECT r.decision, r.name, r.logs, r.gold, r.fit, d.created, r.answered FROM readings r"
            " JOIN decisions d ON d.owner = r.owner AND d.id = r.decision"
            " JOIN bindings b ON b.id = r.binding WHERE r.owner = ? AND r.wording = ? AND r.gold IS NOT NULL"
        )
        args: list[Any] = [owner, wording]
        if binding is not None:
            sql += " AND b.body = ?"
            args.append(binding)
        sql += " ORDER BY r.rowid DESC"  # written in the order decided (one writer)
        if limit > 0:
            sql += " LIMIT ?"
            args.append(limit)
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        return [Outcome(r[0], r[1], tuple(json.loads(r[2])), r[3], r[4], r[5], r[6]) for r in reversed(rows)]

    def counts(self, owner: str, wording: str, since: float | None) -> tuple[int, int, float | None]:
        """(outcomes in all, outcomes answered after `since`, the latest answer's time)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT count(*), sum(answered > ?), max(answered) FROM readings"
                " WHERE owner = ? AND wording = ? AND gold IS NOT NULL",
                (since if since is not None else -1.0, owner, wording),
            ).fetchone()
        return int(row[0]), int(row[1] or 0), row[2]

    def fit_rows(
        self, record: TaskRecord, binding: str, examples: Sequence[Example]
    ) -> tuple[list[Example], float | None]:
        """The task's `examples` (as the engine just read them) kept for later refits, and its
        question's outcomes read under `binding` (the most recent OUTCOMES_PER_FIT) to fit
        beside them, with the latest of their answers' times (None: none)."""
        self.keep_examples(record.id, record.generation, binding, [(e.logs, e.gold) for e in examples])
        rows = self.outcomes(record.owner, record.wording, binding, OUTCOMES_PER_FIT)
        until = max((o.answered for o in rows), default=None)
        return examples_of(((o.logs, o.gold) for o in rows), OUTCOMES_PER_FIT), until

    def keep_examples(
        self, task_id: str, generation: int, binding: str, rows: Sequence[tuple[Sequence[float], int]]
    ) -> None:
        """A task's examples as read for its fit (its generation and binding), replacing any before."""
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO example_readings (task_id, generation, binding, rows)"
                " SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM tasks WHERE id = ? AND generation = ?)",
                (task_id, generation, binding, _dump([[list(logs), gold] for logs, gold in rows]), task_id, generation),
            )

    def examples(self, task_id: str, generation: int, binding: str) -> list[tuple[list[float], int]] | None:
        """The task's examples as read for this generation and binding; None where they were not."""
        with self._lock:
            row = self._conn.execute(
                "SELECT rows FROM example_readings WHERE task_id = ? AND generation = ? AND binding = ?",
                (task_id, generation, binding),
            ).fetchone()
        return [(logs, gold) for logs, gold in json.loads(row[0])] if row is not None else None


def binding_text(bound: dict[str, Any]) -> str:
    """A binding as stored and compared: canonical JSON."""
    return json.dumps(bound, sort_keys=True, separators=(",", ":"))


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))
