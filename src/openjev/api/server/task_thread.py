"""The task store's own thread: the server awaits every store call here, never on the event
loop nor in the loop's default pool (which compiles decisions), so a store file locked from
outside (each call waits up to SQLite's busy timeout) holds up only the store's callers, and
each of those gets a 503 once the busy timeout has passed."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from openjev.errors import NotReady

T = TypeVar("T")
BUSY_RETRY_S = 5  # Retry-After of a call that found the file locked past the busy timeout


class StoreThread:
    """One thread, the store's calls in the order they were awaited."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openjev-task-store")

    async def call(self, method: Callable[..., T], *args: Any) -> T:
        """`method(*args)` on the store's thread; NotReady (503) where the file stayed locked."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(method, *args))
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
            raise NotReady(
                "the task store's file is locked by another process; retry", retry_after_s=BUSY_RETRY_S
            ) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False)
