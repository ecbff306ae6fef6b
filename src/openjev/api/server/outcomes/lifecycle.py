"""The outcome parts of one app, built from the settings and tied to its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry

from openjev.api.server.outcomes.recorder import Recorder, Retention
from openjev.api.server.outcomes.refits import Refits
from openjev.api.server.outcomes.routes import Outcomes
from openjev.api.server.task_jobs import TaskJobs
from openjev.config import TaskSettings


def assemble(tasks: TaskSettings, jobs: TaskJobs | None, registry: CollectorRegistry | None) -> Outcomes:
    """The recorder and the refits where the server keeps tasks and records decisions
    (--tasks-db not off, --outcome-retention not 0); parts left None otherwise."""
    kept = tasks.retention()
    if jobs is None or jobs.outcomes is None or kept is None:
        return Outcomes(None, None)
    recorder = Recorder(jobs.outcomes, Retention(*kept), jobs.runtime, jobs.temperature, registry)
    return Outcomes(recorder, Refits(jobs, jobs.outcomes, tasks.task_target_precision))


def wrap(
    outcomes: Outcomes, lifespan: Callable[[Any], AbstractAsyncContextManager[None]]
) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """`lifespan` with the recorder's writer running inside it (what is queued is written at
    shutdown) and the refits dropped at shutdown."""

    @asynccontextmanager
    async def run(app: Any) -> AsyncIterator[None]:
        async with lifespan(app):
            if outcomes.recorder is not None:
                outcomes.recorder.start()
            try:
                yield
            finally:
                if outcomes.refits is not None:
                    outcomes.refits.cancel()
                if outcomes.recorder is not None:
                    outcomes.recorder.close()

    return run
