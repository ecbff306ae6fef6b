"""The Host header check (DNS rebinding): a web page from evil.example whose name is made
to resolve to 127.0.0.1 can make a browser on this machine call a loopback-only server,
and read the answers, since to the browser it is the page's own origin. The browser then
sends `Host: evil.example`. On a loopback bind only loopback names are therefore answered
(`localhost`, `127.0.0.1`, `[::1]`, any port) plus `--allowed-hosts`; on other binds every
name is, unless `--allowed-hosts` says otherwise. A refused request gets 400 in the
contract's shape, before authentication and before its body is read."""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from openjev.api.operations.middleware import error_response, request_id_of
from openjev.config import ListenSettings, is_loopback_name
from openjev.errors import RequestError

log = logging.getLogger(__name__)


class HostNotAllowed(RequestError):
    status = 400
    error_type = "invalid_request"


def host_name(header: str) -> str:
    """The name of a Host header, without its port: `[::1]:8000` -> `::1`, `a.b:80` -> `a.b`."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HostPolicy:
    """Which Host names are answered; None from `of()` means all of them."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.exact = {h.lower().rstrip(".") for h in allowed if not h.startswith("*.")}
        self.suffixes = tuple(h.lower().rstrip(".")[1:] for h in allowed if h.startswith("*."))  # ".example.com"

    @classmethod
    def of(cls, listen: ListenSettings) -> HostPolicy | None:
        if "*" in listen.allowed_hosts or (not listen.loopback_bind and not listen.allowed_hosts):
            return None
        return cls(listen.allowed_hosts)

    def allows(self, name: str) -> bool:
        return is_loopback_name(name) or name in self.exact or name.endswith(self.suffixes)

    def describe(self) -> str:
        extra = sorted(self.exact) + ["*" + s for s in self.suffixes]
        return "localhost, 127.0.0.1, [::1]" + "".join(", " + h for h in extra)


class HostMiddleware:
    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = Headers(scope=scope).get("host")
            # No Host at all: HTTP/1.0 only (h11 refuses HTTP/1.1 without one); no browser sends that.
            if header is not None and not self.policy.allows(host_name(header)):
                shown = header[:100]
                log.info(
                    "refused Host %r (--allowed-hosts)", shown, extra={"fields": {"request_id": request_id_of(scope)}}
                )
                exc = HostNotAllowed(
                    f"Host {shown!r} is not served here: this server answers the names {self.policy.describe()} "
                    "(DNS rebinding protection); allow more with --allowed-hosts"
                )
                await error_response(exc, request_id_of(scope))(scope, receive, send)
                return
        await self.app(scope, receive, send)
