"""A batch's items once prepared (api/server/batch.py): each item's state and line, the
items run through the same DecisionService (items sharing a state leader first, the others
concurrently under the batch's share of the in-flight slots), the lines in completion
order or as one NDJSON stream, every item recorded once (answered, failed, cut by the
drain, or unread: 499)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from openjev.api.contract.jev import convert
from openjev.core.caller import ANONYMOUS, Caller
from openjev.core.prompts import CompiledRequest
from openjev.core.readouts import ReadoutSpec
from openjev.core.service import DecisionService
from openjev.core.task_apply import TaskCalibration
from openjev.core.types import DecisionRequest, DecisionResult
from openjev.errors import Draining, OpenjevError

log = logging.getLogger("openjev.api.server.batch")  # the batch route's log, whichever module writes


@dataclass
class Item:
    index: int
    caller: Caller = ANONYMOUS  # the batch's caller: each item is decided and charged for it
    request: DecisionRequest | None = None
    model: str | None = None
    compiled: CompiledRequest | None = None
    readout: ReadoutSpec = field(default_factory=ReadoutSpec)  # the batch's x-openjev-readout / -rotations headers
    calibrate: bool = True
    tasks: Mapping[str, TaskCalibration] = field(default_factory=dict)  # by question id (api/server/task_binding.py)
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


def error_line(item: Item, exc: OpenjevError) -> dict[str, Any]:
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
ItemRecorder = Callable[[Item, int], None]


async def collect(lines: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line async for line in lines]


async def _decide(item: Item, service: DecisionService, gate: asyncio.Semaphore, done: asyncio.Queue[Item]) -> None:
    """Decide one prepared item under `gate`; its line (answer or error) is set, then it is
    put on `done`."""
    async with gate:
        try:
            request, model = item.prepared()
            result = await service.decide(
                request,
                item.compiled,
                caller=item.caller,
                readout=item.readout,
                calibrate=item.calibrate,
                tasks=item.tasks,
            )
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
            item.line = error_line(item, exc)
        except Exception:  # an item's bug is that item's 500, not the batch's
            log.exception("batch item %d failed", item.index)
            item.line = {
                "index": item.index,
                "status": 500,
                "error": {"error_type": "unknown", "message": "internal error"},
            }
    await done.put(item)


def _by_state(items: list[Item]) -> dict[Any, list[Item]]:
    """The prepared items (no line yet) grouped by their state, in item order."""
    groups: dict[Any, list[Item]] = {}
    for item in items:
        if item.line is None:
            groups.setdefault(item.prepared()[0].state, []).append(item)
    return groups


def _cut(items: list[Item], recorded: set[int]) -> Iterator[Item]:
    """The items not yet recorded when the drain ran out of time, one by one; those without
    a line get a 503 line (cut), those that finished meanwhile keep theirs."""
    cut = Draining("the server shut down before this item finished; retry")
    for item in items:
        if item.index in recorded:
            continue
        if item.line is None:
            item.line, item.cut = error_line(item, cut), True
        yield item


def _record_unread(items: list[Item], recorded: set[int], record: ItemRecorder) -> None:
    """The items nobody will read (the client went away), each recorded once as 499."""
    for item in items:
        if item.index not in recorded:
            recorded.add(item.index)
            record(item, 499)


async def _decide_group(
    members: list[Item], service: DecisionService, gate: asyncio.Semaphore, done: asyncio.Queue[Item]
) -> None:
    """Items on one state: the leader computes the shared state; the rest find it cached."""
    await _decide(members[0], service, gate, done)
    await asyncio.gather(*(_decide(m, service, gate, done) for m in members[1:]))


async def run(
    items: list[Item],
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

    def emit(item: Item) -> dict[str, Any]:
        line = item.finished()
        recorded.add(item.index)
        record(item, int(line.get("status", 200)))
        return line

    for item in items:
        if item.line is not None:
            yield emit(item)
    groups = _by_state(items)
    gate = asyncio.Semaphore(slots)
    done: asyncio.Queue[Item] = asyncio.Queue()

    tasks = [asyncio.create_task(_decide_group(members, service, gate, done)) for members in groups.values()]
    stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
    getter: asyncio.Future[Item] | None = None
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
        await _settle([w for w in (stopped, getter, *tasks) if w is not None])
        _record_unread(items, recorded, record)


async def _settle(pending: list[asyncio.Future[Any]]) -> None:
    """Cancel what still runs and await it, shielded: a client gone mid-stream cancels the
    stream (Starlette's cancel scope, which would cancel every await here again), and none
    may be left pending."""
    with anyio.CancelScope(shield=True):
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def ndjson(
    items: list[Item],
    service: DecisionService,
    slots: int,
    t0: float,
    record: ItemRecorder,
    drained: asyncio.Event,
    facts: dict[str, Any],
) -> AsyncIterator[bytes]:
    usage = {"input_tokens": 0, "output_tokens": 0, "x_prompt_tokens": 0}  # x_computed/x_cached: where known
    ok = cut = 0
    async for line in run(items, service, slots, record, drained):
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
