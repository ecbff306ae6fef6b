"""What a client may learn about a failure, and where the rest goes.

The rule (errors.py): a response carries an error's public `message` (what kind of
failure, whether a retry may help) and the request id header; the private `detail` (a
foreign exception's text, a backend's URL or reply, a path) goes to the access log line
with the same request id. The routes and the error middleware `remember` the error they
answer with; the access log (api/operations/access.py) writes its detail.
"""

from __future__ import annotations

from starlette.types import Scope

from openjev.errors import ConfigError, ModelUnsuitable, OpenjevError

DETAIL_KEY = "error_detail"


def public(exc: OpenjevError) -> OpenjevError:
    """What a response may say about `exc`. Startup errors (ConfigError, ModelUnsuitable)
    are written for operators, with paths and URLs, and are not meant to reach HTTP: if one
    does, the client gets "internal error" and the log the whole message."""
    if isinstance(exc, (ConfigError, ModelUnsuitable)):
        return OpenjevError("internal error", detail=log_text(exc))
    return exc


def remember(scope: Scope, exc: OpenjevError) -> None:
    """Keep `exc`'s private detail for this request's log line (nothing if it has none)."""
    if exc.detail:
        scope.setdefault("state", {})[DETAIL_KEY] = exc.detail


def detail_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get(DETAIL_KEY)


def load_failure(exc: BaseException) -> str:
    """A short public reason for a model that failed to load (/health, 503s): the kind of
    failure only. Startup errors name paths, URLs and backend replies; the log has them."""
    if isinstance(exc, ConfigError):
        kind = "a configuration error"
    elif isinstance(exc, ModelUnsuitable):
        kind = "a model this server cannot use"
    else:
        kind = "an engine failure"
    return f"the model failed to load ({kind}); the server log says why"


def log_text(exc: BaseException) -> str:
    """An exception as the log shows it: ours with message and detail, foreign ones whole."""
    return str(exc) if isinstance(exc, OpenjevError) else f"{type(exc).__name__}: {exc}"
