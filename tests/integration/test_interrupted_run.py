"""A test run that ends early leaves no server behind (tests/support/processes.py).

A real pytest runs a test whose module fixture starts a real `openjev serve`, and is ended
either while the fixture still waits for the server to be healthy (the longest wait of a
server test) or while the test runs beside the healthy server: by SIGINT (Ctrl-C), SIGTERM,
or SIGKILL (nothing of pytest runs then: the kernel's parent-death signal ends the server).
Afterwards no process of the server's group is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

INNER = """
import pathlib
import time

import pytest

from tests.integration.conftest import start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    started = start_server(tmp, "--tasks-db", str(tmp / "tasks.sqlite3"))
    yield started
    stop_server(started)


def test_with_a_server(server):
    pathlib.Path(MARKER).write_text(str(server.process.pid))
    time.sleep(600)
"""


def _processes() -> list[tuple[int, int, int, str, str]]:
    """(pid, parent pid, process group, state, command line) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        found.append((int(entry.name), int(fields[1]), int(fields[2]), fields[0], cmdline))
    return found


def _server_of(run: subprocess.Popen, timeout_s: float = 120) -> int:
    """The pid of the `openjev serve` the inner run started (its own process group)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[0]
        for pid, ppid, _, _, cmdline in _processes():
            if ppid == run.pid and "openjev serve" in cmdline:
                return pid
        time.sleep(0.05)
    raise AssertionError("the inner run started no server")


def _left(group: int) -> list[str]:
    """The live (not zombie) processes of `group`."""
    return [f"{pid} {cmdline}" for pid, _, pgrp, state, cmdline in _processes() if pgrp == group and state != "Z"]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize(
    ("sig", "when"),
    [
        (signal.SIGINT, "starting"),
        (signal.SIGINT, "serving"),
        (signal.SIGTERM, "serving"),
        (signal.SIGKILL, "serving"),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v,
)
def test_a_run_ended_early_leaves_no_server(tmp_path, sig, when):
    marker = tmp_path / "serving"
    (tmp_path / "test_inner.py").write_text(f"MARKER = {str(marker)!r}\n" + INNER)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
    run = subprocess.Popen(
        [*cmd, str(tmp_path / "test_inner.py")],
        cwd=ROOT,  # `tests` importable
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: the signal reaches pytest alone, as Ctrl-C would not the server
    )
    server = None
    try:
        server = _server_of(run)
        if when == "serving":
            deadline = time.monotonic() + 300
            while not marker.exists():
                assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
                time.sleep(0.1)
        assert _left(server), "the server's group should be running before the signal"
        os.kill(run.pid, sig)
        out = run.communicate(timeout=120)[0]
        deadline = time.monotonic() + 60
        while _left(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _left(server), f"left running after {sig.name}: {_left(server)}\n{out[-3000:]}"
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in out, out[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        if server is not None and _left(server):  # what a failure found: not left to the machine
            os.killpg(server, signal.SIGKILL)
