"""Bearer-key authentication for the /v1 routes (health stays open)."""

from __future__ import annotations

import hmac

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from openjev.errors import AuthenticationError

_bearer = HTTPBearer(auto_error=False, description="an API key configured with --api-key / OPENJEV_API_KEYS")


async def require_key(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> None:
    """Accepts any request when no keys are configured (a Bearer header is then ignored)."""
    keys: tuple[str, ...] = request.app.state.settings.api_keys
    if not keys:
        return
    if credentials is None:
        raise AuthenticationError("missing API key: send Authorization: Bearer <key>")
    given = credentials.credentials.encode()
    if not any(hmac.compare_digest(given, key.encode()) for key in keys):
        raise AuthenticationError("invalid API key")
