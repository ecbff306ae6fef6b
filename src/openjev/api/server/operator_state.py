"""The operators' state of one app, built once by the app factory: the keys and their
buckets, the token gate, the metrics and the access log, the drain, the trusted proxies.
The middleware that use it each have one job, in this order from the outside in (see
api/server/app.py): the access log and metrics (api/operations/access.py), errors in the
contract's shape (api/operations/middleware.py), admission at the door
(api/identity/door.py), GET /metrics, and the drain (api/server/drain.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from openjev.api.identity.admission import EngineAdmission, GatedEngine, KeyShare
from openjev.api.identity.fleet_share import FleetShare
from openjev.api.identity.key_limits import KeyLimits
from openjev.api.identity.keys import KeyRing
from openjev.api.identity.proxies import TrustedProxies
from openjev.api.identity.shared import RedisBuckets, RedisStore
from openjev.api.operations.access import AccessLog
from openjev.api.operations.metrics import Metrics
from openjev.api.server.assembly import Runtime
from openjev.api.server.drain import Drain
from openjev.config import FleetSettings, KeySettings, LimitSettings
from openjev.core.ports import Engine


class Operations:
    """The operators' state of one app: keys, per-key buckets, metrics, drain, token gate."""

    def __init__(
        self,
        keys: KeySettings,
        limits: LimitSettings,
        runtime: Runtime,
        *,
        fleet: FleetSettings,
        trusted_proxies: tuple[str, ...],
        log_bodies: bool,
    ) -> None:
        self.limits = limits
        self.runtime = runtime
        self.keys = KeyRing(keys.api_keys, keys.api_keys_file)
        # --limits-redis-url: the buckets and the in-flight share held for every replica (api/identity/shared.py)
        url = fleet.limits_redis_url
        self.store = (
            None
            if url is None
            else RedisStore(url, fleet.limits_redis_mode, fleet.limits_redis_timeout_ms / 1000, fleet.limits_replicas)
        )
        buckets = None if self.store is None else RedisBuckets(self.store)
        self.key_limits = KeyLimits(keys.key_requests_per_min, keys.key_tokens_per_min, buckets=buckets)
        self.drain = Drain(limits.drain_timeout)
        self.metrics = Metrics(self._probe)
        self.access = AccessLog(self.metrics, log_bodies=log_bodies)
        # half the slots: what a batch may take, and what a flooding key may, so another is served
        share = key_share(limits, self.store)
        self.admission = EngineAdmission(self._gate, share)
        self.proxies = TrustedProxies(trusted_proxies)
        # The counts of the server's protocol (api/operations/connections.py), once it serves this app.
        self.connection_stats: Callable[[], dict[str, float]] | None = None

    def store_state(self) -> dict[str, Any]:
        """The limits' store for /v1/limits and an operator's /health: backend, mode, reachable."""
        if self.store is None:
            return {"backend": "memory"}
        return self.store.health.describe()

    def closing(
        self, lifespan: Callable[[Any], AbstractAsyncContextManager[None]]
    ) -> Callable[[Any], AbstractAsyncContextManager[None]]:
        """`lifespan`, then the shared store's connections closed."""

        @asynccontextmanager
        async def run(app: Any) -> AsyncIterator[None]:
            async with lifespan(app):
                yield
            if self.store is not None:
                await self.store.close()

        return run

    def watch_connections(self, stats: Callable[[], dict[str, float]]) -> None:
        """Read the serving protocol's connection counts (`stats`) into /metrics."""
        self.connection_stats = stats

    @property
    def gate(self) -> GatedEngine | None:
        """The engine the service calls, once the admission has wrapped it."""
        return self.admission.gated

    def _gate(self, engine: Engine) -> GatedEngine:
        """The engine the service calls: gated by tokens in flight and per-key tokens/min."""
        return GatedEngine(
            engine,
            max_tokens_in_flight=self.limits.max_tokens_in_flight,
            max_wait_s=self.limits.max_queue_wait,
            key_limits=self.key_limits,
            metrics=self.metrics,
            retry_after_s=self.limits.retry_after_s,
            deadline_s=self.limits.engine_timeout_s,
        )

    def _probe(self) -> dict[str, float]:
        service = self.runtime.service
        out: dict[str, float] = {"draining": float(self.drain.draining), "ready": float(service is not None)}
        if service is not None:
            out["evaluations_in_flight"] = service.in_flight
            out.update(service.content_free.stats())
        if self.connection_stats is not None:
            out.update(self.connection_stats())
        if self.store is not None:
            out.update(self.store.health.stats())
        if self.gate is not None:
            out.update(self.gate.stats())
        elif self.runtime.loaded is not None:
            out.update(self.runtime.loaded.engine.stats())
        return out


def key_share(limits: LimitSettings, store: RedisStore | None) -> KeyShare:
    """Each key's share of the evaluation slots: half of them (what a batch may take, and what a
    flooding key may, so another is served); held across the fleet where the store is shared,
    each lease outliving any request admitted (its engine deadline and its wait)."""
    share = max(1, limits.max_in_flight // 2)
    if store is None:
        return KeyShare(share, limits.max_queue_wait, limits.retry_after_s)
    lease_s = limits.engine_timeout_s + limits.max_queue_wait + 30
    return FleetShare(share, limits.max_queue_wait, limits.retry_after_s, store, lease_s)
