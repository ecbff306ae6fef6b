"""The task store: `/v1/tasks` per API key, in one SQLite file (the standard `sqlite3`).

The file carries openjev's application id and its schema version (`PRAGMA application_id`,
`user_version`); `open_store` migrates an older version forward, one numbered step at a
time, each in its own transaction. A file that is not an SQLite database, fails its integrity
check, carries another program's id, or a version newer than this openjev knows is a
ConfigError at start (the CLI exits 2): it is never reset or written over.

Every change is one transaction, so a reader sees a task whole or not at all: a fit is saved
only if its task still exists with the examples it was fitted on (`generation`), so a task
deleted or given more examples while its fit ran keeps nothing of that fit. Safe to call
from any thread (one connection behind a lock); the server awaits each with `call`, on the
store's own thread (api/server/task_thread.py).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjev.api.server.task_bounds import PRICED, Check, examples_cap, queue_cap
from openjev.api.server.task_schema import APPLICATION_ID, MIGRATIONS
from openjev.api.server.task_thread import StoreThread
from openjev.errors import ConfigError

STATUSES = ("collecting", "queued", "fitting", "ready", "failed")  # collecting: fed by outcomes, too few to fit


@dataclass(frozen=True)
class TaskRecord:
    """One task as stored. `question`: the Jev question object; `wording`: the hash of its
    instructions and options (api/server/task_binding.py); `fit`: the fitted document once
    ready; `generation`: bumped by every change of its examples."""

    id: str
    owner: str
    question: dict[str, Any]
    wording: str
    caller_id: str | None
    target_precision: float
    status: str
    done: int
    total: int
    started: float | None
    generation: int
    fit: dict[str, Any] | None
    error: str | None
    created: float
    examples: int
    outcomes: int = 0  # outcomes posted for decisions that asked its question (api/server/outcomes/)


def new_id() -> str:
    return "task_" + secrets.token_hex(12)


def open_store(path: Path) -> TaskStore:
    """The store at `path`, created or migrated; ConfigError for a file that is not one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        conn.execute("PRAGMA foreign_keys = ON")
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError as e:
        raise ConfigError(f"task store {path}: not an SQLite database or damaged ({e}); move it away") from None
    if check != "ok":
        conn.close()
        raise ConfigError(f"task store {path}: damaged ({check}); move it away to start with an empty store")
    if app_id != APPLICATION_ID and (app_id != 0 or tables):
        conn.close()
        raise ConfigError(f"task store {path}: an SQLite file of another program, not openjev's task store")
    if version > len(MIGRATIONS):
        conn.close()
        raise ConfigError(f"task store {path}: schema version {version} is newer than this openjev knows")
    for step in range(version, len(MIGRATIONS)):
        conn.executescript(
            f"BEGIN; {MIGRATIONS[step]}; PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {step + 1};"
            " COMMIT;"
        )
    return TaskStore(conn)


_COLUMNS = "id, owner, question, wording, caller_id, target_precision, status, done, total, started, generation, fit"
_SELECT = (
    f"SELECT {_COLUMNS}, error, created, (SELECT count(*) FROM examples WHERE task_id = tasks.id),"
    " (SELECT count(*) FROM readings r WHERE r.owner = tasks.owner AND r.wording = tasks.wording"
    " AND r.gold IS NOT NULL) FROM tasks"
)


def _record(row: Sequence[Any]) -> TaskRecord:
    return TaskRecord(
        id=row[0],
        owner=row[1],
        question=json.loads(row[2]),
        wording=row[3],
        caller_id=row[4],
        target_precision=row[5],
        status=row[6],
        done=row[7],
        total=row[8],
        started=row[9],
        generation=row[10],
        fit=json.loads(row[11]) if row[11] else None,
        error=row[12],
        created=row[13],
        examples=row[14],
        outcomes=row[15],
    )


