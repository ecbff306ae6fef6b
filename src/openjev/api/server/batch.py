"""POST /v1/systemone/batch: many decisions in one call.

Two envelopes: `{"requests": [<a /v1/systemone body>, ...]}`, or one question set over many
states `{"model", "questions", "states": [...]}` (its questions converted once, and each
question's text encoded once for all its states). Each item is validated, prepared
(compiled, its own token budgets checked; all of it in a worker thread, never on the event
loop) and decided through the same DecisionService as
/v1/systemone, so admission, limits and the engine are the same. An item that fails carries
its own error and never fails the others; only the envelope itself (its shape, the item
count, the batch's token total) fails the whole call, before any engine work.

Items sharing a state are run leader first, the others once the leader is done: the engine's
prefix cache then serves the state to them instead of each computing it (concurrent arrivals
would each compute it). Items with different states run concurrently, at most half the
in-flight slots at a time so single requests still get in.

Items count as requests do (api/identity/admission.py): each takes one of its key's requests/min, each is
admitted to the engine on its own (a 529 line carries `retry_after`, like the header), and
each gets its own metrics and access-log line under the batch's request id. A drain that
runs out of time ends an NDJSON stream properly: a 503 line for every unfinished item,
the summary, then the stream's end.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from openjev.api.contract import common, documented, json_route
from openjev.api.contract.jev import convert, schemas
from openjev.api.contract.jev.batch_schemas import BatchRequest
from openjev.api.contract.jev.format import JEV
from openjev.api.contract.overrides import decide_options
from openjev.api.contract.paths import BATCH
from openjev.api.identity.auth import require_key
from openjev.api.identity.caller import caller_of, charge_refused, entry_of
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.operations.middleware import request_id_of
from openjev.api.server import pipeline
from openjev.api.server.batch_items import Item, collect, error_line, ndjson, run
from openjev.api.server.outcomes import routes as outcomes
from openjev.api.server.pipeline import unless_disconnected
from openjev.config import LimitSettings, QualitySettings
from openjev.core.caller import Caller
from openjev.core.readouts import ReadoutSpec
from openjev.core.service import DecisionService
from openjev.core.task_apply import TaskCalibration
from openjev.core.types import DecisionRequest, Question
from openjev.engines import ModelCard
from openjev.errors import ClientDisconnected, OpenjevError, RequestError, TokensExceeded

Binder = Callable[[DecisionRequest, str | None], Mapping[str, TaskCalibration]]  # the request's task fits

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"


def _validation_message(e: ValidationError) -> str:
    """The item's errors in one line, every part bounded and encodable (json_route.safe_errors)."""
    errors = json_route.safe_errors(e.errors())
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors)


class ItemInvalid(RequestError):
    status = 422


_RESPONSES: dict[int | str, dict[str, Any]] = {
    **documented.BODY_ERRORS,
    200: {
        "content": {NDJSON: {}, "application/json": {}},
        "description": "one line per item ({index, model, answers, usage} or {index, status, "
        "error}), then {summary}; or the items as one JSON array in item order",
    },
}


def install(
    app: FastAPI,
    quality: QualitySettings,
    limits: LimitSettings,
    ready: Callable[[], tuple[DecisionService, ModelCard]],
) -> None:
    """Add the batch route to `app`; `ready` is the runtime's (service, card) or raises NotReady."""

    @app.post(
        BATCH,
        dependencies=[Depends(require_key)],
        summary="Many decisions in one call (NDJSON in completion order, or a JSON array with Accept: application/json)",
        openapi_extra={"parameters": documented.READOUT_HEADERS},
        responses=_RESPONSES,
    )
    async def batch(body: BatchRequest, request: Request):
        count = _count(body, limits)
        spec, calibrate = decide_options(request.headers, quality)  # one readout for every item
        ops = request.app.state.ops
        caller = caller_of(request)
        entry = entry_of(caller)
        if entry is not None and count > 1:  # the request itself took one at the door
            await ops.key_limits.take_batch_items(entry, count - 1)
        service, card = ready()
        t0 = time.perf_counter()
        named = [raw.get("x_task") for raw in body.requests or () if isinstance(raw, dict)]  # items' own
        bind = await pipeline.task_binder(request, caller, spec, service, card.fingerprint, quality, named, calibrate)
        items = await _prepared(
            request, caller, body, limits, service, card.name, spec or service.default_readout, (calibrate, bind)
        )
        slots = max(1, limits.max_in_flight // 2)
        state = request.state
        state.batch = {"items": len(items), "succeeded": 0, "failed": 0}  # for the batch's access line

        def record(item: Item, status: int) -> None:
            if item.result is not None and item.request is not None and status == 200:  # id: <request id>:<index>
                outcomes.decided(request, item.request, item.result, spec, item=item.index)
            state.batch["succeeded" if status == 200 else "failed"] += 1
            if status == 499:  # nobody read it: the client went away (the access line's items_unread)
                state.batch["unread"] = state.batch.get("unread", 0) + 1
            ops.access.record_item(request.scope, item.index, status, item.line, item.result, item.started)

        accept = request.headers.get("accept", "")
        if "application/json" in accept and NDJSON not in accept:
            lines = await unless_disconnected(request, collect(run(items, service, slots, record)))
            return JSONResponse(sorted(lines, key=lambda line: line["index"]))
        stream = ndjson(items, service, slots, t0, record, ops.drain.expired, state.batch)
        return StreamingResponse(stream, media_type=NDJSON)


async def _prepared(
    request: Request,
    caller: Caller,
    body: BatchRequest,
    limits: LimitSettings,
    service: DecisionService,
    served: str,
    spec: ReadoutSpec,
    calibration: tuple[bool, Binder],
) -> list[Item]:
    """Every item prepared. Validating, converting and compiling grow with the body: all of
    it in a worker thread, item after item, stopping at the first item that takes the batch
    over its token limit (the items after it are never compiled), or once the client has
    gone (`gone`: the thread stops at its next item, no thread is left computing)."""
    gone = threading.Event()
    try:
        return await unless_disconnected(
            request,
            asyncio.to_thread(
                _prepare_all,
                body,
                limits,
                service,
                served,
                spec,
                calibration,
                request_id_of(request.scope),
                (request.app.state.ops.key_limits, caller, gone),
            ),
        )
    finally:
        gone.set()


def _count(body: BatchRequest, limits: LimitSettings) -> int:
    """How many items the batch has; a 422 beyond --max-batch-items."""
    count = len(body.requests if body.requests is not None else body.states or ())
    if count > limits.max_batch_items:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "requests" if body.requests is not None else "states"),
                    "type": "too_long",
                    "input": None,
                    "msg": f"at most {limits.max_batch_items} items per batch, got {count}",
                }
            ]
        )
    return count


