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

from openjev.api.server.app import create_app
from openjev.config import load_settings
from tests.api.conftest import fake_loader
from tests.support.fakes import FakeEngine
from tests.support.fuzzing import CHECKS, bounded, print_figures

FUZZ_EXAMPLES = int(os.environ.get("OPENJEV_FUZZ_EXAMPLES", "300"))

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


def _wait_loaded(app) -> None:
    runtime = app.state.runtime
    deadline = time.monotonic() + 10
    while runtime.service is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime.service is not None


@pytest.fixture(scope="module", autouse=True)
def loaded():
    """Fuzz the served apps, not ones still loading (whose 503 is documented but not the point)."""
    _wait_loaded(APP)
    _wait_loaded(KEYED_APP)


@schema.parametrize()
@bounded(FUZZ_EXAMPLES)
def test_no_5xx_and_every_response_as_documented(case):
    response = case.call_and_validate(checks=CHECKS)
    with _lock:
        FIGURES[case.operation.label][response.status_code] += 1


def test_zz_fuzz_figures(capsys):
    """Prints what the fuzz tried (runs last in this file); every operation was reached."""
    with capsys.disabled():
        print_figures(f"in-process, fake engine, max_examples={FUZZ_EXAMPLES}", FIGURES)
    labels = {op.ok().label for op in schema.get_all_operations()}
    assert labels <= set(FIGURES), labels - set(FIGURES)
    # the decision routes were both answered and refused
    assert FIGURES["POST /v1/systemone"][200] > 0 and FIGURES["POST /v1/systemone"][422] > 0
    # OpenAI's face: answered, and refused with its own 400 (never a 422)
    assert FIGURES["POST /v1/decisions"][200] > 0 and FIGURES["POST /v1/decisions"][400] > 0
    assert FIGURES["POST /v1/decisions"][422] == 0


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


@keyed_schema.parametrize()
@bounded(FUZZ_EXAMPLES // 3)
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
        print_figures(f"in-process, API keys on, max_examples={FUZZ_EXAMPLES // 3}", KEYED_FIGURES)
    for label in ("POST /v1/systemone", "POST /v1/decisions", "GET /v1/models"):  # 401 without the key, 200 with it
        assert KEYED_FIGURES[label][401] > 0 and KEYED_FIGURES[label][200] > 0, KEYED_FIGURES[label]
