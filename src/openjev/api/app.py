"""The app factory: builds the object graph once (settings -> engine -> compiler -> service)
and the routes over it. The model loads in the background: /health says 503 until it is
ready, /health/live answers throughout."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from openjev import __version__, calibrations
from openjev.api import batch, convert, disclosure, documented, playground, schemas, tenancy, wire
from openjev.api.auth import require_key
from openjev.api.middleware import REQUEST_ID_HEADER, BodyMiddleware, RequestIdMiddleware, error_response, request_id_of
from openjev.api.ops import Operations, OpsMiddleware
from openjev.api.overrides import decide_options, default_spec
from openjev.api.responses import FastJSONResponse
from openjev.config import MAX_CHOICE_OPTIONS, Settings
from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService, ServiceLimits
from openjev.core.wording import PROMPT_VERSION
from openjev.engines import LoadedEngine, ModelCard, load_engine
from openjev.errors import ClientDisconnected, EngineUnavailable, NotReady, OpenjevError

log = logging.getLogger(__name__)

Loader = Callable[[Settings], LoadedEngine]

# POST routes with the /v1/systemone contract: the vendor's name first, then the aliases.
SYSTEMONE_ROUTES = ("/v1/systemone", "/v1/decisions", "/api/alpha/decisions")

DESCRIPTION = """\
An open server for the Jev SystemOne decision API. Each question is answered by **reading**
the model: one prefill per branch and the probabilities of the answer labels at the last
position. No text is generated.
"""


@dataclass
class Runtime:
    """What the routes need once the model has loaded."""

    settings: Settings
    service: DecisionService | None = None
    loaded: LoadedEngine | None = None
    error: BaseException | None = None

    def ready(self) -> tuple[DecisionService, ModelCard]:
        if self.service is not None and self.loaded is not None:
            return self.service, self.loaded.card
        if self.error is not None:
            raise EngineUnavailable(disclosure.load_failure(self.error), detail=disclosure.log_text(self.error))
        raise NotReady("the model is still loading")


def build_service(settings: Settings, loaded: LoadedEngine) -> DecisionService:
    """Blocking (label verification encodes a few hundred short texts). Raises ConfigError
    for a calibration made for another model, prompt or temperature, Unsupported for a
    default readout this model cannot do."""
    calibration = calibrations.select(
        settings.calibration,
        fingerprint=loaded.card.fingerprint,
        prompt_version=PROMPT_VERSION,
        base_temperature=settings.temperature,
    )
    spec = default_spec(settings)
    if calibration is not None:
        log.info(
            "calibration %s (%s) applied to %s",
            calibration.id,
            calibration.source or "given file",
            ", ".join(f.spec.describe() for f in calibration.fits),
        )
        if not calibration.covers(spec):
            log.warning(
                "calibration %s has no fit for the default readout %s: its answers are uncalibrated",
                calibration.id,
                spec.describe(),
            )
    compiler = PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)
    limits = ServiceLimits(
        max_branch_tokens=settings.max_branch_tokens,
        max_request_tokens=settings.max_request_tokens,
        max_in_flight=settings.max_in_flight,
        engine_timeout_s=settings.engine_timeout_s,
        retry_after_s=settings.retry_after_s,
        temperature=settings.temperature,
        rotation_max_options=settings.rotation_max_options,
    )
    return DecisionService(compiler, loaded.engine, limits, readout=spec, calibration=calibration)


def create_app(
    settings: Settings,
    loader: Loader = load_engine,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPIOffline:
    """The ASGI app. `loader` loads the engine (off the event loop, at startup); a failure is
    kept for /health and passed to `on_fatal` (the CLI exits non-zero on it)."""
    runtime = Runtime(settings)
    ops = Operations(settings, runtime)  # keys, limits, metrics, drain (api/ops.py)

    async def load() -> None:
        try:
            loaded = await asyncio.to_thread(loader, settings)
            loaded = dataclasses.replace(loaded, engine=ops.gated(loaded.engine))
            runtime.loaded = loaded
            runtime.service = await asyncio.to_thread(build_service, settings, loaded)
            if loaded.supervise is not None:
                loaded.supervise(lambda exc: _fatal(exc))
            log.info("serving %s", loaded.card.name)
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed: /health shows it, on_fatal exits
            log.error("model failed to load: %s", disclosure.log_text(exc))
            _fatal(exc)

    def _fatal(exc: BaseException) -> None:
        runtime.error = exc
        runtime.service = None
        if on_fatal is not None:
            on_fatal(exc)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(load())
        try:
            yield
        finally:
            task.cancel()
            if runtime.loaded is not None:
                await runtime.loaded.engine.close()

    app = FastAPIOffline(
        title="openjev",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.ops = ops
    app.add_middleware(BodyMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(OpsMiddleware, ops=ops)  # keys checked before the body is read
    app.add_middleware(RequestIdMiddleware)  # outermost of ours: ids on 413/415 too
    wire.install(app)  # every JSON body parsed strictly (api/wire.py); 422s that cannot fail

    @app.exception_handler(OpenjevError)
    async def _openjev_error(request: Request, exc: OpenjevError) -> JSONResponse:
        exc = disclosure.public(exc)
        disclosure.remember(request.scope, exc)  # the detail goes to the access log only
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request" if exc.status_code < 500 else "unknown"
        return JSONResponse(
            {"detail": {"error_type": kind, "message": str(exc.detail)}},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Runs outside our middleware (Starlette's ServerErrorMiddleware), so add the id here.
        log.exception("unexpected error")
        return JSONResponse(
            {"detail": {"error_type": "unknown", "message": "internal error"}},
            status_code=500,
            headers={REQUEST_ID_HEADER: request_id_of(request.scope) or ""},
        )

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
        decision = tenancy.scoped(convert.request_of(body))
        spec, calibrate = decide_options(request.headers, settings)
        service, card = runtime.ready()
        model = convert.resolve_model(body.model, card.name)
        result = await _unless_disconnected(request, service.decide(decision, readout=spec, calibrate=calibrate))
        request.state.result = result  # for the access log and metrics (api/ops.py)
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
    batch.install(app, settings, runtime.ready, _unless_disconnected)
    playground.install(app)

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
        responses={**documented.UNAUTHORIZED, **documented.RATE_LIMITED},
    )
    async def limits() -> dict[str, Any]:
        return settings.limits()

    @app.get(
        "/health",
        summary="200 once the model is loaded, 503 before (or if loading failed)",
        responses=documented.HEALTH,
    )
    async def health() -> JSONResponse:
        if runtime.loaded is not None and runtime.service is not None:
            return JSONResponse(
                {
                    "status": "ok",
                    "model": runtime.loaded.card.name,
                    "load_seconds": round(runtime.loaded.load_seconds, 2),
                    "in_flight": runtime.service.in_flight,
                }
            )
        if runtime.error is not None:
            return JSONResponse({"status": "failed", "error": disclosure.load_failure(runtime.error)}, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/health/live", summary="200 while the process serves HTTP")
    async def live() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def _unless_disconnected(request: Request, work):
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
