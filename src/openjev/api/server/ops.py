"""What operators need around the routes, as one pure ASGI middleware (just inside the
request-id one, outside the body reader):

- authentication and the per-key requests/min bucket, *before* the body is read or
  parsed (an unauthenticated request is a 401 whatever it sends);
- the drain: /health says 503 and new decisions are refused once SIGTERM arrived; a
  request cut short by the drain timeout is answered 503;
- GET /metrics (Prometheus text, from this app's registry);
- one access log line and the request metrics per HTTP request, with no request text,
  and one per batch item (`record_item`, under the batch's request id);
- exceptions nothing else handled: a JSON 500 and one log line (type and frames, no
  message), instead of uvicorn's plain-text 500 and its traceback with the message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openjev.api.identity.admission import GatedEngine, stats_of
from openjev.api.identity.keys import KeyEntry, KeyLimits, KeyRing, current_key
from openjev.api.identity.proxies import TrustedProxies
from openjev.api.operations import disclosure
from openjev.api.operations.logs import ACCESS
from openjev.api.operations.metrics import CONTENT_TYPE, Metrics
from openjev.api.operations.middleware import REQUEST_ID_HEADER, error_response, request_id_of
from openjev.api.server.drain import Drain
from openjev.config import Settings
from openjev.errors import AuthenticationError, Draining, OpenjevError

log = logging.getLogger(__name__)
access_log = logging.getLogger(ACCESS)

# Route labels: the served paths, everything else "other" (bounded label values).
# Decision routes: the vendor's, its aliases and the batch (admission, per-key limits, drain).
DECISION_ROUTES = ("/v1/systemone", "/v1/decisions", "/api/alpha/decisions", "/v1/systemone/batch")
ROUTES = (
    *DECISION_ROUTES,
    "/",
    "/playground",
    "/v1/models",
    "/v1/limits",
    "/health",
    "/health/live",
    "/metrics",
    "/docs",
    "/redoc",
    "/openapi.json",
)


# After the drain timeout, how long a response already streaming may take to end itself
# (503 lines for its unfinished items, its summary, the final chunk) before it is cut.
STREAM_END_S = 3.0

# The API docs: behind the API's key with --docs auth, their static assets too (the largest
# responses the server has: open, they let anyone hold connections with unread answers).
DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
DOCS_ASSETS = "/static-offline-docs/"


def route_of(path: str) -> str:
    return path if path in ROUTES else "other"


def _loopback(scope: Scope, proxies: TrustedProxies) -> bool:
    """A client on this machine (a forwarded one only where --trusted-proxies says so)."""
    if not scope.get("client"):
        return True  # in-process (tests, ASGI transports): nothing came over a network
    client = proxies.client(scope)
    return client is not None and client.is_loopback


class Operations:
    """The operators' state of one app: keys, per-key buckets, metrics, drain, token gate."""

    def __init__(self, settings: Settings, runtime: Any) -> None:
        self.settings = settings
        self.runtime = runtime
        self.keys = KeyRing(settings.api_keys, settings.api_keys_file)
        self.key_limits = KeyLimits(settings.key_requests_per_min, settings.key_tokens_per_min)
        self.drain = Drain(settings.drain_timeout)
        self.metrics = Metrics(self._probe)
        self.gate: GatedEngine | None = None
        self.proxies = TrustedProxies(settings.trusted_proxies)
        # Set by the server's protocol (api/operations/connections.py) when it serves this app.
        self.connection_stats: Callable[[], dict[str, float]] | None = None

    def gated(self, engine):
        """The engine the service calls: gated by tokens in flight and per-key tokens/min."""
        self.gate = GatedEngine(
            engine,
            max_tokens_in_flight=self.settings.max_tokens_in_flight,
            max_wait_s=self.settings.max_queue_wait,
            key_limits=self.key_limits,
            metrics=self.metrics,
            retry_after_s=self.settings.retry_after_s,
        )
        return self.gate

    def record_item(
        self,
        scope: Scope,
        index: int,
        status: int,
        line: dict[str, Any] | None,
        result: Any,
        started: float,
    ) -> None:
        """A batch item's metrics and access-log line, as a request of its own would have
        them (answers, tokens, status, rejection), under the batch's request id."""
        key = scope.get("state", {}).get("key_name") or "-"
        error = (line or {}).get("error") or {}
        error_type = error.get("error_type") if status >= 400 else ("client_closed_request" if status == 499 else None)
        duration_s = time.perf_counter() - started
        fields: dict[str, Any] = {
            "request_id": request_id_of(scope),
            "key": key,
            "method": scope.get("method"),
            "route": "/v1/systemone/batch",
            "item": index,
            "status": status,
            "error_type": error_type,
            "duration_ms": round(duration_s * 1000, 2),
        }
        try:
            self.metrics.observe_item(status, key, error_type)
            if result is not None:
                self.metrics.observe_result(result)
                fields.update(result_fields(result))
        except Exception:  # metrics must never fail a request
            log.exception("metrics failed")
        level = logging.WARNING if status >= 500 and status != 503 else logging.INFO
        access_log.log(level, "batch item", extra={"fields": fields})

    def _probe(self) -> dict[str, float]:
        service = getattr(self.runtime, "service", None)
        out: dict[str, float] = {"draining": float(self.drain.draining), "ready": float(service is not None)}
        if service is not None:
            out["evaluations_in_flight"] = service.in_flight
        if self.connection_stats is not None:
            out.update(self.connection_stats())
        if self.gate is not None:
            out.update(self.gate.stats())
        elif getattr(self.runtime, "loaded", None) is not None:
            out.update(stats_of(self.runtime.loaded.engine))
        return out


