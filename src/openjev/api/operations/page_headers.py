"""Security headers on the pages a browser renders (the playground, the API docs) and on
every response: `X-Content-Type-Options: nosniff` and `X-Frame-Options: DENY` everywhere
(no response is meant to be sniffed into another type or framed by another site), and on
the HTML pages a `Content-Security-Policy` that allows only what each page itself uses:
the playground's own inline script by its hash and same-origin calls; the docs' inline
start-up script, their packaged assets, and Redoc's blob: worker. `Referrer-Policy:
no-referrer` keeps the pages' URLs to themselves."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

EVERY_RESPONSE = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"))
PAGE_HEADERS = ((b"referrer-policy", b"no-referrer"),)
_COMMON = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
# The docs (FastAPI's Swagger UI and Redoc pages, assets from the package): their start-up
# script is inline and generated, Redoc starts a worker from a blob: URL, and both show
# images as data: URLs.
DOCS_POLICY = (
    f"{_COMMON}; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:"
)
_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def page_policy(html: str) -> str:
    """The policy of a page whose only scripts are its inline ones (allowed by their hashes)
    and whose styles are its own (inline, and style attributes)."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in _SCRIPT.findall(html)
    )
    return (
        f"{_COMMON}; script-src {hashes or chr(39) + 'none' + chr(39)}; style-src 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'"
    )


class PageHeadersMiddleware:
    """Adds the headers above: `policies` maps a page's path to its Content-Security-Policy."""

    def __init__(self, app: ASGIApp, policies: Mapping[str, str]) -> None:
        self.app = app
        self.policies = dict(policies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = self.policies.get(scope["path"])
        extra = [*EVERY_RESPONSE]
        if policy is not None:
            extra += [*PAGE_HEADERS, (b"content-security-policy", policy.encode())]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *((k, v) for k, v in extra if k not in names)]
            await send(message)

        await self.app(scope, receive, sending)
