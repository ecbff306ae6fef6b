"""An openjev server in this process, on a free loopback port, for `--in-process` runs:
the same app, engine and HTTP path a remote server has."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from openjev.config import Settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_server(settings: Settings, *, timeout_s: float = 600.0, loader=None) -> Iterator[str]:
    """Serve `settings` until the block ends; yields the base URL once /health is 200.
    `loader` replaces the engine loader (tests pass a fake one).

    Raises RuntimeError with the reason if the model fails to load."""
    import uvicorn

    from openjev.api.operations.serving import uvicorn_config
    from openjev.api.server.app import create_app
    from openjev.engines import load_engine

    failed: list[BaseException] = []
    app = create_app(settings, loader=loader or load_engine, on_fatal=failed.append)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn_config(
            app,
            settings.listen,
            settings.connections,
            connection_stats_to=app.state.ops.watch_connections,
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, name="openjev-local-server", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if failed:
                raise RuntimeError(f"the in-process server cannot serve: {failed[0]}")
            if not thread.is_alive():
                raise RuntimeError("the in-process server stopped")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process server was not healthy in time")
            time.sleep(0.1)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