class OpsMiddleware:
    def __init__(self, app: ASGIApp, ops: Operations) -> None:
        self.app = app
        self.ops = ops
        self.bodies = ops.settings.log_request_bodies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path, method = scope["path"], scope["method"]
        state = scope.setdefault("state", {})
        sent: dict[str, Any] = {"status": None, "error_type": None, "error_body": []}

        async def send_tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
            elif message["type"] == "http.response.body" and (sent["status"] or 0) >= 400:
                sent["error_body"].append(message.get("body", b""))
            await send(message)

        entry: KeyEntry | None = None
        try:
            entry = self._authenticate(scope, path)
            state["key_name"] = entry.name if entry else None
            token = current_key.set(entry)
            try:
                await self._dispatch(scope, receive, send_tracked, path, method)
            finally:
                current_key.reset(token)
        except OpenjevError as exc:
            exc = disclosure.public(exc)
            disclosure.remember(scope, exc)
            await error_response(exc, request_id_of(scope))(scope, receive, send_tracked)
        except Exception as exc:  # a bug: answer JSON, log without the message (it may quote input)
            log.error(
                "unexpected error on %s %s",
                method,
                route_of(path),
                exc_info=exc,
                extra={"fields": {"request_id": request_id_of(scope)}},
            )
            if sent["status"] is None:
                response = JSONResponse(
                    {"detail": {"error_type": "unknown", "message": "internal error"}}, status_code=500
                )
                await response(scope, receive, send_tracked)
        finally:
            self._record(scope, path, method, entry, sent, time.perf_counter() - t0)

    def _authenticate(self, scope: Scope, path: str) -> KeyEntry | None:
        """The caller's key where one is needed (raises 401/429); None where none is."""
        keys = self.ops.keys
        guarded = (
            path.startswith("/v1/")
            or path in DECISION_ROUTES
            or (path == "/metrics" and not _loopback(scope, self.ops.proxies))
            or ((path in DOCS_ROUTES or path.startswith(DOCS_ASSETS)) and self.ops.settings.docs == "auth")
        )
        if not keys.enabled or not guarded:
            return None
        header = Headers(scope=scope).get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise AuthenticationError("missing API key: send Authorization: Bearer <key>")
        entry = keys.identify(given.strip())
        if entry is None:
            raise AuthenticationError("invalid API key")
        if path in DECISION_ROUTES:
            self.ops.key_limits.take_request(entry)
        return entry

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send, path: str, method: str) -> None:
        drain = self.ops.drain
        if path == "/metrics" and method in ("GET", "HEAD"):
            await Response(self.ops.metrics.exposition(), media_type=CONTENT_TYPE)(scope, receive, send)
            return
        if drain.draining and path == "/health":
            await JSONResponse(
                {"status": "draining", "in_flight": drain.in_flight}, status_code=503, headers={"Retry-After": "5"}
            )(scope, receive, send)
            return
        if path not in DECISION_ROUTES:
            await self.app(scope, receive, send)
            return
        if drain.draining:
            raise Draining("the server is shutting down; retry on another replica or later")
        drain.enter()
        started = False

        async def send_once(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            task = asyncio.ensure_future(self.app(scope, receive, send_once))
            expired = asyncio.ensure_future(drain.expired.wait())
            try:
                done, _ = await asyncio.wait({task, expired}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # we are cancelled (server shutdown): so is the request
                task.cancel()
                raise
            finally:
                expired.cancel()
            if task in done:
                task.result()
                return
            if started:  # a stream (the NDJSON batch) ends itself properly on the drain: let it
                finished, _ = await asyncio.wait({task}, timeout=STREAM_END_S)
                if task in finished:
                    task.result()
                    return
                log.warning("a response stream did not end within %.0f s of the drain timeout", STREAM_END_S)
            task.cancel()  # the drain timeout passed: the engine work is abandoned
            try:
                await task
            except BaseException:  # noqa: BLE001, S110 - cancelled on purpose; its outcome no longer matters
                pass
            if not started:
                raise Draining("the server shut down before this request finished; retry")
        finally:
            drain.leave()

    def _record(self, scope: Scope, path: str, method: str, entry: KeyEntry | None, sent: dict, total_s: float) -> None:
        status = sent["status"] or 499  # nothing sent: the client went away first
        error_type = _error_type(b"".join(sent["error_body"])) if status >= 400 else None
        route = route_of(path)
        key = entry.name if entry else "-"
        metrics = self.ops.metrics
        try:
            metrics.observe_request(route, status, key, error_type, total_s)
        except Exception:  # metrics must never fail a request
            log.exception("metrics failed")
        result = scope["state"].get("result")
        fields: dict[str, Any] = {
            "request_id": request_id_of(scope),
            "key": key,
            "method": method,
            "route": route,
            "status": status,
            "error_type": error_type,
            "duration_ms": round(total_s * 1000, 2),
        }
        if result is not None:
            metrics.observe_result(result)
            fields.update(result_fields(result))
        batch = scope["state"].get("batch")
        if batch is not None:  # each item has its own line too (Operations.record_item)
            fields.update({f"items_{k}" if k != "items" else k: v for k, v in batch.items()})
        if route == "/health" or route == "/health/live" or route == "/metrics":
            level = logging.DEBUG  # probes every few seconds would drown the requests
        else:
            level = logging.WARNING if status >= 500 and status != 503 else logging.INFO
        detail = disclosure.detail_of(scope)
        if detail:
            fields["error_detail"] = detail  # what the client was not told (errors.py)
        if self.bodies and status >= 400 and sent["error_body"]:
            fields["response_body"] = b"".join(sent["error_body"])[:4096].decode("utf-8", "replace")
        access_log.log(level, "request", extra={"fields": fields})


def result_fields(result: Any) -> dict[str, Any]:
    """An answered decision's access-log fields (counts and timings, never its text)."""
    usage = result.usage
    return {
        "questions": len(result.answers),
        "tokens_distinct": usage.input_tokens,
        "tokens_computed": usage.computed_tokens,
        "tokens_cached": usage.cached_tokens,
        "timings_ms": {k: round(v, 2) for k, v in result.timings_ms.items()},
    }


def _error_type(body: bytes) -> str | None:
    """The wire error_type of an error response; validation errors (a detail list) are
    'validation_error'. Only the type is kept: a 422 body quotes the request's input."""
    if not body or len(body) > 1 << 20:
        return None
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        return None
    if isinstance(detail, list):
        return "validation_error"
    if isinstance(detail, dict):
        value = detail.get("error_type")
        return value if isinstance(value, str) else None
    return None


__all__ = ["REQUEST_ID_HEADER", "Operations", "OpsMiddleware"]
