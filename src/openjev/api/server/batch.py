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
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from openjev.api.contract import convert, documented, schemas, wire
from openjev.api.contract.jev_format import JEV
from openjev.api.contract.overrides import decide_options
from openjev.api.contract.paths import BATCH
from openjev.api.identity import tenancy
from openjev.api.identity.admission import charge_refused
from openjev.api.identity.auth import require_key
from openjev.api.identity.keys import KeyLimits, current_key
from openjev.api.operations.middleware import request_id_of
from openjev.api.server import pipeline
from openjev.api.server.pipeline import unless_disconnected
from openjev.config import Settings
from openjev.core.prompts import CompiledRequest
from openjev.core.readouts import ReadoutSpec
from openjev.core.service import DecisionService
from openjev.core.types import DecisionRequest, DecisionResult, Question
from openjev.engines import ModelCard
from openjev.errors import Draining, OpenjevError, RequestError, TokensExceeded

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[Any] | None = Field(
        None, min_length=1, description="items, each a /v1/systemone body (validated one by one)"
    )
    model: str = Field("jev-latest", description="states form: the model every item asks")
    questions: dict[str, schemas.Question] | None = Field(
        None, min_length=1, description="states form: the questions asked about every state"
    )
    states: list[Any] | None = Field(None, min_length=1, description="states form: one item per state")

    @model_validator(mode="after")
    def _one_form(self) -> BatchRequest:
        if self.requests is not None:
            if self.states is not None or self.questions is not None:
                raise ValueError("send either `requests` or `questions` with `states`, not both")
        elif self.states is None or self.questions is None:
            raise ValueError("send `requests` (a list of /v1/systemone bodies) or `questions` with `states`")
        return self


@dataclass
class _Item:
    index: int
    request: DecisionRequest | None = None
    model: str | None = None
    compiled: CompiledRequest | None = None
    readout: ReadoutSpec = field(default_factory=ReadoutSpec)  # the batch's x-openjev-readout / -rotations headers
    calibrate: bool = True
    prepare_ms: float = 0.0
    line: dict[str, Any] | None = None  # set once the item is answered or failed
    request_id: str | None = None  # the batch's, for the log line of an item's failure
    result: DecisionResult | None = None  # an answered item's, for its metrics and log line
    started: float = field(default_factory=time.perf_counter)
    cut: bool = False  # answered 503 because the drain ran out of time

    def prepared(self) -> tuple[DecisionRequest, str]:
        """The validated request and the model that answers it (items without a line have both)."""
        if self.request is None or self.model is None:
            raise RuntimeError(f"batch item {self.index} was not prepared")
        return self.request, self.model

    def finished(self) -> dict[str, Any]:
        if self.line is None:
            raise RuntimeError(f"batch item {self.index} has no answer")
        return self.line


def _error_line(item: _Item, exc: OpenjevError) -> dict[str, Any]:
    """The item's public error; its private detail (api/operations/disclosure.py) goes to the log only."""
    if exc.detail:
        log.warning(
            "batch item %d failed: %s", item.index, exc.detail, extra={"fields": {"request_id": item.request_id}}
        )
    line: dict[str, Any] = {
        "index": item.index,
        "status": exc.status,
        "error": {"error_type": exc.error_type, "message": exc.message},
    }
    retry_after = exc.headers.get("Retry-After")
    if retry_after is not None:  # what the header says on a single request's 429/503/529
        line["retry_after"] = int(retry_after)
    return line


# Called with each item once it has its line (answered, failed, or cut by the drain or a
# client gone): the item's metrics and access-log line (AccessLog.record_item, api/operations/access.py).
ItemRecorder = Callable[[_Item, int], None]


def _validation_message(e: ValidationError) -> str:
    """The item's errors in one line, every part bounded and encodable (wire.safe_errors)."""
    errors = wire.safe_errors(e.errors())
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors)


class _ItemInvalid(RequestError):
    status = 422


