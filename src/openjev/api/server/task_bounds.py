"""The task store's bounds, checked inside its writes (api/server/task_store.py), so that
concurrent requests cannot pass them together: a task's examples within --max-task-examples
(422 beyond) and a key's tasks waiting for a fit within --max-queued-tasks (429 beyond).
Each check is a `Check`: run on the store's connection in the write's transaction (or
alone, as a cheap look before any work is spent), it raises to refuse."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from openjev.errors import InvalidInput, RateLimited

Check = Callable[[sqlite3.Connection], None]
QUEUE_RETRY_S = 30  # Retry-After of a key at its cap of tasks waiting for a fit
WAITING = "SELECT count(*) FROM tasks WHERE owner = ? AND status IN ('queued', 'fitting')"
# The distinct tokens a task's stored examples were priced at when added (`tokens` of each
# body); an example stored without one at a byte estimate of its body (4 bytes a token).
PRICED = (
    "SELECT coalesce(sum(coalesce(json_extract(body, '$.tokens'), length(body) / 4)), 0)"
    " FROM examples WHERE task_id = ?"
)


def queue_cap(owner: str, max_queued: int) -> Check:
    """RateLimited (429) where the owner has `max_queued` tasks queued or fitting (0: no cap)."""

    def check(conn: sqlite3.Connection) -> None:
        if max_queued and conn.execute(WAITING, (owner,)).fetchone()[0] >= max_queued:
            raise RateLimited(
                f"this key has {max_queued} tasks queued or fitting (its limit, --max-queued-tasks); "
                "retry once one is fitted, or delete one",
                retry_after_s=QUEUE_RETRY_S,
            )

    return check


def examples_cap(owner: str, task_id: str, adding: int, cap: int, max_queued: int) -> Check:
    """Before `adding` examples to the owner's task: InvalidInput (422) where they would take it
    past `cap` examples (0: no cap); where the task is not waiting already (it will be),
    `queue_cap`."""

    def check(conn: sqlite3.Connection) -> None:
        held, waiting = conn.execute(
            "SELECT (SELECT count(*) FROM examples WHERE task_id = ?), status IN ('queued', 'fitting')"
            " FROM tasks WHERE id = ? AND owner = ?",
            (task_id, task_id, owner),
        ).fetchone() or (0, True)
        if cap and held + adding > cap:
            raise InvalidInput(f"a task holds at most {cap} examples: this one has {held}, {adding} more asked")
        if not waiting:
            queue_cap(owner, max_queued)(conn)

    return check
