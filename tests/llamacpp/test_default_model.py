"""The model `make serve` serves (Qwen2.5-Coder-1.5B, Q4_K_M GGUF as shipped, on llama.cpp)
with its shipped calibration, for real: `make test-llamacpp` installs it first
(scripts/setup_default_model.sh), so a missing model is a failure here, never a skip.

    OPENJEV_LLAMACPP=1 .venv/bin/python -m pytest tests/llamacpp/test_default_model.py
"""

from __future__ import annotations

import os

import httpx
import pytest

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        os.environ.get("OPENJEV_LLAMACPP") != "1", reason="the llama.cpp suite runs with `make test-llamacpp`"
    ),
]

DEFAULT = "qwen2.5-coder-1.5b"
README_STATE = "Hi, I was charged twice for order #1234 and I want my money back today."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.integration.conftest import start_server, stop_server

    live = start_server(
        tmp_path_factory.mktemp("default-model"), "--engine", "llamacpp", "--model", DEFAULT, key="test-key-default"
    )
    yield live
    stop_server(live)


def test_the_default_model_is_installed_with_its_pinned_hash():
    from openjev.config import load_settings
    from openjev.engines.models import named

    entry = named.NAMED_MODELS[DEFAULT]
    assert named.is_complete(entry, load_settings({}, environ={}).served.cache_dir)


def test_the_readme_example_is_answered_with_the_shipped_calibration(server):
    body = {
        "model": "jev-latest",
        "state": README_STATE,
        "questions": {
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "department": {
                "type": "choice",
                "instructions": "Which team should handle this?",
                "criteria": {"billing": "Payments, charges and refunds", "technical": "Bugs in the app"},
            },
        },
    }
    got = httpx.post(
        server.url + "/v1/systemone", json=body, headers={"Authorization": f"Bearer {server.key}"}, timeout=300
    )
    assert got.status_code == 200, got.text
    assert got.headers["x-openjev-calibration"].startswith(DEFAULT)
    answers = got.json()["answers"]
    # a model that knows something: the refund is asked for, and it is billing's
    assert answers["refund"]["noul"] > 0.9
    assert answers["department"]["choice"] == "billing" and answers["department"]["confidence"] > 0.8


def test_jevcompat_is_conformant_on_the_default_model(server, tmp_path):
    from tests.integration.test_live_server import run_jevcompat

    run_jevcompat(server.url, server.key or "", tmp_path)
