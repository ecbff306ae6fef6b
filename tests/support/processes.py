"""Server processes that tests start (openjev serve, redis-server, fake engines, routers):
started so that none outlives the test run, however it ends, and paused on demand.

`spawn` starts a command in a process group of its own (its pid is its group), so that
`paused` can stop it whole and `stop` can end it whole, and so that a Ctrl-C in the terminal
reaches pytest, which stops it, not the server directly (a server that drains on SIGINT would
otherwise be caught half-way). Every process spawned or `track`ed is stopped with its group:

- by the test's own `stop` (fixture finalizers and try/finally blocks);
- at interpreter exit (atexit): after a Ctrl-C (pytest's KeyboardInterrupt) too, including one
  that lands while a fixture still waits for its server to be healthy;
- on SIGTERM or SIGHUP to pytest: the handler stops them, then lets the signal take its course;
- when pytest dies without running any of that (SIGKILL, a crash): on Linux the child is
  started with PR_SET_PDEATHSIG, so the kernel sends it SIGTERM as its parent goes.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

# Run before the server's own program: asks the kernel for SIGTERM when the parent thread dies
# (prctl 1 = PR_SET_PDEATHSIG), exits if the parent is already gone, then execs the command (the
# setting survives exec). A launcher, not preexec_fn: that runs Python between fork and exec,
# which can deadlock a parent with threads (pytest here has torch's and the engines').
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_live: dict[int, subprocess.Popen] = {}
_lock = threading.Lock()
_previous: dict[int, object] = {}  # the handlers ours replaced, by signal
_installed: list[bool] = []


def spawn(cmd: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **popen_kwargs)` in a new session (its own process group),
    dying with this process (module docstring) and tracked until `stop`."""
    argv = [str(a) for a in cmd]
    if sys.platform == "linux" and threading.current_thread() is threading.main_thread():
        # The kernel ties the death signal to the thread that forked: only the main thread
        # lives as long as pytest.
        argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
    process = subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
    track(process)
    return process


def track(process: subprocess.Popen) -> None:
    """Stop `process`'s group with the test run (for one started elsewhere, in a session of
    its own, e.g. by openjev's engine launcher)."""
    with _lock:
        _live[process.pid] = process
    _install_handlers()


def stop(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the process's group (continued, were it paused), SIGKILL to what is left after
    `grace_s`; the leader reaped. Nothing is signalled once the leader has exited and been
    reaped (its pid may be another process's by then)."""
    with _lock:
        _live.pop(process.pid, None)
    if process.poll() is not None:
        return
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(process, signal.SIGKILL)
    process.wait()


def stop_all(grace_s: float = 5.0) -> None:
    """Every tracked process whose leader still runs: SIGTERM to each group at once, then
    SIGKILL to what is left after `grace_s` in all. (A leader already reaped is skipped: its
    pid may belong to another process by now.)"""
    with _lock:
        running = [p for p in _live.values() if p.poll() is None]
        _live.clear()
    for process in running:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    for s in (sig, signal.SIGCONT) if sig != signal.SIGKILL else (sig,):
        try:
            os.killpg(process.pid, s)
        except (ProcessLookupError, PermissionError):
            return


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Once, from the main thread (the only one that may set signal handlers)."""
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed.append(True)
    for sig in _SIGNALS:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue  # e.g. SIGHUP under nohup: keep ignoring it
        _previous[sig] = previous
        signal.signal(sig, _on_signal)


atexit.register(stop_all)


@contextmanager
def paused(process: subprocess.Popen) -> Iterator[None]:
    """`process`'s whole process group stopped (SIGSTOP) for the block, then continued: it
    accepts connections meanwhile (the kernel does) and answers nothing. The process must
    lead a session of its own (`spawn`, or `start_new_session=True`: its pid is its group), as
    openjev's launcher starts the engine servers."""
    group = process.pid
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)
