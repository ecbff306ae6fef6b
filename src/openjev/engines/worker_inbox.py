"""Handing a job from the event loop to an engine's worker thread and awaiting its answer.

Both thread-owning engines (`scheduler.Scheduler`, `llamacpp.LlamaCppEngine`) keep a deque
inbox guarded by a condition; this is the part of `run` they share."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable
from typing import TypeVar

from openjev.errors import EngineError

T = TypeVar("T")
J = TypeVar("J")


def deliverer(loop: asyncio.AbstractEventLoop, future: asyncio.Future[T]) -> Callable[[T | BaseException], None]:
    """A `deliver(outcome)` that any thread may call to settle `future` (on `loop`): an
    exception outcome is raised by the future, anything else is its result; a second delivery,
    or one after the awaiting task was cancelled, is dropped."""

    def deliver(outcome: T | BaseException) -> None:
        def settle() -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        loop.call_soon_threadsafe(settle)

    return deliver


async def post_and_wait(
    wake: threading.Condition,
    inbox: collections.deque[J],
    stopped: Callable[[], bool],
    job: J,
    future: asyncio.Future[T],
    cancel: Callable[[], None],
) -> T:
    """Append `job` to `inbox` under `wake` and notify the worker, then await `future`.

    Raises EngineError, posting nothing, when `stopped()` (read under `wake`) is true. If the
    awaiting task is cancelled, `cancel()` tells the worker to drop the job, then the
    cancellation propagates."""
    with wake:
        if stopped():
            raise EngineError("the engine is shut down")
        inbox.append(job)
        wake.notify()
    try:
        return await future
    except asyncio.CancelledError:
        cancel()
        raise
