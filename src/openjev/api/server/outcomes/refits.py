"""A task refitted on its question's outcomes from the stored readings, with no engine work.

An outcome joins the task of its question's wording within the key (the most recent one,
whatever its status; created, `collecting`, where the key has none). The task is refitted
(core/outcomes/schedule.py) as soon as it has MIN_EXAMPLES readings, then after every
REFIT_EVERY new outcomes and at most once per REFIT_MIN_INTERVAL_S, one refit at a time in a
worker thread, on its examples as the engine last read them (stored by the example job) and
its question's most recent OUTCOMES_PER_FIT outcomes read under the binding this server
reads now (weights, prompt version, readout, temperature, wording). Only where a task's
examples were never read under that binding does a refit hand over to the example job
(api/server/task_jobs.py), which reads them with the engine as creating the task did.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from openjev.api.server.outcomes.store import OUTCOMES_PER_FIT, Asked, OutcomeStore, binding_text
from openjev.api.server.task_binding import binding
from openjev.api.server.task_jobs import TaskJobs, base_fit, fit_document, question_of, read_spec
from openjev.api.server.task_store import TaskRecord
from openjev.core.outcomes.readings import examples_of
from openjev.core.outcomes.schedule import REFIT_EVERY, REFIT_MIN_INTERVAL_S, refit_due
from openjev.core.readouts import question_type
from openjev.core.task_fit import MIN_EXAMPLES, fit_task

log = logging.getLogger(__name__)

NEEDS_ENGINE = "needs-engine"


class Refits:
    """The outcome refits of one app (`poke` after outcomes arrive)."""

    def __init__(
        self,
        jobs: TaskJobs,
        outcomes: OutcomeStore,
        target_precision: float,
        every: int = REFIT_EVERY,
        min_interval_s: float = REFIT_MIN_INTERVAL_S,
    ) -> None:
        self.jobs = jobs
        self.outcomes = outcomes
        self._precision = target_precision
        self._every = every
        self.min_interval_s = min_interval_s
        self._creating = threading.Lock()
        self._one: asyncio.Lock | None = None
        self._later: dict[str, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Task[None]] = set()
        self.done = 0  # refits saved, for tests and the log

    def task_of(self, owner: str, asked: Asked) -> TaskRecord:
        """The owner's task of the question's wording, created (collecting) where none is."""
        store = self.jobs.store
        with self._creating:
            found = store.latest(owner, asked.wording)
            if found is not None:
                return found
            return store.create(owner, asked.question, asked.wording, [], self._precision, status="collecting")

    async def poke(self, owner: str, task_id: str) -> None:
        """Refit the task now, later or not (core/outcomes/schedule.py)."""
        record = await asyncio.to_thread(self.jobs.store.get, owner, task_id)
        if record is None or record.status in ("queued", "fitting"):  # its example job takes the outcomes in
            return
        rests_on = (record.fit or {}).get("rests_on", {})
        total, pending, _ = await asyncio.to_thread(
            self.outcomes.counts, owner, record.wording, rests_on.get("outcomes_until")
        )
        due = refit_due(
            pending, total + record.examples, rests_on.get("fitted_at"), time.time(), self._every, self.min_interval_s
        )
        if due.now:
            self._start(owner, task_id)
        elif due.after_s is not None and task_id not in self._later:
            loop = asyncio.get_running_loop()
            self._later[task_id] = loop.call_later(due.after_s, self._wake, owner, task_id)

    def _wake(self, owner: str, task_id: str) -> None:
        self._later.pop(task_id, None)
        self._start(owner, task_id)

    def _start(self, owner: str, task_id: str) -> None:
        """The refit in the background (the caller's request does not wait for it)."""
        job = asyncio.create_task(self.refit(owner, task_id))
        self._running.add(job)
        job.add_done_callback(self._running.discard)

    def cancel(self) -> None:
        """At shutdown: every scheduled and running refit dropped (each saves whole or nothing)."""
        for handle in self._later.values():
            handle.cancel()
        self._later.clear()
        for job in list(self._running):
            job.cancel()

    async def refit(self, owner: str, task_id: str) -> None:
        """One refit from the stored readings, one at a time, its CPU in a worker thread."""
        if self._one is None:
            self._one = asyncio.Lock()
        async with self._one:
            record = await asyncio.to_thread(self.jobs.store.get, owner, task_id)
            if record is None:
                return
            try:
                fit = await asyncio.to_thread(self.fit_of, record)
            except Exception:  # a refit's failure keeps the fit it had; logged, never the caller's
                log.exception("task %s: its refit on outcomes failed", task_id)
                return
            if fit == NEEDS_ENGINE:
                self.jobs.start(record)
            elif isinstance(fit, dict) and self.jobs.store.finish(record.id, record.generation, fit):
                self.done += 1
                saved = await asyncio.to_thread(self.jobs.store.get, owner, task_id)
                if saved is not None:
                    self.jobs.index.put(saved)

    def fit_of(self, record: TaskRecord) -> dict[str, Any] | str | None:
        """The task's fit on its stored readings (no engine), NEEDS_ENGINE where its examples
        were not read under this server's binding, None where it has too few readings."""
        service, card = self.jobs.runtime.ready()
        question = question_of(record.question)
        spec = read_spec(service, question)
        qtype = question_type(question)
        base = base_fit(service, spec, qtype)
        bound = binding(card.fingerprint, self.jobs.temperature, spec, qtype, record.wording)
        text = binding_text(bound)
        examples = []
        if record.examples:
            rows = self.outcomes.examples(record.id, record.generation, text)
            if rows is None:
                return NEEDS_ENGINE
            examples = examples_of(rows, len(rows))
        outcomes = self.outcomes.outcomes(record.owner, record.wording, text, OUTCOMES_PER_FIT)
        more = examples_of(((o.logs, o.gold) for o in outcomes), OUTCOMES_PER_FIT)
        if len(examples) + len(more) < MIN_EXAMPLES:
            return None
        fitted = fit_task(examples + more, base, record.target_precision)
        until = max((o.answered for o in outcomes), default=None)
        return fit_document(service, base, fitted, bound, (len(examples), len(more)), until)
