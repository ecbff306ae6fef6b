"""Fitting a task as a background job: its examples read by the served model, then the fit
(core/task_fit.py) computed off the event loop and stored whole.

The job's engine work was priced and charged to the key before it was queued
(api/server/task_routes.py). Jobs run one at a time, taking turns fairly across keys
(api/server/task_queue.py), and each reading waits until no
live decision is in flight: a fit takes the engine only when live traffic leaves it idle,
the lowest priority there is. Each reading is then engine work like a decision's: admitted
through the service's admission for the task's owner (`fit_caller`; its tokens counted in
flight, an example past the engine's deadline refused before any work), and where the
admission answers that the server is busy (529) the reading waits and tries again. Progress (examples read of the total) is written after each
reading. Cancelling (DELETE, or more examples) stops the job at its next await; whatever it
then writes is refused by the store, which keeps a fit only for the task and examples it
was started on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from openjev.api.contract.jev import convert
from openjev.api.contract.jev.schemas import SystemOneRequest
from openjev.api.server.assembly import Runtime
from openjev.api.server.outcomes.store import OutcomeStore, binding_text, open_outcomes
from openjev.api.server.task_binding import ReadyIndex, binding
from openjev.api.server.task_queue import FairTurns
from openjev.api.server.task_store import TaskRecord, TaskStore, open_store
from openjev.config import Settings
from openjev.core import calibration as calib
from openjev.core.caller import Caller
from openjev.core.outcomes.readings import fit_logs
from openjev.core.ports import PlanResult
from openjev.core.prompts import CompiledRequest
from openjev.core.readouts import Readout, ReadoutSpec, question_type
from openjev.core.service import DecisionService
from openjev.core.task_apply import wording_of
from openjev.core.task_fit import Example, TaskFit, fit_task
from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion, Question, Share, State
from openjev.errors import EngineTimeout, InvalidInput, OpenjevError, Overloaded

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.05  # how often a waiting job looks whether live traffic left the engine idle
MAX_BUSY_WAIT_S = 5.0  # the longest a reading the admission refused (529) waits before it tries again


def question_of(raw: dict[str, Any]) -> Question:
    """The task's Jev question as the core reads it (validated as a request's question)."""
    parsed = SystemOneRequest.model_validate({"state": "", "questions": {"q": raw}})
    return convert.question_of(parsed.questions["q"])


def gold_of(question: Question, answer: bool | str | int, where: str) -> int:
    """The gold option's index; 422 for an answer that is not one of the question's options."""
    if isinstance(question, NoulQuestion):
        if isinstance(answer, bool):
            return 0 if answer else 1
        raise InvalidInput(f"{where}: a noul task's answer is true or false, got {answer!r}"[:200])
    if isinstance(question, ChoiceQuestion):
        names = [o.name for o in question.options]
        if isinstance(answer, str) and answer in names:
            return names.index(answer)
        raise InvalidInput(f"{where}: the answer {answer!r} is not one of the task's options"[:200])
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(question.levels):
        return answer
    raise InvalidInput(f"{where}: a score task's answer is a level index 0..{len(question.levels) - 1}, got {answer!r}")


def example_request(question: Question, state: Any, namespace: str) -> DecisionRequest:
    return DecisionRequest(state=_state(state), questions=(("task", question),), cache_namespace=namespace)


def fit_caller(owner: str) -> Caller:
    """Whom a task's fit reads for: its owner's tenant, in a cache namespace of the fit's own
    and the owner's share of the engine. No account: the fit was charged when it was queued."""
    return Caller(tenant=owner, cache_namespace=f"task-fit:{owner}", share=Share(owner))


def _state(value: Any) -> State:
    return convert.state_of(value)


def read_spec(service: DecisionService, question: Question) -> ReadoutSpec:
    """The readout a task is fitted under: the server's default, as it reads this type."""
    return service.resolve(service.default_readout).for_type(question_type(question))


def base_fit(service: DecisionService, spec: ReadoutSpec, qtype: str) -> calib.TypeFit | None:
    cal = service.calibration
    return cal.fit_for(spec, qtype) if cal is not None else None


