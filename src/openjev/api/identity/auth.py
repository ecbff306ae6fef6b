"""Bearer-key authentication for the /v1 routes (health stays open).

The check itself runs in api/identity/door.py (AdmissionMiddleware), before the body is read or parsed; this
dependency declares the Bearer scheme in the OpenAPI document and refuses a /v1 request
that somehow reached a route unauthenticated."""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from openjev.errors import AuthenticationError

_bearer = HTTPBearer(
    auto_error=False, description="an API key configured with --api-key / OPENJEV_API_KEYS or --api-keys-file"
)


async def require_key(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:  # noqa: ARG001 - declares the Bearer scheme in the OpenAPI document
    """Accepts any request when no keys are configured (a Bearer header is then ignored)."""
    if request.app.state.ops.keys.enabled and request.scope.get("state", {}).get("key_name") is None:
        raise AuthenticationError("missing API key: send Authorization: Bearer <key>")
