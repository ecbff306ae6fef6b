"""Sending calls to an engine server: one HTTP client, created inside the serving event
loop, and the server-wide cap on calls in flight (--max-engine-calls; calls waiting for a
slot go in the keys' fair order, slots.py). A call's failures
become the errors the API answers with: a server that cannot be reached (refused, reset,
killed mid-call) a retryable 503 with Retry-After, a busy one (429, 503) a 503, one that
accepts and never answers is cut off by the call's timeout (504); a call cancelled or
timed out is aborted on the server (fire and forget: the caller is already leaving)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

import httpx
import orjson

from openjev.core.types import NO_KEY, Share
from openjev.engines.http.protocol import HTTPProtocol, json_of
from openjev.engines.http.slots import FairSlots
from openjev.errors import EngineError, EngineTimeout, EngineUnavailable

log = logging.getLogger(__name__)

_JSON = {"content-type": "application/json"}


class Sender:
    """Calls to the server at `url`, at most `max_calls` at once; the counts for /metrics."""

    def __init__(
        self,
        url: str,
        protocol: HTTPProtocol,
        *,
        max_calls: int,
        call_timeout_s: float,
        retry_after_s: int,
        probe_timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.protocol = protocol
        self.calls = self.calls_in_flight = 0
        self._max_calls = max_calls
        self._timeout = httpx.Timeout(call_timeout_s, connect=10.0)
        self._transport = transport
        self._retry_after = {"Retry-After": str(max(1, int(retry_after_s)))}
        self._probe_timeout_s = probe_timeout_s
        self._last_reply = -math.inf  # time.monotonic() of the server's last answer to a call
        self._last_unreachable = -math.inf  # ... and of the last call that could not reach it
        self._client: httpx.AsyncClient | None = None
        self._slots: FairSlots | None = None  # past the cap, calls wait in the keys' fair order
        self._aborts: set[asyncio.Task] = set()  # fire-and-forget aborts, kept alive until done

    def _http(self) -> tuple[httpx.AsyncClient, FairSlots]:
        # Created on first use, inside the serving event loop.
        if self._client is None or self._slots is None:
            self._client = httpx.AsyncClient(
                base_url=self.url,
                timeout=self._timeout,
                transport=self._transport,
                limits=httpx.Limits(max_connections=self._max_calls, max_keepalive_connections=self._max_calls),
            )
            self._slots = FairSlots(self._max_calls)
        return self._client, self._slots

    async def close(self) -> None:
        if self._aborts:
            await asyncio.gather(*self._aborts, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def probe(self) -> str | None:
        """Whether the server answers now: None if it does, else why not (for our /health,
        which is public: the reason names no address; the log has it). A reply to any call
        within the last `probe_timeout_s` counts (a busy CPU server answers /health slowly)
        unless a call has failed to reach the server since; otherwise GET /health must say
        200 within `probe_timeout_s`."""
        if self._last_reply > self._last_unreachable and time.monotonic() - self._last_reply < self._probe_timeout_s:
            return None
        client, _ = self._http()
        try:
            r = await client.get(self.protocol.health_path, timeout=self._probe_timeout_s)
        except httpx.TimeoutException:
            return f"the engine server did not answer within {self._probe_timeout_s:g} s"
        except httpx.TransportError as e:
            log.warning("engine health probe of %s failed: %r", self.url, e)
            return "the engine server cannot be reached"
        return None if r.status_code == 200 else f"the engine server's health check answered {r.status_code}"

    async def post(
        self, path: str, body: dict, aborts: Sequence[dict], tokens: int = 1, share: Share = NO_KEY
    ) -> object:
        """One call of `tokens` prompt tokens of the request served from `share`: capped by the
        server-wide slots (waiting calls go in the keys' fair order, slots.py), aborted server-side (the `aborts` bodies, which
        name every item in it) when cancelled or timed out, overload and outage mapped to
        retryable errors; the reply's JSON."""
        client, slots = self._http()
        async with slots.hold(tokens, share):
            self.calls += 1
            self.calls_in_flight += 1
            try:
                # orjson, not httpx's json=: a call carries every branch's token ids
                response = await client.post(path, content=orjson.dumps(body), headers=_JSON)
            except asyncio.CancelledError:
                self.abort(aborts)
                raise
            except httpx.TimeoutException:
                self.abort(aborts)
                raise EngineTimeout(f"the engine did not answer within {self._timeout.read:g} s") from None
            except httpx.TransportError as e:
                # Refused, reset, or closed mid-call (the server died): nothing to abort.
                self._last_unreachable = time.monotonic()
                raise EngineUnavailable(
                    "cannot reach the engine", detail=f"{self.url}: {e!r}", headers=self._retry_after
                ) from None
            finally:
                self.calls_in_flight -= 1
        self._last_reply = time.monotonic()
        return self._read(response)

    def _read(self, response: httpx.Response) -> object:
        """The reply's JSON; a busy server's answer a retryable 503, any other failure a 502."""
        if response.status_code in (429, 503):
            retry = response.headers.get("retry-after", "").strip()
            retry = retry if retry.isdigit() else ""  # a number of seconds, or nothing of the backend's
            raise EngineUnavailable(
                f"the engine is busy ({response.status_code})", headers={"Retry-After": retry} if retry else None
            )
        if response.status_code >= 400:
            raise EngineError(
                f"the engine answered {response.status_code}", detail=f"{self.url}: {response.text[:300]!r}"
            )
        return json_of(response.content)

    def abort(self, bodies: Sequence[dict]) -> None:
        """Post every abort body (fire and forget: the caller is already leaving): one per
        rid for SGLang, whose /abort_request takes one; one per call for vLLM's, which takes
        a list."""
        client = self._client
        if client is None:
            return

        async def abort(body: dict) -> None:
            try:
                await client.post(self.protocol.abort_path, json=body, timeout=5.0)
            except httpx.HTTPError as e:
                log.warning("abort %s failed: %s", body, e)

        async def abort_all() -> None:
            await asyncio.gather(*(abort(body) for body in bodies))

        task = asyncio.get_running_loop().create_task(abort_all())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)
