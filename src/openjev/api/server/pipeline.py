"""The one decision pipeline: every decision route, whatever its wire format, and every batch
item run these steps, in this order. A format (api/contract/format_port.py `WireFormat`) supplies
only its parser, converter, renderers, paths and docs.

1. the body parsed strictly and validated (api/contract/json_route.py `WireRoute`, off the event
   loop for a large body);
2. `admitted`: the question count, the conversion to the core's request (in a worker thread
   for a large body: `convert_off_loop`), the caller's cache namespace and the format's
   partition in it (the caller, made at the door, is taken from the request once:
   api/identity/caller.py `caller_of`, and passed on as an argument from there);
3. the readout headers (api/contract/overrides.py), the runtime's service, the model asked for;
4. the decision for the caller, watched for the client leaving (`unless_disconnected`), the
   work of a refused request charged to the caller's key (`charging`);
5. the result on `request.state` (the access log and the metrics read it there,
   api/operations/access.py), rendered by the format with the readout headers.

Errors are raised, never rendered here: api/server/handlers.py makes each one `Problem`,
and the request's format renders it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from openjev.api.contract import common, documented, strict_json
from openjev.api.contract.format_port import WireFormat
from openjev.api.contract.overrides import TASK_HEADER, decide_options
from openjev.api.contract.responses import FastJSONResponse
from openjev.api.identity import tenancy
from openjev.api.identity.auth import require_key
from openjev.api.identity.caller import caller_of, charge_refused, charge_refused_async
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.operations.middleware import request_id_of
from openjev.api.server.assembly import Runtime
from openjev.api.server.outcomes import routes as outcomes
from openjev.api.server.task_binding import fits_of, named_task, prefetched
from openjev.config import LimitSettings, QualitySettings
from openjev.core.caller import Caller
from openjev.core.readouts import ReadoutSpec
from openjev.core.service import DecisionService
from openjev.core.task_apply import TaskCalibration
from openjev.core.types import DecisionRequest
from openjev.errors import ClientDisconnected, TokensExceeded

log = logging.getLogger(__name__)

T = TypeVar("T")


def admitted(fmt: WireFormat, body: Any, max_questions: int, caller: Caller) -> DecisionRequest:
    """Step 2 of the module doc (the model aside), on the calling thread (a worker thread for
    a large body): the core request, in `caller`'s cache namespace and its partition."""
    return tenancy.partitioned(caller.scope(fmt.convert(body, max_questions)), fmt.partition(body))


@contextmanager
def charging(key_limits: KeyLimits, caller: Caller) -> Iterator[None]:
    """A request refused for its tokens charges the work it cost to `caller`'s key, so
    that a refused body cannot be repeated for free (api/identity/caller.py)."""
    try:
        yield
    except TokensExceeded as exc:
        charge_refused(key_limits, caller, exc)
        raise


@asynccontextmanager
async def charged(key_limits: KeyLimits, caller: Caller) -> AsyncIterator[None]:
    """`charging` on the event loop: the charge is in the store before the refusal is answered."""
    try:
        yield
    except TokensExceeded as exc:
        await charge_refused_async(key_limits, caller, exc)
        raise


async def convert_off_loop(
    request: Request, fmt: WireFormat, body: Any, max_questions: int, caller: Caller
) -> DecisionRequest:
    """`admitted`, in a worker thread where the body is large (a state of 66,000 chat turns
    takes tens of milliseconds to convert: not on the event loop)."""
    if len(await request.body()) <= strict_json.THREAD_FROM_BYTES:
        return admitted(fmt, body, max_questions, caller)
    return await asyncio.to_thread(admitted, fmt, body, max_questions, caller)


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client goes away (no one would read the answer)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise ClientDisconnected("the client went away before the answer was ready")
    finally:
        if not task.done():
            task.cancel()


async def task_binder(
    request: Request,
    caller: Caller,
    spec: ReadoutSpec | None,
    service: DecisionService,
    fingerprint: str,
    quality: QualitySettings,
    names: Iterable[object],
    calibrate: bool = True,
) -> Callable[[DecisionRequest, str | None], Mapping[str, TaskCalibration]]:
    """For a decision request of this HTTP request and the task its body names (if any, one
    of `names`, the body's task fields): by question id, the task fit of `caller`'s tenant
    that answers it (api/server/task_binding.py; `x-openjev-task`, the body's, or the
    question's wording). The named tasks are read here, from the store's thread; the binder
    itself reads no file. None where the caller sent `x-openjev-calibration: none`
    (`calibrate` false): the raw reading wins over any task."""
    if not calibrate:
        return lambda _decision, _named: {}
    jobs = request.app.state.tasks
    lookup = jobs.lookup if jobs is not None else None
    header = request.headers.get(TASK_HEADER)
    model = (fingerprint, quality.temperature, service.abstain)
    resolved = service.resolve(spec or service.default_readout)
    tenant = caller.tenant
    found = await prefetched(lookup, tenant, (header, *names))
    return lambda decision, named: fits_of(lookup, tenant, named_task(header, named), decision, found, resolved, model)


async def decide(
    fmt: WireFormat, body: Any, request: Request, quality: QualitySettings, max_questions: int, runtime: Runtime
) -> Response:
    """One decision request on `fmt`, through every step of the module doc."""
    key_limits = request.app.state.ops.key_limits
    caller = caller_of(request)
    decision = await convert_off_loop(request, fmt, body, max_questions, caller)
    spec, calibrate = decide_options(request.headers, quality)
    service, card = runtime.ready()
    model = common.resolve_model(fmt.model_of(body), card.name)
    audit = fmt.audit(body)
    if audit:
        log.info(fmt.name + " request", extra={"fields": {"request_id": request_id_of(request.scope), **audit}})
    async with charged(key_limits, caller):
        bind = await task_binder(
            request, caller, spec, service, card.fingerprint, quality, (fmt.task_of(body),), calibrate
        )
        tasks = bind(decision, fmt.task_of(body))
        work = service.decide(decision, caller=caller, readout=spec, calibrate=calibrate, tasks=tasks)
        result = await unless_disconnected(request, work)
    request.state.result = result  # for the access log and metrics (api/operations/access.py)
    outcomes.decided(request, decision, result, spec, body)  # kept for /v1/outcomes (queued, never waited on)
    return FastJSONResponse(fmt.render(body, result, model), headers=common.result_headers(result))


def install(app: FastAPI, fmt: WireFormat, quality: QualitySettings, limits: LimitSettings, runtime: Runtime) -> None:
    """`fmt`'s routes: one handler, under each of its paths (the first its own name)."""

    async def endpoint(body: Any, request: Request) -> Response:
        return await decide(fmt, body, request, quality, limits.max_questions, runtime)

    # FastAPI reads the body model from the signature: the format's own.
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=fmt.body),
            inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
        ]
    )
    own = fmt.paths[0]
    for path in fmt.paths:
        app.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            response_model=fmt.response,
            responses=fmt.responses,
            openapi_extra={"parameters": documented.READOUT_HEADERS},
            dependencies=[Depends(require_key)],
            summary=fmt.summary + ("" if path == own else f" (alias of {own})"),
            name=f"{fmt.name}:{path}",
        )
