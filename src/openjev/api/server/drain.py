"""Graceful drain on SIGTERM.

The first SIGTERM starts a drain instead of uvicorn's immediate shutdown: /health answers
503 at once (an orchestrator stops routing here), new decision requests get 503 with
Retry-After, and the requests already in flight finish, for up to the drain timeout.
Whatever still runs then is answered 503 (JSON, with its request id) and cancelled. Only
then does uvicorn shut down (lifespan: the engine and any SGLang child stop) and the
process exits 0: a drain is the normal end of a server's life, not a crash. A second
SIGTERM, or SIGINT, shuts down at once as before.

Work that a cancelled request left in a worker thread (a compile, a task's fit) is not
waited for: the loop's default executor (`StoppingExecutor`) neither waits nor runs queued
work at shutdown, and `openjev serve` exits without joining such threads (cli.py,
`leftover_threads`), so nothing computes after "Finished server process".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import threading
import time
from collections.abc import Callable

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openjev.api.contract.paths import DECISION_ROUTES, HEALTH
from openjev.errors import Draining

log = logging.getLogger(__name__)


class Drain:
    """Counts the requests in flight and runs the drain; lives on the event loop."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.draining = False
        self.in_flight = 0
        self._clock = clock
        self._changed: asyncio.Event | None = None
        self._expired: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._changed is None or self._expired is None:
            self._changed, self._expired = asyncio.Event(), asyncio.Event()
        return self._changed, self._expired

    @property
    def expired(self) -> asyncio.Event:
        """Set when the drain timeout passes: the requests still running are cut short."""
        return self._events()[1]

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        self._events()[0].set()

    def begin(self, then: Callable[[], None]) -> None:
        """Start draining (on the loop); `then()` once nothing is in flight or time is up."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: %d requests in flight, up to %.0f s", self.in_flight, self.timeout_s)
        self._task = asyncio.get_running_loop().create_task(self._run(then))

    async def _run(self, then: Callable[[], None]) -> None:
        changed, expired = self._events()
        deadline = self._clock() + self.timeout_s
        while self.in_flight > 0 and self._clock() < deadline:
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), max(0.0, deadline - self._clock()))
            except TimeoutError:
                break
        if self.in_flight > 0:
            log.warning("drain timeout: %d requests still in flight are answered 503", self.in_flight)
            expired.set()
            for _ in range(200):  # they answer within a few loop turns; a stream ends itself (DrainMiddleware)
                if self.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
        log.info("drained; shutting down")
        then()


class StoppingExecutor(concurrent.futures.ThreadPoolExecutor):
    """asyncio's default executor (`asyncio.to_thread`), except at shutdown: the work queued
    is cancelled and the work running is not waited for (its request is gone)."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="openjev-worker")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:  # noqa: ARG002 - never waits
        super().shutdown(wait=False, cancel_futures=True)


# How long idle worker threads get to end after the server stopped (they end at once).
LEFTOVER_GRACE_S = 1.0


def leftover_threads(grace_s: float = LEFTOVER_GRACE_S) -> list[threading.Thread]:
    """Threads still running `grace_s` after the server stopped that the interpreter would
    wait for at exit (worker threads computing for requests that are gone); the caller exits
    without them."""
    deadline = time.monotonic() + grace_s
    left = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for t in left:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in left if t.is_alive()]


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGTERM meaning 'drain, then exit 0'."""

    def __init__(self, config: uvicorn.Config, drain: Drain, on_hangup: Callable[[], object] | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_hangup = on_hangup

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_default_executor(StoppingExecutor())
        if self._on_hangup is not None:
            # The loop's own handler: the signal only wakes the loop, and the reload runs
            # as an ordinary callback on it (where nothing it raises can end the process).
            self._loop.add_signal_handler(signal.SIGHUP, self._hangup)
        try:
            await super().serve(sockets)
        finally:
            if self._on_hangup is not None:
                self._loop.remove_signal_handler(signal.SIGHUP)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # not SIG_DFL: a late SIGHUP must not kill the exit

    def _hangup(self) -> None:
        try:
            if self._on_hangup is not None:
                self._on_hangup()
        except Exception:
            log.exception("SIGHUP: reload failed; nothing changed")

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGTERM and not self.drain.draining and self._loop is not None:
            # Not recorded in _captured_signals: uvicorn would re-raise it at exit (status -15).
            self._loop.call_soon_threadsafe(self.drain.begin, self._exit)
            return
        super().handle_exit(sig, frame)

    def _exit(self) -> None:
        self.should_exit = True


# After the drain timeout, how long a response already streaming may take to end itself
# (503 lines for its unfinished items, its summary, the final chunk) before it is cut.
STREAM_END_S = 3.0


class DrainMiddleware:
    """The drain at the door: /health says 503 once SIGTERM arrived and new decisions are
    refused (503, retryable); the decisions in flight are counted, and one cut short by
    the drain timeout is answered 503 (a stream, the NDJSON batch, ends itself)."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain, path = self.drain, scope["path"]
        if drain.draining and path == HEALTH:
            body: dict[str, object] = {"status": "draining"}
            if scope.get("state", {}).get("sees_load"):  # a key's holder's to see (api/identity/door.py)
                body["in_flight"] = drain.in_flight
            await JSONResponse(body, status_code=503, headers={"Retry-After": "5"})(scope, receive, send)
            return
        if path not in DECISION_ROUTES:
            await self.app(scope, receive, send)
            return
        if drain.draining:
            raise Draining("the server is shutting down; retry on another replica or later")
        drain.enter()
        try:
            await self._under_the_drain(scope, receive, send)
        finally:
            drain.leave()

    async def _under_the_drain(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_once(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, send_once))
        expired = asyncio.ensure_future(self.drain.expired.wait())
        try:
            done, _ = await asyncio.wait({task, expired}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # we are cancelled (server shutdown): so is the request
            task.cancel()
            raise
        finally:
            expired.cancel()
        if task in done:
            task.result()
            return
        if started:  # a stream (the NDJSON batch) ends itself properly on the drain: let it
            finished, _ = await asyncio.wait({task}, timeout=STREAM_END_S)
            if task in finished:
                task.result()
                return
            log.warning("a response stream did not end within %.0f s of the drain timeout", STREAM_END_S)
        task.cancel()  # the drain timeout passed: the engine work is abandoned
        try:
            await task
        except BaseException:  # noqa: BLE001, S110 - cancelled on purpose; its outcome no longer matters
            pass
        if not started:
            raise Draining("the server shut down before this request finished; retry")