def logs_of(
    readout: Readout, question: Question, logprobs: list[tuple[float, ...]], base: calib.TypeFit | None
) -> tuple[float, ...]:
    """The example's option log-probabilities after the global fit's position prior."""
    return fit_logs(readout.combine(question, logprobs), base)


def fit_document(
    service: DecisionService,
    base: calib.TypeFit | None,
    fitted: TaskFit,
    bound: dict[str, Any],
    rests_on: tuple[int, int],
    outcomes_until: float | None = None,
) -> dict[str, Any]:
    """The stored fit of a task: bound to `bound`, fitted on (examples, outcomes) `rests_on`,
    the latest outcome answered at `outcomes_until` (api/server/outcomes/refits.py counts
    new outcomes from there)."""
    applied = fitted.type_fit(base)
    return {
        "binding": bound,
        "global": service.calibration.id if service.calibration is not None and base is not None else None,
        "temperature": applied.temperature,
        "bias": list(applied.bias),
        "position_prior": {str(n): list(p) for n, p in applied.position_prior.items()},
        "form": fitted.form,
        "shrinkage": fitted.shrinkage,
        "cv_nll": fitted.cv_nll,
        "before": fitted.before.describe(),
        "after": fitted.after.describe(),
        "threshold": fitted.threshold.describe(),
        "rests_on": {
            "examples": rests_on[0],
            "outcomes": rests_on[1],
            "outcomes_until": outcomes_until,
            "fitted_at": time.time(),
        },
    }