class TaskStore:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._thread = StoreThread()
        self.call = self._thread.call  # await store.call(store.get, ...): on the store's own thread

    def close(self) -> None:
        self._thread.close()
        with self._lock:
            self._conn.close()

    def check(self, check: Check) -> None:
        """`check` alone (api/server/task_bounds.py): a look before any work is spent."""
        with self._lock:
            check(self._conn)

    def _write(self, *statements: tuple[str, Sequence[Any]], check: Check | None = None) -> int:
        """Run `statements` in one transaction, after `check` (it may refuse); the last one's rowcount."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                if check is not None:
                    check(self._conn)
                changed = 0
                for sql, args in statements:
                    changed = self._conn.execute(sql, args).rowcount
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return changed

    def _read(self, sql: str, args: Sequence[Any]) -> list[TaskRecord]:
        with self._lock:
            return [_record(r) for r in self._conn.execute(sql, args).fetchall()]

    def create(
        self,
        owner: str,
        question: dict[str, Any],
        wording: str,
        examples: Sequence[dict[str, Any]],
        target_precision: float,
        caller_id: str | None = None,
        max_queued: int = 0,
        status: str = "queued",
    ) -> TaskRecord:
        """A new task, queued, within the owner's `max_queued` (task_bounds.queue_cap)."""
        task_id, now = new_id(), time.time()
        self._write(
            (
                "INSERT INTO tasks (id, owner, question, wording, caller_id, target_precision, status, created, updated)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (task_id, owner, json.dumps(question), wording, caller_id, target_precision, status, now, now),
            ),
            *self._inserts(task_id, owner, examples),
            check=queue_cap(owner, max_queued),
        )
        found = self.get(owner, task_id)
        if found is None:  # only a concurrent delete, between the insert and this read
            raise ConfigError(f"task {task_id} vanished as it was created")
        return found

    @staticmethod
    def _inserts(task_id: str, owner: str, examples: Sequence[dict[str, Any]]) -> list[tuple[str, Sequence[Any]]]:
        """Each example after the task's last one, numbered inside the transaction, where the task is the owner's."""
        sql = (
            "INSERT INTO examples (task_id, n, body) "
            "SELECT ?, (SELECT coalesce(max(n) + 1, 0) FROM examples WHERE task_id = ?), ? "
            "WHERE EXISTS (SELECT 1 FROM tasks WHERE id = ? AND owner = ?)"
        )
        return [(sql, (task_id, task_id, json.dumps(e), task_id, owner)) for e in examples]

    def add_examples(
        self, owner: str, task_id: str, examples: Sequence[dict[str, Any]], cap: int = 0, max_queued: int = 0
    ) -> TaskRecord | None:
        """Append examples, within `cap` and `max_queued` (task_bounds.examples_cap); the task
        goes back to `queued` (its fit is redone). None if it is not the owner's."""
        changed = self._write(
            *self._inserts(task_id, owner, examples),
            (
                "UPDATE tasks SET status = 'queued', done = 0, total = 0, started = NULL, generation = generation + 1,"
                " error = NULL, updated = ? WHERE id = ? AND owner = ?",
                (time.time(), task_id, owner),
            ),
            check=examples_cap(owner, task_id, len(examples), cap, max_queued),
        )
        return self.get(owner, task_id) if changed else None

    def get(self, owner: str, task_id: str) -> TaskRecord | None:
        found = self._read(_SELECT + " WHERE id = ? AND owner = ?", (task_id, owner))
        return found[0] if found else None

    def page(self, owner: str, limit: int, after: tuple[float, str] = (-1.0, "")) -> tuple[list[TaskRecord], bool]:
        """Up to `limit` of the owner's tasks by creation, after `after` (created, id); whether more follow."""
        sql = _SELECT + " WHERE owner = ? AND (created, id) > (?, ?) ORDER BY created, id LIMIT ?"
        found = self._read(sql, (owner, *after, limit + 1))
        return found[:limit], len(found) > limit

    def priced_tokens(self, task_id: str) -> int:
        """The distinct tokens its stored examples were priced at (task_bounds.PRICED)."""
        with self._lock:
            return int(self._conn.execute(PRICED, (task_id,)).fetchone()[0])

    def by_wording(self, owner: str, wording: str) -> TaskRecord | None:
        """The owner's most recent ready task for this wording, if any."""
        found = self._read(
            _SELECT + " WHERE owner = ? AND wording = ? AND status = 'ready' ORDER BY created DESC LIMIT 1",
            (owner, wording),
        )
        return found[0] if found else None

    def latest(self, owner: str, wording: str) -> TaskRecord | None:
        """The owner's most recent task for this wording, whatever its status."""
        found = self._read(_SELECT + " WHERE owner = ? AND wording = ? ORDER BY created DESC LIMIT 1", (owner, wording))
        return found[0] if found else None

    def examples(self, task_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT body FROM examples WHERE task_id = ? ORDER BY n", (task_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def delete(self, owner: str, task_id: str) -> bool:
        """The task and its examples, in one transaction; False if it is not the owner's."""
        return bool(self._write(("DELETE FROM tasks WHERE id = ? AND owner = ?", (task_id, owner))))

    def progress(self, task_id: str, generation: int, status: str, done: int, total: int) -> bool:
        """The job's state, where the task still has the examples it reads; False if it has not."""
        started = time.time() if status == "fitting" and done == 0 else None
        return bool(
            self._write(
                (
                    "UPDATE tasks SET status = ?, done = ?, total = ?, started = coalesce(?, started), updated = ?"
                    " WHERE id = ? AND generation = ?",
                    (status, done, total, started, time.time(), task_id, generation),
                )
            )
        )

    def finish(self, task_id: str, generation: int, fit: dict[str, Any] | None, error: str | None = None) -> bool:
        """The job's outcome (`fit`: ready; else failed with `error`), written whole only where
        the task still has the examples it was fitted on."""
        status = "ready" if fit is not None else "failed"
        return bool(
            self._write(
                (
                    "UPDATE tasks SET status = ?, fit = ?, error = ?, updated = ? WHERE id = ? AND generation = ?",
                    (status, json.dumps(fit) if fit is not None else None, error, time.time(), task_id, generation),
                )
            )
        )

    def ready(self) -> list[TaskRecord]:
        """Every owner's fitted tasks, oldest first."""
        return self._read(_SELECT + " WHERE status = 'ready' ORDER BY created", ())

    def unfinished(self) -> list[TaskRecord]:
        """Tasks queued or fitting (at start: jobs a stopped server left undone)."""
        return self._read(_SELECT + " WHERE status IN ('queued', 'fitting') ORDER BY created", ())
