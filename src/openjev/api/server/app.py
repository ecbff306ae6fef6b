"""The app factory: builds the object graph once (settings -> engine -> compiler -> service)
and wires it to the middleware, the error handlers and the routes. Each piece lives with
its job: api/server/assembly.py (the graph and its lifecycle: the model loads in the background,
/health says 503 until it is ready, /health/live answers throughout), api/server/handlers.py (the
error shapes), api/server/routes.py (decisions, models, limits, health)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from openjev import __version__
from openjev.api.contract import json_route
from openjev.api.identity.door import AdmissionMiddleware
from openjev.api.identity.hosts import HostMiddleware, HostPolicy
from openjev.api.operations.access import AccessLogMiddleware, MetricsEndpoint
from openjev.api.operations.middleware import BodyMiddleware, ErrorMiddleware, HeadMiddleware, RequestIdMiddleware
from openjev.api.operations.page_headers import PageHeadersMiddleware
from openjev.api.server import handlers, routes
from openjev.api.server.assembly import Loader, Runtime, build_service, lifespan
from openjev.api.server.conventions import ConventionsMiddleware
from openjev.api.server.drain import DrainMiddleware
from openjev.api.server.operator_state import Operations
from openjev.api.server.outcomes import lifecycle
from openjev.api.server.playground import page_policies
from openjev.api.server.routes import SYSTEMONE_ROUTES
from openjev.api.server.task_jobs import open_jobs
from openjev.config import Settings
from openjev.engines import load_engine

__all__ = ["SYSTEMONE_ROUTES", "Loader", "Runtime", "build_service", "create_app"]

DESCRIPTION = """\
An open server for the Jev SystemOne decision API (`/v1/systemone`) and OpenAI's Decisions
format (`/v1/decisions`), on one core. Each question is answered by **reading**
the model: one prefill per branch and the probabilities of the answer labels at the last
position. No text is generated.
"""


def create_app(
    settings: Settings,
    loader: Loader = load_engine,
    on_fatal: Callable[[BaseException], None] | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> FastAPI:
    """The ASGI app. `loader` loads the engine (off the event loop, at startup); a failure is
    kept for /health and passed to `on_fatal` (the CLI exits non-zero on it); `on_loaded`
    runs once the service is built, in a worker thread, before the first decision."""
    runtime = Runtime(settings)
    ops = Operations(  # keys, limits, metrics, drain (api/server/operator_state.py)
        settings.keys,
        settings.limits,
        runtime,
        trusted_proxies=settings.listen.trusted_proxies,
        log_bodies=settings.logging.log_request_bodies,
        fleet=settings.fleet,
    )
    meta: dict[str, Any] = {"title": "openjev", "version": __version__, "description": DESCRIPTION}
    jobs = open_jobs(settings, runtime)  # /v1/tasks: its store opened and checked now, at start
    run = ops.closing(lifespan(runtime, ops.admission, loader, on_fatal, on_loaded))
    run = jobs.wrap(run) if jobs is not None else run
    outcomes = lifecycle.assemble(settings.tasks, jobs, ops.metrics.registry)  # /v1/outcomes, decisions recorded
    run = lifecycle.wrap(outcomes, run)
    if settings.listen.docs == "off":  # `openjev schema` (app.openapi()) works either way
        app = FastAPI(**meta, lifespan=run, openapi_url=None, docs_url=None, redoc_url=None)
    else:  # docs with their assets served from the package; `auth` is checked in api/identity/door.py
        app = FastAPIOffline(**meta, lifespan=run)
    app.state.max_json_depth = settings.limits.max_json_depth  # read by every JSON route (api/contract/strict_json.py)
    app.state.runtime = runtime
    app.state.ops = ops
    app.state.tasks = jobs  # read by the decision routes (api/server/task_binding.py)
    app.state.outcomes = outcomes  # read by the decision routes (api/server/outcomes/routes.py `decided`)
    _middleware(app, settings, ops)
    json_route.install(app)  # every JSON body parsed strictly (api/contract/json_route.py); 422s that cannot fail
    handlers.install(app)
    routes.install(app, settings, runtime)
    return app


def _middleware(app: FastAPI, settings: Settings, ops: Operations) -> None:
    """The middleware, added from the innermost out."""
    app.add_middleware(HeadMiddleware)  # innermost: HEAD routed as GET
    app.add_middleware(
        BodyMiddleware, max_bytes=settings.limits.max_body_bytes, timeout_s=settings.connections.body_timeout_s
    )
    # What operators need around the routes, one job per middleware (api/server/operator_state.py):
    app.add_middleware(DrainMiddleware, drain=ops.drain)  # /health 503 and decisions refused once draining
    app.add_middleware(MetricsEndpoint, metrics=ops.metrics)  # GET /metrics, behind the key off this machine
    app.add_middleware(  # keys and the key's requests/min checked before the body is read
        AdmissionMiddleware,
        keys=ops.keys,
        key_limits=ops.key_limits,
        proxies=ops.proxies,
        docs_auth=settings.listen.docs == "auth",
        open_per_key=settings.connections.max_connections_per_client,
    )
    app.add_middleware(ErrorMiddleware)  # what those raise, and bugs, in the contract's error shape
    # Outside ErrorMiddleware, so a 429 or 401 answered at the door carries them too.
    app.add_middleware(ConventionsMiddleware, key_limits=ops.key_limits)  # x-request-id, x-ratelimit-* (OpenAI)
    app.add_middleware(AccessLogMiddleware, access=ops.access)  # one log line and the metrics per request
    hosts = HostPolicy.of(settings.listen)
    if hosts is not None:  # DNS rebinding: before the key and the body
        app.add_middleware(HostMiddleware, policy=hosts)
    app.add_middleware(RequestIdMiddleware)  # outermost of ours: ids on 413/415 too
    app.add_middleware(PageHeadersMiddleware, policies=page_policies(settings.listen.docs != "off"))
