"""One tree of errors, each knowing its HTTP status, wire `error_type` and retryability.

Every layer raises these (or translates foreign exceptions into them at its boundary);
the API maps them to responses in one place. Stdlib only: the core imports it.
"""

from __future__ import annotations

import math


class OpenjevError(Exception):
    """Base of every error openjev raises on purpose.

    `status` is the HTTP status the API answers with, `error_type` the wire
    `detail.error_type`, `retryable` whether the same request may succeed later.

    `message` is public: it reaches the client, so it says what kind of failure this is
    and never quotes a foreign exception, a backend's reply, a URL or a path. `detail` is
    private: whatever explains the failure to an operator (that text, the URL); only the
    log line with the request's id sees it.
    """

    status: int = 500
    error_type: str = "unknown"
    retryable: bool = False

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        # Logs and tracebacks show both; responses use `message` alone.
        return self.message if not self.detail else f"{self.message} ({self.detail})"


# ---- the caller's fault (4xx): never retried by SDKs


class RequestError(OpenjevError):
    """A request that cannot be served as sent."""

    status = 400
    error_type = "invalid_request"


class AuthenticationError(RequestError):
    status = 401
    error_type = "authentication_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class ModelNotFound(RequestError):
    status = 404
    error_type = "not_found"


class NotFound(RequestError):
    """A resource the calling key does not have (another key's is not told apart from none)."""

    status = 404
    error_type = "not_found"


class Conflict(RequestError):
    """A request that the resource's state refuses: a task not fitted yet, or fitted for
    another model, readout or question."""

    status = 409
    error_type = "conflict"


class PayloadTooLarge(RequestError):
    status = 413
    error_type = "payload_too_large"


class UnsupportedEncoding(RequestError):
    status = 415
    error_type = "unsupported_encoding"


class UnsupportedMediaType(RequestError):
    """A body that is not declared JSON (Content-Type), or JSON declared in another charset."""

    status = 415
    error_type = "unsupported_media_type"


class InvalidInput(RequestError):
    """Well-formed JSON whose content cannot be read as the contract asks (checked after the
    wire schema; most such cases are 422 `detail[]` validation errors before this)."""

    status = 422
    error_type = "invalid_request"


class MalformedBody(RequestError):
    """A body whose declared encoding does not decode (corrupt gzip/zstd)."""

    status = 400
    error_type = "invalid_request"


class RequestTimeout(RequestError):
    """The client did not send its request in time (a slow or stalled client); the
    connection is closed after the answer. SDKs retry 408."""

    status = 408
    error_type = "timeout"
    retryable = True

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})


class TokensExceeded(RequestError):
    """A token budget (per branch or per request) is exceeded; checked before engine work.

    `work_tokens`: tokens encoded before the refusal (what the refused request cost; the
    API charges them to the caller's key)."""

    status = 422
    error_type = "tokens_exceeded"
    work_tokens: int = 0


class Unsupported(RequestError):
    """Well-formed, but asks for something this server does not serve (e.g. image assets)."""

    status = 422
    error_type = "unsupported"


# ---- load and outages: retryable


class Overloaded(OpenjevError):
    """More evaluations in flight than the server admits. 529 with Retry-After."""

    status = 529
    error_type = "rate_limit_error"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: int, detail: str | None = None) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, int(retry_after_s)))}, detail=detail)


class RateLimited(OpenjevError):
    """One API key is over its own requests/min or tokens/min. 429 with Retry-After; the
    server as a whole may have room (that is Overloaded, 529)."""

    status = 429
    error_type = "rate_limit_error"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})


class Draining(OpenjevError):
    """The server is shutting down (SIGTERM): it finishes what it admitted, takes nothing new."""

    status = 503
    error_type = "unknown"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class LimitsUnavailable(OpenjevError):
    """The shared limits store (--limits-redis-url) did not answer within its timeout and
    --limits-redis-mode is `closed`: nothing is admitted that the fleet's limits could not
    count. An outage of ours: 503 with Retry-After, which the official SDKs retry."""

    status = 503
    error_type = "unknown"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})


class ClientDisconnected(OpenjevError):
    """The client went away before its answer was ready; nobody reads the response (nginx's 499)."""

    status = 499
    error_type = "client_closed_request"


class NotReady(OpenjevError):
    """The model is still loading."""

    status = 503
    error_type = "unknown"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class EngineTimeout(OpenjevError):
    status = 504
    error_type = "timeout"
    retryable = True


class EngineUnavailable(OpenjevError):
    status = 503
    error_type = "unknown"
    retryable = True


class EngineError(OpenjevError):
    """The engine answered, but with something unusable (our fault or the engine's)."""

    status = 502
    error_type = "unknown"
    retryable = True


# ---- startup: never reach HTTP


class ConfigError(OpenjevError):
    """Settings that cannot work together; reported at startup."""


class ModelUnsuitable(OpenjevError):
    """A model the method cannot use (e.g. labels that are not single tokens in context)."""
