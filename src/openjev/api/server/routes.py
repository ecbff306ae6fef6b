"""The routes over the runtime: decisions (/v1/systemone and its aliases; the batch lives in
api/server/batch.py), models, limits and health."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from openjev.api.contract import convert, documented, schemas, wire
from openjev.api.contract.overrides import decide_options
from openjev.api.contract.responses import FastJSONResponse
from openjev.api.identity import tenancy
from openjev.api.identity.admission import charge_refused
from openjev.api.identity.auth import require_key
from openjev.api.operations import disclosure
from openjev.api.server import batch, openai_routes, playground
from openjev.api.server.assembly import Runtime
from openjev.config import Settings
from openjev.core.types import DecisionRequest
from openjev.core.wording import PROMPT_VERSION
from openjev.errors import ClientDisconnected, TokensExceeded

T = TypeVar("T")

# POST routes with the /v1/systemone contract: the vendor's name first, then the aliases.
# (/v1/decisions is OpenAI's Decisions format: api/server/openai_routes.py.)
SYSTEMONE_ROUTES = ("/v1/systemone", "/api/alpha/decisions")


def install(app: FastAPI, settings: Settings, runtime: Runtime) -> None:
    """Every route of the API (the playground's page included)."""
    install_decisions(app, settings, runtime)
    openai_routes.install(app, settings, runtime, unless_disconnected)
    batch.install(app, settings, runtime.ready, unless_disconnected)
    playground.install(app)
    install_models(app, settings, runtime)
    install_health(app, runtime)


def install_decisions(app: FastAPI, settings: Settings, runtime: Runtime) -> None:
    async def systemone(body: schemas.SystemOneRequest, request: Request) -> JSONResponse:
        if len(body.questions) > settings.max_questions:
            raise RequestValidationError(
                [
                    {
                        "loc": ("body", "questions"),
                        "type": "too_long",
                        "input": None,
                        "msg": f"at most {settings.max_questions} questions per request, got {len(body.questions)}",
                    }
                ]
            )
        decision = tenancy.scoped(await convert_off_loop(request, body))
        spec, calibrate = decide_options(request.headers, settings)
        service, card = runtime.ready()
        model = convert.resolve_model(body.model, card.name)
        try:
            result = await unless_disconnected(request, service.decide(decision, readout=spec, calibrate=calibrate))
        except TokensExceeded as exc:
            charge_refused(request.app.state.ops.key_limits, exc)
            raise
        request.state.result = result  # for the access log and metrics (api/operations/access.py)
        return FastJSONResponse(convert.result_to_wire(result, model), headers=convert.result_headers(result))

    # The same handler under the route names other Jev-compatible servers use.
    for path in SYSTEMONE_ROUTES:
        app.add_api_route(
            path,
            systemone,
            methods=["POST"],
            response_model=schemas.SystemOneResponse,
            responses=documented.DECISION_ERRORS,
            openapi_extra={"parameters": documented.READOUT_HEADERS},
            dependencies=[Depends(require_key)],
            summary="Answer typed questions about a state"
            + ("" if path == SYSTEMONE_ROUTES[0] else f" (alias of {SYSTEMONE_ROUTES[0]})"),
        )


def install_models(app: FastAPI, settings: Settings, runtime: Runtime) -> None:
    @app.get(
        "/v1/models",
        response_model=schemas.ModelsResponse,
        dependencies=[Depends(require_key)],
        responses=documented.READ_ERRORS,
    )
    async def models() -> dict[str, Any]:
        service, card = runtime.ready()
        cal = service.calibration
        return {
            "models": [
                {
                    "name": card.name,
                    "description": card.description,
                    "release_date": card.release_date,
                    "x_fingerprint": card.fingerprint,
                    "x_prompt_version": PROMPT_VERSION,
                    "x_temperature": settings.temperature,
                    "x_readout": service.default_readout.describe(),
                    "x_readouts": service.readouts_offered(settings.rotations),
                    "x_abstain": service.abstain.describe(),
                    "x_calibration": None
                    if cal is None
                    else {
                        "id": cal.id,
                        "readouts": [f.spec.describe() for f in cal.fits],
                        "applies_to_default": cal.covers(service.default_readout),
                    },
                }
            ],
            "data": [{"id": card.name, "object": "model", "owned_by": "openjev"}],
        }

    @app.get(
        "/v1/limits",
        dependencies=[Depends(require_key)],
        summary="The limits this server enforces",
        responses={**documented.CONNECTION_ERRORS, **documented.UNAUTHORIZED, **documented.RATE_LIMITED},
    )
    async def limits() -> dict[str, Any]:
        out = settings.limits()
        if runtime.service is not None:  # the rule in force: the served model's file may have set it
            out["abstain"] = runtime.service.abstain.describe()
        return out


def install_health(app: FastAPI, runtime: Runtime) -> None:
    @app.get(
        "/health",
        summary="200 once the model is loaded and its engine server answers; 503 before, if loading failed, "
        "or while the engine server does not answer",
        responses=documented.HEALTH,
    )
    async def health(request: Request) -> JSONResponse:
        if runtime.loaded is not None and runtime.service is not None:
            problem = await runtime.loaded.probe() if runtime.loaded.probe is not None else None
            if problem is not None:  # an engine server that died or stalls: not ready
                return JSONResponse({"status": "engine_unavailable", "error": problem}, status_code=503)
            return JSONResponse(
                {
                    "status": "ok",
                    "model": runtime.loaded.card.name,
                    "load_seconds": round(runtime.loaded.load_seconds, 2),
                    # how busy others keep the server: a key's holder's to see (api/identity/admission.py)
                    **({"in_flight": runtime.service.in_flight} if getattr(request.state, "sees_load", False) else {}),
                }
            )
        if runtime.error is not None:
            return JSONResponse({"status": "failed", "error": disclosure.load_failure(runtime.error)}, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/health/live", summary="200 while the process serves HTTP")
    async def live() -> dict[str, str]:
        return {"status": "ok"}


async def convert_off_loop(request: Request, body: schemas.SystemOneRequest) -> DecisionRequest:
    """The body as a core request; in a worker thread where the body is large (a state of
    66,000 chat turns takes tens of milliseconds to convert: not on the event loop)."""
    if len(await request.body()) <= wire.THREAD_FROM_BYTES:
        return convert.request_of(body)
    return await asyncio.to_thread(convert.request_of, body)


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
