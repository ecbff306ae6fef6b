"""The task store's schema: its SQLite application id and its numbered migrations, applied in
order by api/server/task_store.py `open_store` (a file at a newer version than these is
refused, never reset)."""

from __future__ import annotations

from openjev.api.server.outcomes.schema import OUTCOMES_MIGRATION

APPLICATION_ID = 0x6F6A7473  # "ojts": openjev's task store
MIGRATIONS: tuple[str, ...] = (
    # 1: tasks and their examples
    """
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        question TEXT NOT NULL,
        wording TEXT NOT NULL,
        caller_id TEXT,
        target_precision REAL NOT NULL,
        status TEXT NOT NULL,
        done INTEGER NOT NULL DEFAULT 0,
        total INTEGER NOT NULL DEFAULT 0,
        started REAL,
        generation INTEGER NOT NULL DEFAULT 0,
        fit TEXT,
        error TEXT,
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE INDEX tasks_owner ON tasks (owner, wording);
    CREATE TABLE examples (
        task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
        n INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (task_id, n)
    );
    """,
    # 2: decisions kept for outcomes (api/server/outcomes/schema.py)
    OUTCOMES_MIGRATION,
)
