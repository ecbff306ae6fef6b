"""`/v1/tasks`: a key's tasks (one decision and its labelled examples), created, read,
listed, given more examples and deleted; each change of examples queues a fit
(api/server/task_jobs.py).

Before a fit is queued its engine work is priced: every example compiled as the job will
read it (each within --max-example-tokens, 422 beyond), the distinct tokens added up and
taken from the key's tokens/min bucket; a key that cannot pay gets its 429 before any
engine work, a key in debt before anything is compiled (and each call is one of its
requests/min, as a decision is).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from openjev.api.contract import documented, paths
from openjev.api.contract.task_schemas import TaskCreate, TaskCreated, TaskExample, TaskExamples, TaskList, TaskView
from openjev.api.identity.auth import require_key
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.identity.keys import current_key
from openjev.api.server.assembly import Runtime
from openjev.api.server.task_binding import checked_id, owner
from openjev.api.server.task_jobs import TaskJobs, example_request, gold_of, question_of, read_spec
from openjev.api.server.task_store import TaskRecord
from openjev.config import TaskSettings
from openjev.core.service import DecisionService
from openjev.core.task_apply import wording_of
from openjev.core.task_fit import MIN_EXAMPLES
from openjev.core.types import Question
from openjev.errors import InvalidInput, NotFound

_ERRORS: documented.Responses = {
    **documented.BODY_ERRORS,
    404: documented._error("this key has no such task (not_found)"),
}


def view(record: TaskRecord) -> dict[str, Any]:
    eta = None
    if record.status == "fitting" and record.started is not None and 0 < record.done < record.total:
        eta = round((time.time() - record.started) / record.done * (record.total - record.done), 1)
    return {
        "id": record.id,
        "status": record.status,
        "question": record.question,
        "caller_id": record.caller_id,
        "examples": record.examples,
        "outcomes": record.outcomes,
        "target_precision": record.target_precision,
        "progress": {"done": record.done, "total": record.total, "eta_s": eta},
        "fit": record.fit if record.status == "ready" else None,
        "error": record.error,
    }


def priced(service: DecisionService, question: Question, examples: list[dict[str, Any]], bound: int) -> int:
    """The distinct tokens the fit's readings compute, each example within `bound` (422 beyond)."""
    readout = service.readout(read_spec(service, question))
    total = 0
    for n, example in enumerate(examples):
        compiled = service.prepare_now(example_request(question, example["state"], ""), readout)
        tokens = compiled.plan.unique_tokens
        if tokens > bound:
            raise InvalidInput(f"example {n} takes {tokens} tokens as read (limit {bound} per example)")
        total += tokens
    return total


async def _charge(
    request: Request, runtime: Runtime, question: Question, examples: list[dict[str, Any]], bound: int
) -> None:
    """Price the fit and take it from the key's budget (429 before any engine work)."""
    key_limits: KeyLimits = request.app.state.ops.key_limits
    entry = current_key.get()
    if entry is not None:  # one of its requests/min, refused (429) while its tokens are in debt
        await key_limits.admit(entry)
    service, _ = runtime.ready()
    tokens = await asyncio.to_thread(priced, service, question, examples, bound)
    if entry is not None:
        await key_limits.take_tokens(entry, tokens)


def _checked(question: Question, examples: list[TaskExample], first: int) -> list[dict[str, Any]]:
    out = []
    for n, example in enumerate(examples, first):
        gold_of(question, example.answer, f"example {n}")  # 422 for a gold that is not an option
        out.append(example.model_dump(mode="json"))
    return out


def _common() -> dict[str, Any]:
    return {"dependencies": [Depends(require_key)], "responses": _ERRORS}


def install(app: FastAPI, tasks: TaskSettings, runtime: Runtime, jobs: TaskJobs) -> None:
    """The routes of /v1/tasks."""
    _install_create(app, tasks, runtime, jobs)
    _install_reads(app, jobs)
    _install_changes(app, tasks, runtime, jobs)


def _install_create(app: FastAPI, tasks: TaskSettings, runtime: Runtime, jobs: TaskJobs) -> None:
    store = jobs.store

    @app.post(paths.TASKS, status_code=201, response_model=TaskCreated, summary="Create a task and fit it", **_common())
    async def create(body: TaskCreate, request: Request) -> dict[str, Any]:
        count = len(body.examples)
        if not MIN_EXAMPLES <= count <= tasks.max_task_examples:
            raise InvalidInput(f"a task takes {MIN_EXAMPLES} to {tasks.max_task_examples} examples, got {count}")
        raw = body.question.model_dump(mode="json")
        question = question_of(raw)
        examples = _checked(question, body.examples, 0)
        await _charge(request, runtime, question, examples, tasks.max_example_tokens)
        precision = body.target_precision or tasks.task_target_precision
        record = await asyncio.to_thread(
            store.create, owner(), raw, wording_of(question), examples, precision, body.caller_id
        )
        jobs.start(record)
        return {"id": record.id, "status": record.status}


def _install_reads(app: FastAPI, jobs: TaskJobs) -> None:
    store = jobs.store
    common = _common()

    @app.get(paths.TASKS, response_model=TaskList, summary="This key's tasks", **common)
    async def listing() -> dict[str, Any]:
        return {"tasks": [view(r) for r in await asyncio.to_thread(store.owned, owner())]}

    @app.get(paths.TASKS + "/{task_id}", response_model=TaskView, summary="A task: status, progress, fit", **common)
    async def read(task_id: str) -> dict[str, Any]:
        record = await asyncio.to_thread(store.get, owner(), checked_id(task_id))
        if record is None:
            raise NotFound("this key has no such task")
        return view(record)


def _install_changes(app: FastAPI, tasks: TaskSettings, runtime: Runtime, jobs: TaskJobs) -> None:
    store = jobs.store
    common = _common()

    @app.post(
        paths.TASKS + "/{task_id}/examples",
        status_code=202,
        response_model=TaskView,
        summary="Add examples to a task and refit it",
        **common,
    )
    async def add(task_id: str, body: TaskExamples, request: Request) -> dict[str, Any]:
        record = await asyncio.to_thread(store.get, owner(), checked_id(task_id))
        if record is None:
            raise NotFound("this key has no such task")
        if record.examples + len(body.examples) > tasks.max_task_examples:
            raise InvalidInput(f"a task holds at most {tasks.max_task_examples} examples")
        question = question_of(record.question)
        examples = _checked(question, body.examples, record.examples)
        every = await asyncio.to_thread(store.examples, record.id)
        await _charge(request, runtime, question, every + examples, tasks.max_example_tokens)
        jobs.cancel(record.id)
        jobs.index.drop(record.owner, record.id)
        updated = await asyncio.to_thread(store.add_examples, owner(), record.id, examples)
        if updated is None:
            raise NotFound("this key has no such task")
        jobs.start(updated)
        return view(updated)

    @app.delete(paths.TASKS + "/{task_id}", status_code=204, summary="Delete a task (also while it fits)", **common)
    async def delete(task_id: str) -> Response:
        who = owner()
        if not await asyncio.to_thread(store.delete, who, checked_id(task_id)):
            raise NotFound("this key has no such task")
        jobs.cancel(task_id)
        jobs.index.drop(who, task_id)
        return Response(status_code=204)
