"""`openjev serve --workers N`: N API processes on one host, sharing one listening socket.

The parent binds the port once, then starts N copies of the same `openjev serve` command,
each inheriting the bound socket (the kernel hands each new connection to one of them) and
told so by OPENJEV_LISTEN_FD. It serves nothing itself: it passes SIGHUP (re-read the keys
file), SIGTERM and SIGINT (drain, then stop) on to every worker, and when one worker exits
unasked it stops the others and exits with that worker's status, so a supervisor restarts
the whole. Only for an API tier in front of a running engine server (`--connect`), with a
shared limits store: config/fleet.py refuses the rest at start."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

log = logging.getLogger("openjev")

LISTEN_FD = "OPENJEV_LISTEN_FD"  # set for a worker: the inherited listening socket's descriptor
_FORWARDED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


def inherited_listener() -> socket.socket | None:
    """The listening socket a worker inherited from its parent; None in a process of its own."""
    fd = os.environ.get(LISTEN_FD)
    return None if fd is None else socket.socket(fileno=int(fd))


def run_workers(listener: socket.socket, argv: Sequence[str], workers: int) -> int:
    """Start `workers` copies of `openjev <argv>` on `listener`; wait for them (module doc)."""
    fd = listener.fileno()
    os.set_inheritable(fd, True)
    env = {**os.environ, LISTEN_FD: str(fd)}
    children = [
        subprocess.Popen([sys.executable, "-m", "openjev", *argv], pass_fds=(fd,), env=env) for _ in range(workers)
    ]
    listener.close()  # the workers hold it now
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if signum != signal.SIGHUP:
            stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    log.info("%d workers: pids %s", workers, " ".join(str(c.pid) for c in children))
    return _wait(children, stopping)


def _wait(children: list[subprocess.Popen[bytes]], stopping: list[int]) -> int:
    """Every worker's end: the first status that was not asked for, else 0."""
    status = 0
    while any(c.poll() is None for c in children):
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        code = os.waitstatus_to_exitcode(raw)
        for child in children:
            if child.pid == pid:
                child.returncode = code
        if not stopping and code != 0 and status == 0:
            status = code if code > 0 else 1
            log.error("worker %d exited %d: stopping the others", pid, code)
            stopping.append(signal.SIGTERM)
            for child in children:
                if child.poll() is None:
                    child.terminate()
    return status
