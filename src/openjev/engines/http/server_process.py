"""An engine server (SGLang, SGLang-JAX or vLLM) started as our child, in its own process group.

The pair lives and dies together: if the child exits, `watch` reports it so the server
exits non-zero (an orchestrator then restarts both, instead of routing to an API whose
backend is gone); on shutdown the whole group gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from openjev.errors import ConfigError, EngineUnavailable

log = logging.getLogger(__name__)

# Flags that defeat reading shared prefixes once; refused unless the strategy is `all`.
RADIX_OFF = "--disable-radix-cache"


def check_args(args: Sequence[str], strategy: str) -> None:
    if RADIX_OFF in args and strategy != "all":
        raise ConfigError(
            f"{RADIX_OFF} turns off the prefix cache that the {strategy!r} strategy relies on; "
            "remove it or use --strategy all"
        )


def wait_healthy(url: str, timeout_s: float, process: subprocess.Popen | None = None, name: str = "SGLang") -> None:
    """Block until GET /health answers 200; EngineUnavailable if the child dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise EngineUnavailable(f"the {name} server exited with code {process.returncode} while starting")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            raise EngineUnavailable(f"no healthy {name} server within {timeout_s:g} s", detail=url)
        time.sleep(0.5)


@dataclass
class ServerProcess:
    python: str
    model: str
    port: int
    module: str = "sglang.launch_server"
    host: str = "127.0.0.1"
    model_flag: str = "--model-path"  # vLLM's api_server: --model
    name: str = "SGLang"  # for messages
    python_flag: str = "--sglang-python"  # the setting that named `python`, for messages
    extra_args: tuple[str, ...] = ()
    log_path: str | None = None
    env: Mapping[str, str] | None = None  # the child's whole environment (default: ours)
    cwd: str | None = None
    process: subprocess.Popen | None = field(default=None, init=False)
    _stopping: bool = field(default=False, init=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            self.module,
            self.model_flag,
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self) -> None:
        if not os.path.exists(self.python):
            raise ConfigError(f"{self.python_flag} {self.python!r}: no such interpreter")
        log.info("starting %s", " ".join(self.command()))
        out = open(self.log_path, "ab") if self.log_path else None
        try:  # the child keeps its own copy of the log descriptor
            self.process = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()

    def wait_healthy(self, timeout_s: float) -> None:
        wait_healthy(self.url, timeout_s, self.process, self.name)

    def watch(self, on_exit: Callable[[BaseException], None]) -> None:
        """Call `on_exit` (from a daemon thread) if the child exits before `stop`."""

        process = self.process
        if process is None:
            raise RuntimeError("watch() before start()")

        def loop() -> None:
            code = process.wait()
            if not self._stopping:
                on_exit(EngineUnavailable(f"the {self.name} server exited with code {code}"))

        threading.Thread(target=loop, name=f"{self.name.lower()}-watch", daemon=True).start()

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the whole group, then SIGKILL to whatever of it is left: the servers'
        schedulers are grandchildren that can outlive the leader."""
        self._stopping = True
        if self.process is None:
            return
        group = self.process.pid
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(group):
                self.process.poll()  # reap the leader so it does not linger as a zombie
                time.sleep(0.1)
            if not _group_alive(group):
                break
        self.process.poll()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
