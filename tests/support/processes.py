"""Pausing a real server process that a test started, so that what was sent to it stays in
flight for as long as the test needs, whatever the speed of the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused(process: subprocess.Popen) -> Iterator[None]:
    """`process`'s whole process group stopped (SIGSTOP) for the block, then continued: it
    accepts connections meanwhile (the kernel does) and answers nothing. The process must
    lead a session of its own (`start_new_session=True`: its pid is its group), as openjev's
    launcher starts the engine servers."""
    group = process.pid
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(group, signal.SIGCONT)
