"""The server's configuration for uvicorn: the bounded h11 protocol class of one server
(`http_protocol`, api/operations/connections.py), the `uvicorn.Config` every server of
openjev is started with (`uvicorn_config`: the CLI's, `openjev eval`'s in-process one, the
tests'), and the process's open-file limit raised to fit --max-connections."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import uvicorn

from openjev.api.operations.clients import PerClient
from openjev.api.operations.connections import COUNTS, BoundedH11Protocol
from openjev.api.operations.h11_parts import THROTTLE, ConnectionLimits
from openjev.config import ConnectionSettings, ListenSettings

log = logging.getLogger(__name__)


def http_protocol(limits: ConnectionLimits) -> type[BoundedH11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`; one class (and refusal count) per server."""
    state = {
        "limits": limits,
        "refusing": 0,
        "open_connections": 0,
        "per_client": PerClient(limits.max_per_client, limits.proxies),
        "warned_at": float("-inf"),
        "counts": dict.fromkeys(COUNTS, 0),
    }
    return type("BoundedH11Protocol", (BoundedH11Protocol,), state)


StatsSource = Callable[[], dict[str, float]]


def uvicorn_config(
    app: Any,
    listen: ListenSettings,
    connections: ConnectionSettings,
    *,
    connection_stats_to: Callable[[StatsSource], None] | None = None,
    **options: Any,
) -> uvicorn.Config:
    """uvicorn's Config for `app` on `listen`'s address under the `connections` limits (the CLI's server, the
    in-process one of `openjev eval`, and the tests' all go through here). The protocol's
    connection counts are handed to `connection_stats_to` (the app's operations, for
    /metrics to read at scrape time)."""
    protocol = http_protocol(ConnectionLimits.of(connections, listen.trusted_proxies))
    uvicorn_log = logging.getLogger("uvicorn.error")
    if THROTTLE not in uvicorn_log.filters:
        uvicorn_log.addFilter(THROTTLE)
    if connection_stats_to is not None:
        connection_stats_to(protocol.stats)
    return uvicorn.Config(
        app,
        host=options.pop("host", listen.host),
        port=options.pop("port", listen.port),
        http=protocol,
        ws="none",  # WebSocket upgrades are refused by the protocol (api/operations/framing.py), never taken over
        proxy_headers=False,  # X-Forwarded-For only from --trusted-proxies (api/identity/proxies.py)
        **options,
    )


def fit_open_files(max_connections: int, spare: int = 256) -> None:
    """Raise the soft open-file limit so that --max-connections can be reached (plus `spare`
    for weights, logs and engine calls): past the limit accept() fails and uvicorn stops
    accepting for a while, refusing everyone. Warns where the hard limit is lower."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + spare
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < need:
        log.warning(
            "open-file limit %d is below --max-connections %d + %d: lower --max-connections or raise ulimit -n",
            target,
            max_connections,
            spare,
        )
