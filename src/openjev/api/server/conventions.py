"""The response headers a format's clients read, on that format's routes (api/contract/format_port.py
`id_header`, `rate_limit_headers`): OpenAI's SDK exposes `x-request-id` as `_request_id`, and
reads the caller's limits from

    x-ratelimit-limit-requests / -remaining-requests / -reset-requests
    x-ratelimit-limit-tokens   / -remaining-tokens   / -reset-tokens

(limit per minute, what may be taken now, time until the bucket is full: "1m30s", "250ms"),
sent where the calling key has that limit (api/identity/key_limits.py `KeyLimits.standing`), on
answers and errors alike (a 429 says when to come back)."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openjev.api.contract.formats import format_of
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.identity.keys import KeyEntry
from openjev.api.operations.middleware import request_id_of

_KINDS = {"requests_per_min": "requests", "tokens_per_min": "tokens"}


def duration(seconds: float) -> str:
    """OpenAI's reset form: "250ms" below a second, else "12s", "1m30s"."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


async def rate_limit_headers(key_limits: KeyLimits, entry: KeyEntry | None) -> dict[str, str]:
    """The calling key's x-ratelimit-* headers ({} without a key or without limits)."""
    if entry is None:
        return {}
    out: dict[str, str] = {}
    for kind, (limit, remaining, reset_s) in (await key_limits.standing(entry)).items():
        name = _KINDS[kind]
        out[f"x-ratelimit-limit-{name}"] = str(limit)
        out[f"x-ratelimit-remaining-{name}"] = str(remaining)
        out[f"x-ratelimit-reset-{name}"] = duration(reset_s)
    return out


class ConventionsMiddleware:
    """Adds a format's client headers to every response of its routes. Outside admission,
    whose key (in the request's scope state) it reads as the response starts."""

    def __init__(self, app: ASGIApp, key_limits: KeyLimits) -> None:
        self.app = app
        self.key_limits = key_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fmt = format_of(scope["path"])
        if scope["path"] not in fmt.paths or (fmt.id_header is None and not fmt.rate_limit_headers):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                rid = request_id_of(scope)
                if fmt.id_header is not None and rid:
                    headers[fmt.id_header] = rid
                if fmt.rate_limit_headers:
                    # The key admission named (scope state, set before its limits are checked):
                    # a 429 at the door is answered out here, before the caller is made.
                    entry = scope.get("state", {}).get("key_entry")
                    for name, value in (await rate_limit_headers(self.key_limits, entry)).items():
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