def install(
    app: FastAPI,
    settings: Settings,
    ready: Callable[[], tuple[DecisionService, ModelCard]],
) -> None:
    """Add the batch route to `app`; `ready` is the runtime's (service, card) or raises NotReady."""

    @app.post(
        BATCH,
        dependencies=[Depends(require_key)],
        summary="Many decisions in one call (NDJSON in completion order, or a JSON array with Accept: application/json)",
        openapi_extra={"parameters": documented.READOUT_HEADERS},
        responses={
            **documented.BODY_ERRORS,
            200: {
                "content": {NDJSON: {}, "application/json": {}},
                "description": "one line per item ({index, model, answers, usage} or {index, status, "
                "error}), then {summary}; or the items as one JSON array in item order",
            },
        },
    )
    async def batch(body: BatchRequest, request: Request):
        count = _count(body, settings)
        spec, calibrate = decide_options(request.headers, settings)  # one readout for every item
        ops = request.app.state.ops
        entry = current_key.get()
        if entry is not None and count > 1:  # the request itself took one at the door
            ops.key_limits.take_batch_items(entry, count - 1)
        service, card = ready()
        t0 = time.perf_counter()
        # Validating, converting and compiling grow with the body: all of it in a worker
        # thread, item after item, stopping at the first item that takes the batch over its
        # token limit (the items after it are never compiled).
        items = await asyncio.to_thread(
            _prepare_all,
            body,
            settings,
            service,
            card.name,
            spec or service.default_readout,
            calibrate,
            request_id_of(request.scope),
            request.app.state.ops.key_limits,
        )
        slots = max(1, settings.max_in_flight // 2)
        state = request.state
        state.batch = {"items": len(items), "succeeded": 0, "failed": 0}  # for the batch's access line

        def record(item: _Item, status: int) -> None:
            state.batch["succeeded" if status == 200 else "failed"] += 1
            ops.access.record_item(request.scope, item.index, status, item.line, item.result, item.started)

        accept = request.headers.get("accept", "")
        if "application/json" in accept and NDJSON not in accept:
            lines = await unless_disconnected(request, _collect(_run(items, service, slots, record)))
            return JSONResponse(sorted(lines, key=lambda line: line["index"]))
        stream = _ndjson(items, service, slots, t0, record, ops.drain.expired, state.batch)
        return StreamingResponse(stream, media_type=NDJSON)


def _count(body: BatchRequest, settings: Settings) -> int:
    """How many items the batch has; a 422 beyond --max-batch-items."""
    count = len(body.requests if body.requests is not None else body.states or ())
    if count > settings.max_batch_items:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "requests" if body.requests is not None else "states"),
                    "type": "too_long",
                    "input": None,
                    "msg": f"at most {settings.max_batch_items} items per batch, got {count}",
                }
            ]
        )
    return count


def _shared_questions(body: BatchRequest, settings: Settings) -> tuple[tuple[str, Question], ...] | OpenjevError:
    """The states form's questions, converted once for every item (or the error every
    item then carries)."""
    questions = body.questions or {}
    if len(questions) > settings.max_questions:
        return _ItemInvalid(f"at most {settings.max_questions} questions per request, got {len(questions)}")
    try:
        return tuple((qid, convert.question_of(q)) for qid, q in questions.items())
    except OpenjevError as exc:
        return exc


def _request_of(raw: Any, body: BatchRequest, shared: Any, settings: Settings) -> tuple[DecisionRequest, str]:
    """One item as a core request and the model it asks for."""
    if body.requests is None:  # the states form
        if isinstance(shared, OpenjevError):
            raise shared
        try:
            state = schemas.StateItem.model_validate({"state": raw}).state
        except ValidationError as e:
            raise _ItemInvalid(_validation_message(e)) from None
        return tenancy.scoped(DecisionRequest(state=convert.state_of(state), questions=shared)), body.model
    try:
        parsed = schemas.SystemOneRequest.model_validate(raw)
        return pipeline.admitted(JEV, parsed, settings.max_questions), parsed.model
    except ValidationError as e:
        raise _ItemInvalid(_validation_message(e)) from None
    except RequestValidationError as e:  # the format's own count check
        raise _ItemInvalid("; ".join(str(err["msg"]) for err in e.errors())) from None


def _prepare_all(
    body: BatchRequest,
    settings: Settings,
    service: DecisionService,
    served: str,
    spec: ReadoutSpec,
    calibrate: bool,
    request_id: str | None,
    key_limits: KeyLimits,
) -> list[_Item]:
    """Every item validated, converted and prepared, in a worker thread (see batch())."""
    states_form = body.requests is None
    shared = _shared_questions(body, settings) if states_form else None
    part_cache: dict[str, tuple[int, ...]] | None = {} if states_form else None
    items: list[_Item] = []
    total = 0
    for index, raw in enumerate(body.requests if body.requests is not None else body.states or ()):
        item = _Item(index, readout=spec, calibrate=calibrate, request_id=request_id)
        t0 = time.perf_counter()
        try:
            with pipeline.charging(key_limits):
                item.request, model = _request_of(raw, body, shared, settings)  # in the key's namespace
                item.model = convert.resolve_model(model, served)
                item.compiled = service.prepare_now(item.request, service.readout(spec), part_cache)
        except OpenjevError as exc:
            item.line = _error_line(item, exc)
        item.prepare_ms = (time.perf_counter() - t0) * 1000
        items.append(item)
        if item.compiled is not None:
            total += item.compiled.plan.unique_tokens
            if total > settings.max_batch_tokens:
                over = TokensExceeded(
                    f"the batch takes more than {total} distinct tokens by item {index}, its items' added up "
                    f"(limit {settings.max_batch_tokens} per batch)"
                )
                over.work_tokens = total
                charge_refused(key_limits, over)
                raise over
    return items


async def _collect(lines: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line async for line in lines]


