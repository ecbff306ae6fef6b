"""Readouts and calibration on the real embedded model: the trie's promise under every
readout, the shipped calibration applied by default, a foreign one refused at start,
jevcompat under yesno, and `openjev eval` against a real server."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from openjev.core.prompts import PromptCompiler
from openjev.core.readouts import LettersReadout, YesNoReadout
from openjev.core.types import DecisionRequest, State, Turn
from openjev.core.wording import PROMPT_VERSION
from openjev.engines.torch.engine import TransformersEngine
from tests.integration.conftest import start_server, stop_server
from tests.integration.test_embedded_model import _independent, _max_diff, _run
from tests.integration.test_live_server import README_EXAMPLE
from tests.support.tickets import QUESTIONS, TEXT


@pytest.fixture(scope="module")
def compiler(embedded):
    return PromptCompiler(embedded.tokenizer, max_labels=255)


def _readouts(compiler):
    labels = compiler.labels
    assert compiler.yes_no is not None  # SmolLM2 reads " Yes" / " No" as one token each
    return {
        "yesno": YesNoReadout(*compiler.yes_no),
        "letters-r4": LettersReadout(labels.texts, labels.ids, rotations=4),
    }


@pytest.mark.parametrize("name", ["yesno", "letters-r4"])
def test_every_readout_computes_each_distinct_token_once_cold(embedded, compiler, name):
    readout = _readouts(compiler)[name]
    state = State((Turn("user", TEXT.format(n=7000 + len(name)) * 2),))  # never seen: cold
    plan = compiler.compile(DecisionRequest(state, QUESTIONS), readout).plan
    assert len(plan.branches) > len(QUESTIONS)  # extra readings ...
    [result] = _run(TransformersEngine(embedded.engine.model, prefix_cache_bytes=0), plan)
    assert result.computed_tokens == plan.unique_tokens and result.cached_tokens == 0  # ... at the floor
    assert plan.prompt_tokens > 2 * plan.unique_tokens
    assert _max_diff(_independent(embedded.engine.model, plan), result) < 1e-4


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    # the defaults exactly as `make serve` has them (bfloat16 where this CPU computes it natively)
    server = start_server(tmp_path_factory.mktemp("quality"), env={"OPENJEV_DTYPE": "auto"})
    yield server
    stop_server(server)


def test_the_shipped_calibration_is_applied_by_default_and_can_be_switched_off(default_server):
    model = httpx.get(default_server.url + "/v1/models", timeout=10).json()["models"][0]
    cal = model["x_calibration"]
    assert cal is not None and cal["applies_to_default"], model
    assert model["x_prompt_version"] == PROMPT_VERSION
    url = default_server.url + "/v1/systemone"
    fitted = httpx.post(url, json=README_EXAMPLE, timeout=60)
    raw = httpx.post(url, json=README_EXAMPLE, headers={"x-openjev-calibration": "none"}, timeout=60)
    assert fitted.status_code == raw.status_code == 200
    assert fitted.headers["x-openjev-calibration"] == cal["id"] and raw.headers["x-openjev-calibration"] == "none"
    # The default readout is canonical (one reading per choice, options in an order of their
    # own text; a scale both ways), and the shipped file has a fit for it: the header names
    # what was read.
    assert model["x_readout"] == "canonical"
    assert fitted.headers["x-openjev-readout"] == raw.headers["x-openjev-readout"] == "canonical"
    assert fitted.json()["answers"] != raw.json()["answers"]


def test_eval_command_against_a_real_server(default_server, tmp_path):
    data = os.path.join(os.path.dirname(__file__), "..", "..", "evals", "data", "test.jsonl")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "openjev",
            "eval",
            data,
            "--url",
            default_server.url,
            "--limit",
            "3",
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["run"]["items_failed"] == 0 and summary["metrics"]["all"]["questions"] > 3
    assert summary["run"]["tokens_computed_per_request"] > 0


def test_a_calibration_for_another_model_is_refused_at_start(default_server, tmp_path):
    model = httpx.get(default_server.url + "/v1/models", timeout=10).json()["models"][0]
    foreign = {
        "format": "openjev-calibration/1",
        "id": "qwen-cal",
        "prompt_version": PROMPT_VERSION,
        "model": {"name": "qwen3-8b", "fingerprint": "sha256:0123"},
        "fits": [{"readout": "letters", "types": {"choice": {"temperature": 2.0}}}],
    }
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(foreign))
    server = start_server(tmp_path, "--calibration", str(path), wait=False)
    try:
        assert server.process.wait(180) == 1
        log = open(server.log_path).read()
        assert "calibration 'qwen-cal'" in log and "qwen3-8b" in log and model["x_fingerprint"] in log
    finally:
        stop_server(server)
    missing = start_server(tmp_path, "--calibration", str(tmp_path / "nope.json"), wait=False)
    try:
        assert missing.process.wait(60) == 2  # before listening
        assert "cannot read" in open(missing.log_path).read()
    finally:
        stop_server(missing)


def test_jevcompat_passes_under_the_yesno_readout(tmp_path):
    server = start_server(tmp_path, "--readout", "yesno", key="test-key-yesno")
    try:
        report = tmp_path / "jevcompat.json"
        proc = subprocess.run(
            [
                os.path.join(os.path.dirname(sys.executable), "jevcompat"),
                "test",
                server.url,
                "--key-env",
                "OPENJEV_TEST_KEY",
                "--json",
                str(report),
            ],
            env={**os.environ, "OPENJEV_TEST_KEY": server.key},
            capture_output=True,
            text=True,
            timeout=900,
        )
        summary = json.loads(report.read_text())["summary"]
        assert summary["verdict"] == "conformant", proc.stdout[-4000:]
        assert summary["MUST"]["passed"] == 32 and summary["SHOULD"]["passed"] == 15
        r = httpx.post(server.url + "/v1/systemone", json=README_EXAMPLE, headers=server.headers(), timeout=60)
        assert r.headers["x-openjev-readout"] == "yesno"
    finally:
        stop_server(server)
