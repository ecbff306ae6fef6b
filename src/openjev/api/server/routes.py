"""The routes over the runtime: the decision routes of every wire format (one pipeline,
api/server/pipeline.py; the formats registered in api/contract/formats.py), the batch
(api/server/batch.py), models, limits and health."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from openjev.api.contract import documented, paths
from openjev.api.contract.formats import FORMATS
from openjev.api.contract.jev import schemas
from openjev.api.contract.jev.format import JEV
from openjev.api.identity.auth import require_key
from openjev.api.identity.caller import caller_of, entry_of
from openjev.api.operations import disclosure
from openjev.api.server import batch, pipeline, playground, task_routes
from openjev.api.server.assembly import Runtime
from openjev.api.server.limits import limits_body
from openjev.api.server.outcomes import routes as outcome_routes
from openjev.config import QualitySettings, Settings
from openjev.core.wording import PROMPT_VERSION

# POST routes with the /v1/systemone contract: the vendor's name first, then the aliases.
SYSTEMONE_ROUTES = JEV.paths


def install(app: FastAPI, settings: Settings, runtime: Runtime) -> None:
    """Every route of the API (the playground's page included)."""
    for fmt in FORMATS:
        pipeline.install(app, fmt, settings.quality, settings.limits, runtime)
    batch.install(app, settings.quality, settings.limits, runtime.ready)
    playground.install(app)
    install_models(app, settings.quality, runtime)
    install_limits(app, settings, runtime)
    install_health(app, runtime)
    if app.state.tasks is not None:
        task_routes.install(app, settings.tasks, runtime, app.state.tasks)
    outcome_routes.install(app, app.state.outcomes)


def install_models(app: FastAPI, quality: QualitySettings, runtime: Runtime) -> None:
    @app.get(
        paths.MODELS,
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
                    "x_context_length": card.context_length,
                    "x_prompt_version": PROMPT_VERSION,
                    "x_temperature": quality.temperature,
                    "x_readout": service.default_readout.describe(),
                    "x_readouts": service.readouts_offered(quality.rotations),
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


def install_limits(app: FastAPI, settings: Settings, runtime: Runtime) -> None:
    """GET /v1/limits: its body reports settings of several sections (api/server/limits.py)."""

    @app.get(
        paths.LIMITS,
        dependencies=[Depends(require_key)],
        summary="The limits this server enforces, the calling key's own included",
        responses={**documented.CONNECTION_ERRORS, **documented.UNAUTHORIZED, **documented.RATE_LIMITED},
    )
    async def limits(request: Request) -> dict[str, Any]:
        return limits_body(settings, entry_of(caller_of(request)), runtime.service, request.app.state.ops.store_state())


def install_health(app: FastAPI, runtime: Runtime) -> None:
    @app.get(
        paths.HEALTH,
        summary="200 once the model is loaded and its engine server answers; 503 before, if loading failed, "
        "or while the engine server does not answer",
        responses=documented.HEALTH,
    )
    async def health(request: Request) -> JSONResponse:
        if runtime.loaded is not None and runtime.service is not None:
            problem = await runtime.loaded.probe() if runtime.loaded.probe is not None else None
            if problem is not None:  # an engine server that died or stalls: not ready
                return JSONResponse({"status": "engine_unavailable", "error": problem}, status_code=503)
            # how busy others keep the server, and its limits' store: a key's holder's to see
            # (api/identity/door.py)
            operator = getattr(request.state, "sees_load", False)
            return JSONResponse(
                {
                    "status": "ok",
                    "model": runtime.loaded.card.name,
                    "load_seconds": round(runtime.loaded.load_seconds, 2),
                    **({"in_flight": runtime.service.in_flight} if operator else {}),
                    **({"limits_store": request.app.state.ops.store_state()} if operator else {}),
                }
            )
        if runtime.error is not None:
            return JSONResponse({"status": "failed", "error": disclosure.load_failure(runtime.error)}, status_code=503)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get(paths.LIVE, summary="200 while the process serves HTTP")
    async def live() -> dict[str, str]:
        return {"status": "ok"}
