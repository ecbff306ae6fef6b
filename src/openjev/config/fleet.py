"""The API tier past one process: the shared limits store (Redis) that makes every
replica's per-key limits one, what a replica does while that store is away, and the API
processes one host runs (`--workers`). Checked at start by `check_fleet`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openjev.config.fields import opt
from openjev.errors import ConfigError

FAILURE_MODES = ("closed", "local", "open")
REMOTE_ENGINES = ("sglang", "vllm")


@dataclass(frozen=True)
class FleetSettings:
    """Replicas sharing one set of per-key limits (api/identity/shared.py), and workers."""

    limits_redis_url: str | None = opt(
        None,
        "redis://HOST:PORT/DB of a Redis that holds every per-key limit (requests/min, tokens/min, refused "
        "work, in-flight share) for all replicas that name it; none: this process's memory",
    )
    limits_redis_mode: str = opt(
        "local",
        "while that Redis does not answer: closed (503 with Retry-After), local (each replica enforces its "
        "share, limit / --limits-replicas) or open (per-key limits off until it answers)",
    )
    limits_redis_timeout_ms: float = opt(
        250.0, "bound on each call to that Redis; past it the call counts as a failure and the mode holds"
    )
    limits_replicas: int = opt(
        1, "API processes sharing the limits (replicas x --workers): mode local divides each limit by it"
    )
    workers: int = opt(
        1,
        "API processes on this host sharing --port (remote engines with --connect only; give them "
        "--limits-redis-url so their limits are one)",
    )


def check_fleet(v: Mapping[str, Any]) -> None:
    """ConfigError for a fleet setting that cannot work."""
    if v["limits_redis_mode"] not in FAILURE_MODES:
        raise ConfigError(
            f"limits_redis_mode must be one of {', '.join(FAILURE_MODES)}, got {v['limits_redis_mode']!r}"
        )
    url = v["limits_redis_url"]
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("limits_redis_url must start with redis://, rediss:// or unix://")
    if not 0 < v["limits_redis_timeout_ms"] <= 10_000:
        raise ConfigError(f"limits_redis_timeout_ms must be in (0, 10000], got {v['limits_redis_timeout_ms']!r}")
    for name in ("limits_replicas", "workers"):
        if not 1 <= v[name] <= 1024:
            raise ConfigError(f"{name} must be between 1 and 1024, got {v[name]!r}")
    if v["workers"] > 1 and (v["engine"] not in REMOTE_ENGINES or not v["connect"]):
        raise ConfigError(
            f"--workers {v['workers']}: only an API tier in front of a running engine server can have several "
            "processes (--engine sglang or vllm with --connect URL); an in-process engine holds the model in "
            "its one process, and a child engine server would be started once per worker; run one process, "
            "or one engine server and several API processes in front of it"
        )
    if v["workers"] > 1 and url is None:
        raise ConfigError(
            f"--workers {v['workers']} without --limits-redis-url: each worker would hold its own per-key "
            "limits (a key would get that many times its limit); give the workers a shared Redis"
        )
