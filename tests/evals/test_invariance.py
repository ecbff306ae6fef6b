"""`openjev eval --invariance`: jevbench-mini's relations measured through the server, with
the eval's own readout (a fake engine whose log-probs depend only on each branch's tokens)."""

import json
from pathlib import Path

import pytest

from openjev.cli import main
from openjev.config import load_settings
from openjev.evals import invariance
from openjev.evals.local import local_server
from tests.api.conftest import fake_loader
from tests.support.fakes import FakeEngine

pytest.importorskip("jevbench")
DEV = str(Path(__file__).resolve().parents[2] / "evals" / "data" / "dev.jsonl")


@pytest.fixture(scope="module")
def fake_url():
    with local_server(load_settings({}, environ={}), loader=fake_loader(FakeEngine())) as url:
        yield url


def test_eval_reports_the_relations_beside_accuracy_and_mirror_keeps_them(fake_url, tmp_path):
    out = tmp_path / "run"
    argv = ["eval", DEV, "--url", fake_url, "--out", str(out), "--limit", "2", "--no-progress"]
    assert main([*argv, "--readout", "mirror", "--invariance"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    inv = summary["invariance"]
    assert set(inv["relations"]) == set(invariance.RELATIONS)
    # a choice whose options read the same is refused on every route (a 422: which of two
    # identical options is "the" answer would be decided by position), so each of jevbench's
    # 24 clone trials is a refused request and that relation has nothing to measure
    assert inv["tests"]["clone_symmetry"] == 0 and inv["relations"]["clone_symmetry"] is None
    assert inv["errors"] == 24
    assert all(inv["tests"][name] == 24 for name in invariance.RELATIONS if name != "clone_symmetry")
    # mirror: a choice is one plan for any order, a noul is a yes/no choice's two readings, and a
    # question's branches never see the batch
    for name in ("noul_as_choice", "batch_order"):
        assert inv["relations"][name] == 1.0
    assert "option_permutation" in (out / "summary.md").read_text()


def test_a_readout_in_the_callers_order_breaks_option_permutation(fake_url):
    got = invariance.measure(
        fake_url, {"x-openjev-readout": "letters", "x-openjev-rotations": "1"}, relations=("option_permutation",)
    )
    assert got["relations"]["option_permutation"] < 0.5  # the fake's answer follows the text it is shown