class TaskJobs:
    """The running jobs, by task id; `wrap` ties them to the app's lifespan."""

    def __init__(
        self,
        store: TaskStore,
        index: ReadyIndex,
        runtime: Runtime,
        engine_timeout_s: float,
        base_temperature: float,
        outcomes: OutcomeStore | None = None,
    ) -> None:
        self.store = store
        self.outcomes = outcomes  # decisions kept for outcomes (api/server/outcomes/), None where off
        self.index = index
        self.lookup = (store, index)  # what the decision routes read (api/server/task_binding.py)
        self.runtime = runtime
        self._timeout = engine_timeout_s
        self.temperature = base_temperature
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._one = FairTurns()

    def start(self, record: TaskRecord) -> None:
        self.cancel(record.id)
        self._jobs[record.id] = job = asyncio.create_task(self._run(record))
        job.add_done_callback(lambda _: self._jobs.pop(record.id, None) if self._jobs.get(record.id) is job else None)

    def cancel(self, task_id: str) -> None:
        job = self._jobs.pop(task_id, None)
        if job is not None:
            job.cancel()

    def wrap(
        self, lifespan: Callable[[Any], AbstractAsyncContextManager[None]]
    ) -> Callable[[Any], AbstractAsyncContextManager[None]]:
        """`lifespan` with the jobs a stopped server left undone resumed, and every job
        cancelled at shutdown (the store stays open: every write was its own transaction,
        and an app may be started again in the same process, as tests do)."""

        @asynccontextmanager
        async def run(app: Any) -> AsyncIterator[None]:
            async with lifespan(app):
                self._one = FairTurns()  # of this event loop
                for record in await self.store.call(self.store.unfinished):
                    self.start(record)
                try:
                    yield
                finally:
                    for task_id in list(self._jobs):
                        self.cancel(task_id)

        return run

    async def _service(self) -> DecisionService:
        while True:
            if self.runtime.service is not None:
                return self.runtime.service
            if self.runtime.error is not None:
                raise self.runtime.error
            await asyncio.sleep(0.5)

    def _finished(self, record: TaskRecord, fit: dict[str, Any]) -> TaskRecord | None:
        """`record` finished with `fit` and read back; None where a newer change won."""
        if not self.store.finish(record.id, record.generation, fit):
            return None
        return self.store.get(record.owner, record.id)

    async def _run(self, record: TaskRecord) -> None:
        try:
            async with self._one.turn(record.owner):
                fit = await self._fit(record)
            # finished and read back in one call of the store's thread, so the index has the fit
            # before a caller who polls the task can see it ready
            done = await self.store.call(self._finished, record, fit)
            if done is not None and done.status == "ready":  # not where more examples came meanwhile
                self.index.put(done)
        except asyncio.CancelledError:
            raise
        except (OpenjevError, ValueError) as e:  # the message only: an error's detail is the operator's
            message = e.message if isinstance(e, OpenjevError) else str(e)
            await self.store.call(self.store.finish, record.id, record.generation, None, message[:500])
        except Exception as e:  # a bug fails the task and is logged, never the server
            log.exception("task %s: its fit failed", record.id)
            await self.store.call(
                self.store.finish, record.id, record.generation, None, f"internal error ({type(e).__name__})"
            )

    async def _fit(self, record: TaskRecord) -> dict[str, Any]:
        service = await self._service()
        loaded = self.runtime.loaded
        if loaded is None:
            raise EngineTimeout("the model is not loaded")
        question = question_of(record.question)
        spec = read_spec(service, question)
        base = base_fit(service, spec, question_type(question))
        examples = await self._read(record, service, question, spec, base)
        bound = binding(loaded.card.fingerprint, self.temperature, spec, question_type(question), wording_of(question))
        outcomes: list[Example] = []
        until = None
        if self.outcomes is not None:  # kept for outcome refits (no engine), and the outcomes joined
            outcomes, until = await asyncio.to_thread(self.outcomes.fit_rows, record, binding_text(bound), examples)
        fitted = await asyncio.to_thread(fit_task, examples + outcomes, base, record.target_precision)
        return fit_document(service, base, fitted, bound, (len(examples), len(outcomes)), until)

    async def _read(
        self,
        record: TaskRecord,
        service: DecisionService,
        question: Question,
        spec: ReadoutSpec,
        base: calib.TypeFit | None,
    ) -> list[Example]:
        """Each example read by the model, one at a time, progress stored after each."""
        readout = service.readout(spec)
        bodies = await asyncio.to_thread(self.store.examples, record.id)
        examples = []
        await asyncio.to_thread(self.store.progress, record.id, record.generation, "fitting", 0, len(bodies))
        caller = fit_caller(record.owner)
        for n, body in enumerate(bodies):
            request = caller.scope(example_request(question, body["state"], ""))
            compiled = await asyncio.to_thread(service.prepare_now, request, readout)
            result = await self._read_one(service, compiled, caller, n)
            logs = logs_of(readout, question, [b.logprobs for b in result.branches], base)
            examples.append(Example(logs, gold_of(question, body["answer"], f"example {n}")))
            await asyncio.to_thread(self.store.progress, record.id, record.generation, "fitting", n + 1, len(bodies))
        return examples

    async def _read_one(
        self, service: DecisionService, compiled: CompiledRequest, caller: Caller, n: int
    ) -> PlanResult:
        """Example `n` read once no live decision is in flight, admitted for `caller`; while
        the admission says the server is busy, it waits its Retry-After and tries again."""
        while True:
            while service.in_flight > 0:  # live decisions first: the engine is theirs while they run
                await asyncio.sleep(IDLE_POLL_S)
            try:
                return await service.run_admitted(compiled, caller=caller)
            except Overloaded as busy:
                await asyncio.sleep(min(float(busy.headers.get("Retry-After", 1)), MAX_BUSY_WAIT_S))
            except EngineTimeout:
                raise EngineTimeout(f"the engine did not read example {n} within {self._timeout:g} s") from None


def open_jobs(settings: Settings, runtime: Runtime) -> TaskJobs | None:
    """The task store opened (a file that is not one: ConfigError, at start) and its jobs;
    None where tasks are off (--tasks-db off)."""
    path = settings.tasks.database(settings.served.cache_dir)
    if path is None:
        return None
    store = open_store(path)
    outcomes = open_outcomes(path) if settings.tasks.retention() is not None else None
    return TaskJobs(
        store, ReadyIndex(store), runtime, settings.limits.engine_timeout_s, settings.quality.temperature, outcomes
    )
