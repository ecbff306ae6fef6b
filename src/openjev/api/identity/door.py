"""Admission at the door (`AdmissionMiddleware`), before the body is read: which paths need
a key, the key itself (401), and on the decision routes and a task's writes the key's
tokens/min debt (429: a key whose earlier work, refused requests' included, overdrew its
bucket gets no compile work until it is paid back), its requests/min bucket and its
reservation for the body (429), in one step of the buckets' store
(api/identity/key_limits.py); a task read or delete takes one of its requests/min. How much
work a request may then start is admission.py's, on the engine port."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from openjev.api.contract.paths import DECISION_ROUTES, TASKS
from openjev.api.identity.caller import SCOPE_KEY, caller_for
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.identity.keys import KeyEntry, KeyRing
from openjev.api.identity.proxies import TrustedProxies
from openjev.api.identity.reservation import Reservation, admit
from openjev.errors import AuthenticationError, RateLimited, RequestError

# The API docs: behind the API's key with --docs auth, their static assets too (the largest
# responses the server has: open, they let anyone hold connections with unread answers).
DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
DOCS_ASSETS = "/static-offline-docs/"


def _loopback(scope: Scope, proxies: TrustedProxies) -> bool:
    """A client on this machine (a forwarded one only where --trusted-proxies says so)."""
    if not scope.get("client"):
        return True  # in-process (tests, ASGI transports): nothing came over a network
    client = proxies.client(scope)
    return client is not None and client.is_loopback


class AdmissionMiddleware:
    """At the door, before the body is read or parsed: the caller's key where the path needs
    one (an unauthenticated request is a 401 whatever it sends) and, on a decision or task
    route, one of its requests/min (429 beyond; `_counted`). The request's caller is made here,
    once (`core.caller.Caller`, in the scope's state: api/identity/caller.py `caller_of`), with
    the key's name beside it for the log and the metrics."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyRing,
        key_limits: KeyLimits,
        proxies: TrustedProxies,
        docs_auth: bool,
        open_per_key: int = 0,
    ) -> None:
        self.app = app
        self.keys = keys
        self.key_limits = key_limits
        self.proxies = proxies
        self.docs_auth = docs_auth
        # Requests in progress per key (head read, answer not finished: a body still arriving
        # holds its connection), bounded as one address's connections are
        # (--max-connections-per-client), so one key cannot hold the server's connections
        # from many addresses; 0: no bound.
        self.open_per_key = open_per_key
        self._open: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if len(Headers(scope=scope).getlist("authorization")) > 1:  # which one is meant is not ours to guess
            raise RequestError("more than one Authorization header: send one")
        entry = self._authenticate(scope, scope["path"])
        state = scope.setdefault("state", {})
        state["key_name"] = entry.name if entry else None
        # The entry is the request's before its limits are checked, so that what answers a 429
        # at the door (outside this middleware) still knows whose limits to show
        # (api/server/conventions.py).
        state["key_entry"] = entry
        held = await self._counted(scope, entry) if entry is not None else None
        if scope["path"] == "/health":  # open to all; how busy the server is only for a key's holder
            state["sees_load"] = not self.keys.enabled or self._bearer(scope) is not None
        state[SCOPE_KEY] = caller_for(entry, self.key_limits.allowance(entry), held)
        try:
            async with self._in_progress(entry):
                await self.app(scope, receive, send)
        finally:
            if held is not None:
                await held.release()

    async def _counted(self, scope: Scope, entry: KeyEntry) -> Reservation | None:
        """One of the key's requests/min on the decision and task routes (429 beyond); where the
        body is priced work (a decision, a task's examples), in the same step of the store its
        tokens' debt (a key in debt buys no compile) and a reservation for the body."""
        path = scope["path"]
        task = path == TASKS or path.startswith(TASKS + "/")
        if path in DECISION_ROUTES or (task and scope["method"] == "POST"):
            headers = Headers(scope=scope)
            encoded = headers.get("content-encoding", "identity").strip().lower() != "identity"
            return await admit(self.key_limits, entry, headers.get("content-length"), encoded)
        if task:  # a read or a delete: no engine work, so a key in debt may still look at its tasks
            await self.key_limits.take_request(entry)
        return None

    @contextlib.asynccontextmanager
    async def _in_progress(self, entry: KeyEntry | None) -> AsyncIterator[None]:
        """One of the key's requests in progress (429 past `open_per_key`)."""
        if entry is None or not self.open_per_key:
            yield
            return
        if self._open.get(entry.name, 0) >= self.open_per_key:
            raise RateLimited(
                f"API key {entry.name!r} has {self.open_per_key} requests in progress (its limit, "
                "--max-connections-per-client); retry after Retry-After",
                retry_after_s=1,
            )
        self._open[entry.name] = self._open.get(entry.name, 0) + 1
        try:
            yield
        finally:
            left = self._open.pop(entry.name, 1) - 1
            if left > 0:
                self._open[entry.name] = left

    def _bearer(self, scope: Scope) -> KeyEntry | None:
        """The key entry the request's Bearer header names, None for none or an unknown one."""
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        return self.keys.identify(given.strip()) if scheme.lower() == "bearer" and given.strip() else None

    def _authenticate(self, scope: Scope, path: str) -> KeyEntry | None:
        """The caller's key where one is needed (raises 401); None where none is."""
        keys = self.keys
        guarded = (
            path.startswith("/v1/")
            or path in DECISION_ROUTES
            or (path == "/metrics" and not _loopback(scope, self.proxies))
            or ((path in DOCS_ROUTES or path.startswith(DOCS_ASSETS)) and self.docs_auth)
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
        return entry
