"""Property-based fuzz of a real `openjev serve` (the embedded model) from the OpenAPI document
it serves: no 5xx, every status, Content-Type and body as documented. Smaller than the
in-process run (tests/api/test_fuzz.py): a valid request here is a real prefill. Limits are
set low so that generated requests stay cheap and reach the refusals (413, 422 budgets).
OPENJEV_FUZZ_LIVE_EXAMPLES sets the examples per operation."""

from __future__ import annotations

import os
from collections import Counter, defaultdict

import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode

from tests.integration.conftest import start_server, stop_server
from tests.support.fuzzing import CHECKS, bounded, print_figures

EXAMPLES = int(os.environ.get("OPENJEV_FUZZ_LIVE_EXAMPLES", "40"))
FIGURES: dict[str, Counter[int]] = defaultdict(Counter)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    server = start_server(
        tmp_path_factory.mktemp("fuzz"),
        *("--max-questions", "4", "--max-body-bytes", "65536", "--max-request-tokens", "2048"),
        *("--max-branch-tokens", "1024", "--engine-timeout-s", "60"),
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def live_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_live_server_no_5xx_and_as_documented(live_schema, mode):
    """Each operation in turn, `EXAMPLES` generated cases each (schemathesis' pytest loader
    for fixtures does not run under this pytest, so the hypothesis tests are built here)."""
    for result in live_schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # nothing to negate in a GET without parameters

        @given(case=operation.as_strategy(generation_mode=mode))
        @bounded(EXAMPLES)
        def fuzz(case):
            response = case.call_and_validate(checks=CHECKS, timeout=90)
            FIGURES[case.operation.label][response.status_code] += 1

        fuzz()


def test_zz_live_fuzz_figures(fuzz_server, capsys):
    with capsys.disabled():
        print_figures(f"live openjev serve, embedded model, max_examples={EXAMPLES}", FIGURES)
    assert FIGURES["POST /v1/systemone"][200] > 0 and FIGURES["POST /v1/systemone"][422] > 0
    assert FIGURES["POST /v1/decisions"][200] > 0 and FIGURES["POST /v1/decisions"][400] > 0
    # the server is still healthy after the fuzz
    import httpx

    assert httpx.get(fuzz_server.url + "/health", timeout=10).status_code == 200
