"""At shutdown the loop's worker threads are not waited for (api/server/drain.py): queued
work is dropped, running work is left to a process that exits without it."""

from __future__ import annotations

import asyncio
import threading
import time

from openjev.api.server.drain import StoppingExecutor, leftover_threads


def test_the_loops_executor_drops_queued_work_and_does_not_wait_for_running_work():
    release = threading.Event()
    started: list[int] = []

    def work(k: int) -> int:
        started.append(k)
        release.wait(10)
        return k

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        executor = StoppingExecutor()
        loop.set_default_executor(executor)
        futures = [loop.run_in_executor(None, work, k) for k in range(executor._max_workers + 3)]
        while len(started) < executor._max_workers:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await loop.shutdown_default_executor()  # what asyncio.run does at its end
        waited = time.monotonic() - t0
        for f in futures:
            f.cancel()
        return waited

    waited = asyncio.run(scenario())
    try:
        assert waited < 1.0  # not the 10 s the running work would take
        time.sleep(0.05)
        assert len(started) == len(set(started)) and len(started) <= StoppingExecutor()._max_workers  # none queued ran
        left = _workers(leftover_threads(grace_s=0.1))
        assert left
    finally:
        release.set()
    assert not _workers(leftover_threads(grace_s=5.0))  # once done, they end


def _workers(threads: list[threading.Thread]) -> list[threading.Thread]:
    """The loop executor's own threads (other tests' store threads may still be alive)."""
    return [t for t in threads if t.name.startswith("openjev-worker")]
