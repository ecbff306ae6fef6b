"""The served paths, named once. The decision routes (the vendor's, its aliases and the
batch) are the ones admission charges a request to, the drain guards and the metrics
label; every other path outside `ROUTES` is labelled "other" (bounded label values)."""

from __future__ import annotations

DECISION_ROUTES = ("/v1/systemone", "/v1/decisions", "/api/alpha/decisions", "/v1/systemone/batch")
ROUTES = (
    *DECISION_ROUTES,
    "/",
    "/playground",
    "/v1/models",
    "/v1/limits",
    "/health",
    "/health/live",
    "/metrics",
    "/docs",
    "/redoc",
    "/openapi.json",
)


def route_of(path: str) -> str:
    return path if path in ROUTES else "other"
