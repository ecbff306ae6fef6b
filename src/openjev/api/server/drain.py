"""Graceful drain on SIGTERM.

The first SIGTERM starts a drain instead of uvicorn's immediate shutdown: /health answers
503 at once (an orchestrator stops routing here), new decision requests get 503 with
Retry-After, and the requests already in flight finish, for up to the drain timeout.
Whatever still runs then is answered 503 (JSON, with its request id) and cancelled. Only
then does uvicorn shut down (lifespan: the engine and any SGLang child stop) and the
process exits 0: a drain is the normal end of a server's life, not a crash. A second
SIGTERM, or SIGINT, shuts down at once as before.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

import uvicorn

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
            for _ in range(200):  # they answer within a few loop turns; a stream ends itself (api/server/ops.py)
                if self.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
        log.info("drained; shutting down")
        then()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with SIGTERM meaning 'drain, then exit 0'."""

    def __init__(self, config: uvicorn.Config, drain: Drain, on_hangup: Callable[[], object] | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_hangup = on_hangup

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
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
