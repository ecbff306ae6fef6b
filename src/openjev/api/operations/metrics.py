"""Prometheus metrics, one registry per app (apps are created many times in one test run,
so nothing here is a module global).

Counters and histograms are updated as requests finish; gauges that describe the present
(evaluations and tokens in flight, the prefix cache) are read at scrape time from the
objects that own them (`probe`), so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from openjev.api.contract.paths import SINGLE_DECISION_ROUTES
from openjev.core import types as core

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: from sub-millisecond API work to the 120 s engine deadline.
_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_PHASES = ("prepare", "queue", "prefill", "engine", "total")

Probe = Callable[[], Mapping[str, float]]


class _Live:
    """A collector over `probe()`: the present state, read when Prometheus scrapes."""

    def __init__(self, probe: Probe) -> None:
        self._probe = probe

    def describe(self):
        return []  # names vary with the engine; nothing to check at registration

    def collect(self):
        values = dict(self._probe())
        gauges = {
            "evaluations_in_flight": "decision requests being evaluated (admitted, not finished)",
            "tokens_in_flight": "distinct tokens of the requests admitted to the engine",
            "tokens_in_flight_limit": "--max-tokens-in-flight (0: unlimited)",
            "drain_rate_tokens_per_second": "distinct tokens served per second, measured over the last minute",
            "prefix_cache_bytes": "bytes of prefix KV held by the in-process engine",
            "prefix_cache_max_bytes": "--prefix-cache-bytes",
            "prefix_cache_entries": "prefixes held by the in-process engine",
            "prefix_cache_hit_ratio": "prefix-cache lookups that matched at least one token, since start",
            "draining": "1 after SIGTERM, while in-flight requests finish",
            "ready": "1 once the model is loaded and the server answers decisions",
            "connections_open": "HTTP connections open (--max-connections bounds them)",
            "engine_http_calls_in_flight": "HTTP calls to the engine server in flight (--max-engine-calls bounds them)",
            "pricing_forwards_measured": "in-process engine: forwards its deadline pricing was measured on (1: the "
            "warm-up at load alone; 0: none, nothing priced)",
            "pricing_seconds_per_token": "in-process engine: the measured compute time per token the pricing uses",
            "pricing_attention_measured": "in-process engine: 1 once attention's cost was measured on a long "
            "forward, 0 while the conservative prior prices it",
            "limits_store_up": "1 while the shared limits store (--limits-redis-url) answers; 0 while "
            "--limits-redis-mode holds",
            "content_free_entries": "content-free answers cached (per key, readout and question)",
        }
        for name, help_text in gauges.items():
            if name in values:
                yield GaugeMetricFamily(f"openjev_{name}", help_text, value=values[name])
        counters = {
            "prefix_cache_lookups": "prefix-cache lookups (one per request admitted to the in-process engine)",
            "prefix_cache_hits": "prefix-cache lookups that matched at least one token",
            "engine_forwards": "model forwards run by the in-process engine",
            "engine_http_calls": "HTTP calls made to the engine server (sglang, vllm: one per branch or per batched stage)",
            "engine_shared_calls": "batched calls that carried concurrent requests' stages together (--coalesce-calls)",
            "engine_shared_call_parts": "requests' stages sent in those shared calls",
            "connections_refused": "connections refused with 503 at --max-connections, before any request",
            "connections_head_timeouts": "connections closed at --head-timeout-s (408 for a partial head)",
            "connections_heads_too_large": "requests refused with 431 (head over --max-head-bytes)",
            "connections_slow_readers": "connections dropped because the client left a response unread "
            "for --send-timeout-s",
            "connections_parse_errors": "requests refused by the HTTP parser (400: malformed or smuggling-shaped "
            "framing; 413: over --max-body-chunks), the connection closed",
            "connections_upgrades_refused": "WebSocket upgrade requests refused (400, the connection closed)",
            "limits_store_switches": "switches of the shared limits store between answering and not",
            "content_free_hits": "content-free answers a calibrated question found cached",
            "content_free_misses": "content-free answers read (each one more engine call beside a request)",
        }
        for name, help_text in counters.items():
            if name in values:
                yield CounterMetricFamily(f"openjev_{name}", help_text, value=values[name])


class Metrics:
    def __init__(self, probe: Probe) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)  # RSS, CPU seconds, open fds (Linux)
        r.register(_Live(probe))
        self.requests = Counter(
            "openjev_requests",
            "HTTP requests by route, status and API key name",
            ("route", "status", "key"),
            registry=r,
        )
        self.rejections = Counter(
            "openjev_rejections",
            "requests refused (4xx/5xx) by status and error_type",
            ("status", "error_type"),
            registry=r,
        )
        self.phase = Histogram(
            "openjev_phase_seconds",
            "decision request time by phase (total: the whole HTTP "
            "request on every decision route, or a batch item until its line; prepare: compile; queue/prefill: in-process engine; engine: the engine call)",
            ("phase",),
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "openjev_tokens",
            "tokens of answered decisions: distinct (the request's own, "
            "state once), computed (prefilled), cached (from a prefix cache)",
            ("kind",),
            registry=r,
        )
        self._engine_and_answers(r)
        self._zeros()

    def _engine_and_answers(self, r: CollectorRegistry) -> None:
        """The batch's, the engine's and the answers' metrics."""
        self.batch_items = Counter(
            "openjev_batch_items",
            "batch items by status and API key name (each is also in rejections, answers and tokens)",
            ("status", "key"),
            registry=r,
        )
        self.engine_calls = Counter("openjev_engine_calls", "plans sent to the engine", registry=r)
        self.engine_failures = Counter(
            "openjev_engine_failures", "engine calls that raised, by error_type", ("error_type",), registry=r
        )
        self.answers = Counter("openjev_answers", "answers given, by question type", ("type",), registry=r)
        self.label_mass = Histogram(
            "openjev_label_mass",
            "probability mass the model put on the answer labels (low: the model wanted to say something else)",
            ("type",),
            buckets=(0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0),
            registry=r,
        )

    def _zeros(self) -> None:
        """Label sets present from the first scrape, so rate() has a zero to start from."""
        for phase in _PHASES:
            self.phase.labels(phase)
        for kind in ("distinct", "computed", "cached"):
            self.tokens.labels(kind)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def observe_request(self, route: str, status: int, key: str, error_type: str | None, total_s: float) -> None:
        self.requests.labels(route, str(status), key).inc()
        if status >= 400:
            self.rejections.labels(str(status), error_type or "unknown").inc()
        if route in SINGLE_DECISION_ROUTES:  # every format's; a batch's time is its items'
            self.phase.labels("total").observe(total_s)

    def observe_item(self, status: int, key: str, error_type: str | None, total_s: float) -> None:
        """One batch item's outcome, its time from the batch's start to its line (its answers
        and tokens go through observe_result)."""
        self.batch_items.labels(str(status), key).inc()
        if status >= 400:
            self.rejections.labels(str(status), error_type or "unknown").inc()
        self.phase.labels("total").observe(total_s)

    def observe_result(self, result: core.DecisionResult) -> None:
        for name in ("prepare", "queue", "prefill", "engine"):
            if name in result.timings_ms:
                self.phase.labels(name).observe(result.timings_ms[name] / 1000)
        usage = result.usage
        self.tokens.labels("distinct").inc(usage.input_tokens)
        if usage.computed_tokens is not None:
            self.tokens.labels("computed").inc(usage.computed_tokens)
        if usage.cached_tokens is not None:
            self.tokens.labels("cached").inc(usage.cached_tokens)
        for _, answer in result.answers:
            kind = answer_type(answer)
            self.answers.labels(kind).inc()
            self.label_mass.labels(kind).observe(answer.label_mass)


def answer_type(answer: core.Answer) -> str:
    if isinstance(answer, core.NoulAnswer):
        return "noul"
    if isinstance(answer, core.ChoiceAnswer):
        return "choice"
    return "score"