async def _decide(item: _Item, service: DecisionService, gate: asyncio.Semaphore, done: asyncio.Queue[_Item]) -> None:
    """Decide one prepared item under `gate`; its line (answer or error) is set, then it is
    put on `done`."""
    async with gate:
        try:
            request, model = item.prepared()
            result = await service.decide(request, item.compiled, readout=item.readout, calibrate=item.calibrate)
            item.result = result
            timings = {**result.timings_ms, "prepare": item.prepare_ms}  # prepared up front, not in decide
            item.line = {
                "index": item.index,
                **convert.result_to_wire(result, model),
                "x_readout": result.readout,
                "x_calibration": result.calibration,
                "x_timings_ms": {k: round(v, 1) for k, v in timings.items()},
            }
        except OpenjevError as exc:
            item.line = _error_line(item, exc)
        except Exception:  # an item's bug is that item's 500, not the batch's
            log.exception("batch item %d failed", item.index)
            item.line = {
                "index": item.index,
                "status": 500,
                "error": {"error_type": "unknown", "message": "internal error"},
            }
    await done.put(item)


def _by_state(items: list[_Item]) -> dict[Any, list[_Item]]:
    """The prepared items (no line yet) grouped by their state, in item order."""
    groups: dict[Any, list[_Item]] = {}
    for item in items:
        if item.line is None:
            groups.setdefault(item.prepared()[0].state, []).append(item)
    return groups


def _cut(items: list[_Item], recorded: set[int]) -> Iterator[_Item]:
    """The items not yet recorded when the drain ran out of time, one by one; those without
    a line get a 503 line (cut), those that finished meanwhile keep theirs."""
    cut = Draining("the server shut down before this item finished; retry")
    for item in items:
        if item.index in recorded:
            continue
        if item.line is None:
            item.line, item.cut = _error_line(item, cut), True
        yield item


def _record_unread(items: list[_Item], recorded: set[int], record: ItemRecorder) -> None:
    """The items nobody will read (the client went away), each recorded once as 499."""
    for item in items:
        if item.index not in recorded:
            recorded.add(item.index)
            record(item, 499)


async def _decide_group(
    members: list[_Item], service: DecisionService, gate: asyncio.Semaphore, done: asyncio.Queue[_Item]
) -> None:
    """Items on one state: the leader computes the shared state; the rest find it cached."""
    await _decide(members[0], service, gate, done)
    await asyncio.gather(*(_decide(m, service, gate, done) for m in members[1:]))


async def _run(
    items: list[_Item],
    service: DecisionService,
    slots: int,
    record: ItemRecorder,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Each item's line, in completion order (items that failed to prepare first). Once
    `stop` is set (the drain ran out of time) the items still running are cancelled and
    each gets a 503 line. Every item is recorded once: a client that went away leaves the
    rest recorded as 499."""
    recorded: set[int] = set()

    def emit(item: _Item) -> dict[str, Any]:
        line = item.finished()
        recorded.add(item.index)
        record(item, int(line.get("status", 200)))
        return line

    for item in items:
        if item.line is not None:
            yield emit(item)
    groups = _by_state(items)
    gate = asyncio.Semaphore(slots)
    done: asyncio.Queue[_Item] = asyncio.Queue()

    tasks = [asyncio.create_task(_decide_group(members, service, gate, done)) for members in groups.values()]
    stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        for _ in range(sum(len(m) for m in groups.values())):
            getter = asyncio.ensure_future(done.get())
            waiting = {getter} if stopped is None else {getter, stopped}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            yield emit(getter.result())
        if stopped is not None and stopped.done():
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for item in _cut(items, recorded):
                yield emit(item)  # finished meanwhile (its line stands) or cut (503)
    finally:
        if stopped is not None:
            stopped.cancel()
        for task in tasks:  # a client gone mid-stream: stop the items still running
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _record_unread(items, recorded, record)


async def _ndjson(
    items: list[_Item],
    service: DecisionService,
    slots: int,
    t0: float,
    record: ItemRecorder,
    drained: asyncio.Event,
    facts: dict[str, Any],
) -> AsyncIterator[bytes]:
    usage = {"input_tokens": 0, "output_tokens": 0, "x_prompt_tokens": 0}  # x_computed/x_cached: where known
    ok = cut = 0
    async for line in _run(items, service, slots, record, drained):
        if "answers" in line:
            ok += 1
            for key, value in line["usage"].items():
                usage[key] = usage.get(key, 0) + value
        elif items[line["index"]].cut:
            cut += 1
        yield (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    summary: dict[str, Any] = {
        "items": len(items),
        "succeeded": ok,
        "failed": len(items) - ok,
        "usage": usage,
        "elapsed_ms": round((time.perf_counter() - t0) * 1000, 1),
    }
    if drained.is_set():  # the drain timeout passed: `drained` items were cut (503 lines)
        summary["drained"] = cut
        facts["drained"] = cut
    yield (json.dumps({"summary": summary}, separators=(",", ":")) + "\n").encode()
