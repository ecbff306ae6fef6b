"""What the schemathesis fuzz runs share (tests/api/test_fuzz.py in-process,
tests/integration/test_fuzz_live.py against a real server): the checks, the bounded and
reproducible hypothesis settings, and the printed figures. Builds no app."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

# No 5xx; every status, Content-Type and body as the OpenAPI document says.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def bounded(max_examples: int) -> settings:
    """Hypothesis settings for CI: `max_examples` per operation, derandomized (a run is
    reproducible), no example database, no shrinking phase, no health-check refusals."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def print_figures(title: str, figures: dict[str, Counter[int]]) -> None:
    """One line per operation: requests sent and the statuses seen."""
    print(f"\nschemathesis figures ({title}):")
    for label in sorted(figures):
        statuses = ", ".join(f"{code}: {n}" for code, n in sorted(figures[label].items()))
        print(f"  {label}: {sum(figures[label].values())} requests ({statuses})")
