"""`/v1/tasks`: a key's tasks (one decision and its labelled examples), created, read,
listed, given more examples and deleted; each change of examples queues a fit
(api/server/task_jobs.py).

Every call is one of the key's requests/min, taken at the door (api/identity/door.py); a
write (a create, more examples) is priced there from its body's size, as a decision is: a
key in debt, or without room for the body's reservation, gets its 429 before the body is
read. Then the fit's engine work is priced: each new example compiled as the job will read
it, the longest body first (each within --max-example-tokens: 422 beyond, at the first one
over), its distinct tokens kept with the example; the examples stored before are priced at
their kept counts, never compiled again. The total is taken from the key's tokens/min
bucket in place of the reservation; a refused write is charged the compile work it cost.
The bounds (--max-task-examples, --max-queued-tasks) are looked at before any compile and
checked again inside the write (api/server/task_bounds.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import Response

from openjev.api.contract import documented, paths
from openjev.api.contract.task_schemas import TaskCreate, TaskCreated, TaskExample, TaskExamples, TaskList, TaskView
from openjev.api.identity.auth import require_key
from openjev.api.identity.caller import account_of, caller_of
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.server.assembly import Runtime
from openjev.api.server.pipeline import charged
from openjev.api.server.task_binding import checked_id
from openjev.api.server.task_bounds import examples_cap, queue_cap
from openjev.api.server.task_jobs import TaskJobs, example_request, gold_of, question_of, read_spec
from openjev.api.server.task_store import TaskRecord
from openjev.config import TaskSettings
from openjev.core.service import DecisionService
from openjev.core.task_apply import wording_of
from openjev.core.task_fit import MIN_EXAMPLES
from openjev.core.types import Question
from openjev.errors import InvalidInput, NotFound, TokensExceeded

PAGE_SIZE = 100  # tasks a listing shows without `limit`
MAX_PAGE_SIZE = 500

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


def priced(
    service: DecisionService, question: Question, examples: list[dict[str, Any]], bound: int, first: int = 0
) -> list[int]:
    """Each example's distinct tokens as the fit reads it (numbered from `first`), the longest
    body first; TokensExceeded (422) at the first over `bound`, its `work_tokens` the tokens
    compiled up to it."""
    readout = service.readout(read_spec(service, question))
    counts = [0] * len(examples)
    work = 0
    for n in sorted(range(len(examples)), key=lambda n: -len(json.dumps(examples[n]["state"]))):
        try:
            compiled = service.prepare_now(example_request(question, examples[n]["state"], ""), readout)
        except TokensExceeded as exc:
            exc.work_tokens += work
            raise
        counts[n] = tokens = compiled.plan.unique_tokens
        work += tokens
        if tokens > bound:
            over = TokensExceeded(f"example {first + n} takes {tokens} tokens as read (limit {bound} per example)")
            over.work_tokens = work
            raise over
    return counts


async def _charge(
    request: Request, runtime: Runtime, question: Question, examples: list[dict[str, Any]], held: tuple[int, int, int]
) -> None:
    """Price the fit of the new `examples` and the task's `held` (the first new example's
    number, the tokens its stored ones were priced at, --max-example-tokens): each new one's
    count kept in it, the total taken from the key's budget in place of the door's
    reservation (429 before any engine work); a refusal charged its compile work
    (api/server/pipeline.py `charged`). A write then refused by a bound checked inside it
    (a concurrent request took the room) keeps the charge: the compile was done."""
    key_limits: KeyLimits = request.app.state.ops.key_limits
    first, stored, bound = held
    service, _ = runtime.ready()
    caller = caller_of(request)
    async with charged(key_limits, caller):
        counts = await asyncio.to_thread(priced, service, question, examples, bound, first)
    for example, tokens in zip(examples, counts, strict=True):
        example["tokens"] = tokens
    account = account_of(caller)
    if account is not None:
        await key_limits.take_tokens(account.entry, stored + sum(counts), refund=account.claim())


def _cursor(record: TaskRecord) -> str:
    """A listing's `next`: where the page ended (opaque to the caller)."""
    return f"{record.created!r}~{record.id}"


def _cursor_of(after: str | None) -> tuple[float, str]:
    """The place a cursor names (the start for none); 422 for one that is not a cursor."""
    if after is None:
        return (-1.0, "")
    created, _, task_id = after.partition("~")
    try:
        when = float(created)
    except ValueError:
        when = math.nan
    if not math.isfinite(when):
        raise InvalidInput("`after` is not a cursor of this listing: pass the previous page's `next`")
    return when, checked_id(task_id)


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
        count, who = len(body.examples), caller_of(request).tenant
        if not MIN_EXAMPLES <= count <= tasks.max_task_examples:
            raise InvalidInput(f"a task takes {MIN_EXAMPLES} to {tasks.max_task_examples} examples, got {count}")
        raw = body.question.model_dump(mode="json")
        question = question_of(raw)
        examples = _checked(question, body.examples, 0)
        await store.call(store.check, queue_cap(who, tasks.max_queued_tasks))  # 429 before any compile
        await _charge(request, runtime, question, examples, (0, 0, tasks.max_example_tokens))
        precision = body.target_precision or tasks.task_target_precision
        made = (who, raw, wording_of(question), examples, precision, body.caller_id, tasks.max_queued_tasks)
        record = await store.call(store.create, *made)
        jobs.start(record)
        return {"id": record.id, "status": record.status}


def _install_reads(app: FastAPI, jobs: TaskJobs) -> None:
    store = jobs.store
    common = _common()

    @app.get(paths.TASKS, response_model=TaskList, summary="This key's tasks, a page at a time", **common)
    async def listing(
        request: Request,
        limit: int = Query(PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE, description="tasks on this page"),
        after: str | None = Query(None, max_length=80, description="the previous page's `next`"),
    ) -> dict[str, Any]:
        records, more = await store.call(store.page, caller_of(request).tenant, limit, _cursor_of(after))
        return {"tasks": [view(r) for r in records], "next": _cursor(records[-1]) if more else None}

    @app.get(paths.TASKS + "/{task_id}", response_model=TaskView, summary="A task: status, progress, fit", **common)
    async def read(task_id: str, request: Request) -> dict[str, Any]:
        record = await store.call(store.get, caller_of(request).tenant, checked_id(task_id))
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
        who, cap, max_queued = caller_of(request).tenant, tasks.max_task_examples, tasks.max_queued_tasks
        record = await store.call(store.get, who, checked_id(task_id))
        if record is None:
            raise NotFound("this key has no such task")
        await store.call(store.check, examples_cap(who, record.id, len(body.examples), cap, max_queued))
        question = question_of(record.question)
        examples = _checked(question, body.examples, record.examples)
        stored = await store.call(store.priced_tokens, record.id)
        await _charge(request, runtime, question, examples, (record.examples, stored, tasks.max_example_tokens))
        updated = await store.call(store.add_examples, who, record.id, examples, cap, max_queued)
        if updated is None:
            raise NotFound("this key has no such task")
        jobs.index.drop(record.owner, record.id)
        jobs.start(updated)  # in place of its job, if one ran
        return view(updated)

    @app.delete(paths.TASKS + "/{task_id}", status_code=204, summary="Delete a task (also while it fits)", **common)
    async def delete(task_id: str, request: Request) -> Response:
        who = caller_of(request).tenant
        if not await store.call(store.delete, who, checked_id(task_id)):
            raise NotFound("this key has no such task")
        jobs.cancel(task_id)
        jobs.index.drop(who, task_id)
        return Response(status_code=204)
