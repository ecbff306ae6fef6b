"""Property-based fuzz of the API from its own OpenAPI document (schemathesis), in-process
against the app with the fake engine: for every operation, valid and invalid requests
generated from the schema (request bodies, the readout headers) must never get a 5xx, and
every response must conform to the document: its status documented, its Content-Type and
its body those documented for that status. The real server gets a smaller run
(tests/integration/test_fuzz_live.py).

Bounded for CI: FUZZ_EXAMPLES examples per operation (env OPENJEV_FUZZ_EXAMPLES), derandomized
so a run is reproducible. The figures (examples and statuses per operation) are printed at the
end of the run."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from openjev.api.app import create_app
from openjev.config import load_settings
from tests.api.conftest import fake_loader
from tests.fakes import FakeEngine

FUZZ_EXAMPLES = int(os.environ.get("OPENJEV_FUZZ_EXAMPLES", "300"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]

# Small limits so that generated bodies reach every refusal (413, 422 budgets) as well as 200.
APP = create_app(
    load_settings(
        {"max_body_bytes": 64 * 1024, "max_questions": 8, "max_request_tokens": 4096, "allowed_hosts": ("testserver",)},
        environ={},
    ),
    loader=fake_loader(FakeEngine()),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)  # starts the app's lifespan (the fake loads)

FIGURES: dict[str, Counter[int]] = defaultdict(Counter)
_lock = threading.Lock()


@pytest.fixture(scope="module", autouse=True)
def loaded():
    """Fuzz the served app, not one still loading (whose 503 is documented but not the point)."""
    runtime = APP.state.runtime
    deadline = time.monotonic() + 10
    while runtime.service is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime.service is not None


@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_5xx_and_every_response_as_documented(case):
    response = case.call_and_validate(checks=CHECKS)
    with _lock:
        FIGURES[case.operation.label][response.status_code] += 1


def test_zz_fuzz_figures(capsys):
    """Prints what the fuzz tried (runs last in this file); every operation was reached."""
    with capsys.disabled():
        print(f"\nschemathesis figures (in-process, fake engine, max_examples={FUZZ_EXAMPLES}):")
        for label in sorted(FIGURES):
            statuses = ", ".join(f"{code}: {n}" for code, n in sorted(FIGURES[label].items()))
            print(f"  {label}: {sum(FIGURES[label].values())} requests ({statuses})")
    labels = {op.ok().label for op in schema.get_all_operations()}
    assert labels <= set(FIGURES), labels - set(FIGURES)
    # the decision routes were both answered and refused
    assert FIGURES["POST /v1/systemone"][200] > 0 and FIGURES["POST /v1/systemone"][422] > 0


# ---- the same checks with API keys on: every request alternates between the right key, a
# wrong one and none, so the documented 401 (and its body) is exercised alongside the rest.

KEYED_APP = create_app(
    load_settings(
        {"max_questions": 8, "max_request_tokens": 4096, "allowed_hosts": ("testserver",), "api_keys": ("fuzz-key",)},
        environ={},
    ),
    loader=fake_loader(FakeEngine()),
)
keyed_schema = schemathesis.openapi.from_asgi("/openapi.json", KEYED_APP, headers={"Authorization": "Bearer fuzz-key"})
KEYED_FIGURES: dict[str, Counter[int]] = defaultdict(Counter)
AUTH_VARIANTS = ({"Authorization": "Bearer fuzz-key"}, {"Authorization": "Bearer wrong-key"}, {})
_turn = iter(range(1 << 30))


@pytest.fixture(scope="module", autouse=True)
def keyed_loaded():
    runtime = KEYED_APP.state.runtime
    deadline = time.monotonic() + 10
    while runtime.service is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime.service is not None


@keyed_schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES // 3,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_with_keys_no_5xx_and_every_response_as_documented(case):
    with _lock:
        auth = AUTH_VARIANTS[next(_turn) % len(AUTH_VARIANTS)]
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    case.headers = {**headers, **auth}
    response = case.call_and_validate(checks=CHECKS)
    with _lock:
        KEYED_FIGURES[case.operation.label][response.status_code] += 1


def test_zz_keyed_fuzz_figures(capsys):
    with capsys.disabled():
        print(f"\nschemathesis figures (in-process, API keys on, max_examples={FUZZ_EXAMPLES // 3}):")
        for label in sorted(KEYED_FIGURES):
            statuses = ", ".join(f"{code}: {n}" for code, n in sorted(KEYED_FIGURES[label].items()))
            print(f"  {label}: {sum(KEYED_FIGURES[label].values())} requests ({statuses})")
    for label in ("POST /v1/systemone", "GET /v1/models"):  # refused without the key, served with it
        assert KEYED_FIGURES[label][401] > 0 and KEYED_FIGURES[label][200] > 0, KEYED_FIGURES[label]
