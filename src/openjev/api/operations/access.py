"""What operators see of each request: one access log line and the request metrics per HTTP
request, with no request text, and one per batch item (`AccessLog.record_item`, under the
batch's request id); and GET /metrics (Prometheus text, from this app's registry).

The outcome is read as data: the status from the response start, the `error_type` that
the error response recorded where it was made (api/contract/responses.py), the result and
the batch's counts that the routes put on `request.state`, the key's name that admission
put there."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openjev.api.contract.paths import BATCH, METRICS, PROBES, route_of
from openjev.api.contract.responses import error_type_of
from openjev.api.operations import disclosure
from openjev.api.operations.logs import ACCESS
from openjev.api.operations.metrics import CONTENT_TYPE, Metrics
from openjev.api.operations.middleware import request_id_of

log = logging.getLogger(__name__)
access_log = logging.getLogger(ACCESS)


class AccessLog:
    """Writes the access log lines and the request metrics of one app."""

    def __init__(self, metrics: Metrics, log_bodies: bool = False) -> None:
        self.metrics = metrics
        self.log_bodies = log_bodies  # error response bodies in the log (--log-request-bodies)

    def record(
        self, scope: Scope, path: str, method: str, status: int | None, total_s: float, error_body: bytes = b""
    ) -> None:
        """One HTTP request's line and metrics (`path` and `method` as it came, before any
        middleware rewrote them); `status` None: nothing was sent (499)."""
        status = status or 499  # nothing sent: the client went away first
        error_type = error_type_of(scope) if status >= 400 else None
        route = route_of(path)
        state = scope.setdefault("state", {})
        key = state.get("key_name") or "-"
        metrics = self.metrics
        try:
            metrics.observe_request(route, status, key, error_type, total_s)
        except Exception:  # metrics must never fail a request
            log.exception("metrics failed")
        result = state.get("result")
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
        batch = state.get("batch")
        if batch is not None:  # each item has its own line too (record_item)
            fields.update({f"items_{k}" if k != "items" else k: v for k, v in batch.items()})
        if route in PROBES:
            level = logging.DEBUG  # probes every few seconds would drown the requests
        else:
            level = logging.WARNING if status >= 500 and status != 503 else logging.INFO
        detail = disclosure.detail_of(scope)
        if detail:
            fields["error_detail"] = detail  # what the client was not told (errors.py)
        if self.log_bodies and status >= 400 and error_body:
            fields["response_body"] = error_body[:4096].decode("utf-8", "replace")
        access_log.log(level, "request", extra={"fields": fields})

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
        error_type = error.get("error_type") if status >= 400 else None
        if status == 499 and error_type is None:  # nobody read it: the client went away
            error_type = "client_closed_request"
        duration_s = time.perf_counter() - started
        fields: dict[str, Any] = {
            "request_id": request_id_of(scope),
            "key": key,
            "method": scope.get("method"),
            "route": BATCH,
            "item": index,
            "status": status,
            "error_type": error_type,
            "duration_ms": round(duration_s * 1000, 2),
        }
        try:
            self.metrics.observe_item(status, key, error_type, duration_s)
            if result is not None:
                self.metrics.observe_result(result)
                fields.update(result_fields(result))
        except Exception:  # metrics must never fail a request
            log.exception("metrics failed")
        level = logging.WARNING if status >= 500 and status != 503 else logging.INFO
        access_log.log(level, "batch item", extra={"fields": fields})


class AccessLogMiddleware:
    """Outside everything that may answer a request (errors included), so that every
    request's outcome is recorded once, after its response or its end."""

    def __init__(self, app: ASGIApp, access: AccessLog) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path, method = scope["path"], scope["method"]
        scope.setdefault("state", {})
        status: int | None = None
        error_body: list[bytes] = []
        keep_body = self.access.log_bodies

        async def send_tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif keep_body and message["type"] == "http.response.body" and (status or 0) >= 400:
                error_body.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        finally:
            self.access.record(scope, path, method, status, time.perf_counter() - t0, b"".join(error_body))


class MetricsEndpoint:
    """GET (and HEAD) /metrics: this app's registry as Prometheus text. Inside admission,
    which asks a key for it from anywhere but this machine."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == METRICS and scope["method"] in ("GET", "HEAD"):
            await Response(self.metrics.exposition(), media_type=CONTENT_TYPE)(scope, receive, send)
            return
        await self.app(scope, receive, send)


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
