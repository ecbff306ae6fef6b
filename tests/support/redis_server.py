"""A real redis-server (Debian's package) for the tests, on a free loopback port: started
by the tests, never assumed running. `make test-api-tier` installs it where it is missing
(and sets OPENJEV_API_TIER=1, so its absence fails instead of skipping)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from tests.support import processes
from tests.support.net import free_port


def require_redis() -> str:
    """The redis-server binary; a skip where it is missing (a failure under make test-api-tier)."""
    found = shutil.which("redis-server")
    if found is None:
        why = "redis-server is not installed (make test-api-tier installs Debian's package)"
        if os.environ.get("OPENJEV_API_TIER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found


class RedisServer:
    """One redis-server process, with no persistence unless given `append_only` (a folder for
    its append-only file, fsynced every second); `kill` ends it at once (SIGKILL, as a crash),
    `start` brings it back on the same port: empty, or what its file kept."""

    def __init__(self, binary: str, append_only: str | None = None) -> None:
        self.binary = binary
        self.append_only = append_only
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.append_only is None:
            args += ["--appendonly", "no"]
        else:
            args += ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", self.append_only]
        self.process = processes.spawn(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def command(self, *words: str) -> bytes:
        """One command over a plain socket (inline protocol): the test's own look at the store."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            s.sendall(" ".join(words).encode() + b"\r\n")
            return s.recv(65536)

    def flush(self) -> None:
        assert self.command("FLUSHALL").startswith(b"+OK")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def pause(self) -> None:
        """SIGSTOP: a store that accepts connections and never answers (a hung host)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None:
            self.resume()  # a paused process takes SIGKILL too, but leave nothing stopped
        self.kill()