def _shared_questions(body: BatchRequest, limits: LimitSettings) -> tuple[tuple[str, Question], ...] | OpenjevError:
    """The states form's questions, converted once for every item (or the error every
    item then carries)."""
    questions = body.questions or {}
    if len(questions) > limits.max_questions:
        return ItemInvalid(f"at most {limits.max_questions} questions per request, got {len(questions)}")
    try:
        return tuple((qid, convert.question_of(q)) for qid, q in questions.items())
    except OpenjevError as exc:
        return exc


def _request_of(
    raw: Any, body: BatchRequest, shared: Any, limits: LimitSettings, caller: Caller
) -> tuple[DecisionRequest, str]:
    """One item as a core request, in `caller`'s namespace, and the model it asks for."""
    if body.requests is None:  # the states form
        if isinstance(shared, OpenjevError):
            raise shared
        try:
            state = schemas.StateItem.model_validate({"state": raw}).state
        except ValidationError as e:
            raise ItemInvalid(_validation_message(e)) from None
        return caller.scope(DecisionRequest(state=convert.state_of(state), questions=shared)), body.model
    try:
        parsed = schemas.SystemOneRequest.model_validate(raw)
        return pipeline.admitted(JEV, parsed, limits.max_questions, caller), parsed.model
    except ValidationError as e:
        raise ItemInvalid(_validation_message(e)) from None
    except RequestValidationError as e:  # the format's own count check
        raise ItemInvalid("; ".join(str(err["msg"]) for err in e.errors())) from None


def _prepare_all(
    body: BatchRequest,
    limits: LimitSettings,
    service: DecisionService,
    served: str,
    spec: ReadoutSpec,
    calibration: tuple[bool, Binder],
    request_id: str | None,
    charge: tuple[KeyLimits, Caller, threading.Event],
) -> list[Item]:
    """Every item validated, converted and prepared, in a worker thread (see batch()). The
    work of every item counts toward --max-batch-tokens, a refused item's too (the tokens
    it read before its refusal), and is charged to the caller's key once the batch is
    refused; the loop stops once `gone` is set (the client left)."""
    key_limits, caller, gone = charge
    calibrate, bind = calibration
    states_form = body.requests is None
    shared = _shared_questions(body, limits) if states_form else None
    part_cache: dict[str, tuple[int, ...]] | None = {} if states_form else None
    items: list[Item] = []
    total = charged = 0
    for index, raw in enumerate(body.requests if body.requests is not None else body.states or ()):
        if gone.is_set():
            raise ClientDisconnected("the client went away while the batch was prepared")
        item = Item(index, caller, readout=spec, calibrate=calibrate, request_id=request_id)
        t0 = time.perf_counter()
        work = 0
        try:
            with pipeline.charging(key_limits, caller):
                item.request, model = _request_of(raw, body, shared, limits, caller)  # in the key's namespace
                item.model = common.resolve_model(model, served)
                named = raw.get("x_task") if isinstance(raw, dict) and body.requests is not None else None
                item.tasks = bind(item.request, named)  # the tasks' fits, checked before any compile
                item.compiled = service.prepare_now(item.request, service.readout(spec), part_cache)
            work = item.compiled.plan.unique_tokens
        except TokensExceeded as exc:  # charged already; its work counts toward the batch's too
            item.line, work = error_line(item, exc), exc.work_tokens
            charged += work
        except OpenjevError as exc:
            item.line = error_line(item, exc)
        item.prepare_ms = (time.perf_counter() - t0) * 1000
        items.append(item)
        total += work
        if work and total > limits.max_batch_tokens:
            _refuse_batch(total, charged, index, limits, (key_limits, caller))
    return items


def _refuse_batch(
    total: int, charged: int, index: int, limits: LimitSettings, charge: tuple[KeyLimits, Caller]
) -> None:
    """TokensExceeded for a batch whose items' work passed --max-batch-tokens by item
    `index`, its work charged to the caller's key (less the refused items', charged already)."""
    over = TokensExceeded(
        f"the batch takes more than {total} distinct tokens by item {index}, its items' added up "
        f"(limit {limits.max_batch_tokens} per batch)"
    )
    over.work_tokens = total - charged
    charge_refused(*charge, over)
    raise over
