"""The settings of `/v1/tasks` (per-task calibration): where tasks are kept and how large one
may grow. A section of Settings like those of config/sections.py, in its own module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from openjev.config.fields import opt

TASKS_FILE = "tasks.sqlite3"


@dataclass(frozen=True)
class TaskSettings:
    """The task store (api/server/task_store.py) and the fit job's bounds (api/server/task_jobs.py)."""

    tasks_db: str = opt(
        "",
        "SQLite file of the /v1/tasks store (empty: tasks.sqlite3 under --cache-dir; `off`: no /v1/tasks); "
        "a file that is not openjev's task store stops the server at start",
        metavar="PATH",
    )
    max_task_examples: int = opt(1000, "labelled examples one task may hold; beyond: 422")
    max_example_tokens: int = opt(
        4096, "distinct tokens of one labelled example as read (state and question); beyond: 422"
    )
    max_queued_tasks: int = opt(16, "tasks one API key may have queued or fitting at once (0: no cap); beyond: 429")
    task_target_precision: float = opt(
        0.9, "the precision a task's abstain threshold is chosen for when its creator names none"
    )

    outcome_retention: str = opt(
        "100000,30d",
        "decisions kept per key for /v1/outcomes, as COUNT,AGE (AGE in s, m, h or d): a key's oldest beyond COUNT "
        "and any older than AGE are forgotten; 0 turns recording off",
        metavar="COUNT,AGE",
    )

    def retention(self) -> tuple[int, float] | None:
        """(decisions per key, seconds kept), or None where recording is off; ValueError for a
        value that is neither 0 nor COUNT,AGE with both positive."""
        return parse_retention(self.outcome_retention)

    def database(self, cache_dir: str) -> Path | None:
        """The store's file, or None where tasks are off."""
        if self.tasks_db == "off":
            return None
        return Path(self.tasks_db) if self.tasks_db else Path(cache_dir) / TASKS_FILE


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_retention(text: str) -> tuple[int, float] | None:
    """`--outcome-retention` read: "0" is off, else "COUNT,AGE" (e.g. 100000,30d)."""
    value = text.strip()
    if value == "0":
        return None
    count, _, age = value.partition(",")
    unit = _UNITS.get(age.strip()[-1:], 0.0)
    try:
        per_key, seconds = int(count), float(age.strip()[:-1]) * unit
    except ValueError:
        per_key, seconds = 0, 0.0
    if per_key <= 0 or not seconds > 0:
        raise ValueError(f"--outcome-retention {text!r}: 0 (off) or COUNT,AGE with both positive, e.g. 100000,30d")
    return per_key, seconds
