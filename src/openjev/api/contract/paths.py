"""The served paths, named once. The decision routes (each wire format's, api/contract/formats.py,
and the batch) are the ones admission charges a request to, the drain guards and the
metrics label; every other path outside `ROUTES` is labelled "other" (bounded label values)."""

from __future__ import annotations

from openjev.api.contract.formats import FORMATS

BATCH = "/v1/systemone/batch"
MODELS = "/v1/models"
LIMITS = "/v1/limits"
TASKS = "/v1/tasks"
OUTCOMES = "/v1/outcomes"
HEALTH = "/health"
LIVE = "/health/live"
METRICS = "/metrics"
PROBES = (HEALTH, LIVE, METRICS)  # polled every few seconds: their log lines are debug

# One request, one decision: each format's paths (its own name first, then its aliases).
SINGLE_DECISION_ROUTES = tuple(path for fmt in FORMATS for path in fmt.paths)
DECISION_ROUTES = (*SINGLE_DECISION_ROUTES, BATCH)
ROUTES = (
    *DECISION_ROUTES,
    "/",
    "/playground",
    MODELS,
    LIMITS,
    TASKS,
    OUTCOMES,
    HEALTH,
    LIVE,
    METRICS,
    "/docs",
    "/redoc",
    "/openapi.json",
)


def route_of(path: str) -> str:
    return path if path in ROUTES else "other"
