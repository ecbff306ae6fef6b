"""`openjev eval` / `openjev calibrate` against a real HTTP server (uvicorn on loopback)
over a named fake engine: resumability, the files a run leaves, the calibration written."""

import json
from pathlib import Path

import pytest

from openjev.cli import main
from openjev.config import load_settings
from openjev.core import calibration as calib
from openjev.evals.dataset import load_items
from openjev.evals.local import local_server
from openjev.evals.runner import ResultStore, RunConfig, RunMismatch, run_items, run_meta, score
from tests.api.conftest import fake_loader
from tests.support.fakes import FakeEngine

DEV = str(Path(__file__).resolve().parents[2] / "evals" / "data" / "dev.jsonl")


@pytest.fixture
def fake_server():
    engine = FakeEngine()
    with local_server(load_settings({}, environ={}), loader=fake_loader(engine)) as url:
        yield url, engine


async def test_runs_resume_and_refuse_another_runs_folder(fake_server, tmp_path):
    url, engine = fake_server
    items = load_items(DEV)[:6]
    config = RunConfig(readout="yesno")
    meta = run_meta([DEV], url, config)
    store = ResultStore(tmp_path, meta)
    await run_items(url, items[:3], config, store, progress=False)
    sent = len(engine.plans)
    flips = sum(1 for i in items[:3] if any(q["type"] == "choice" for q in i.request["questions"].values()))
    assert sent == 3 + flips
    # an interrupted run picks up where it stopped: only the new items are sent
    resumed = ResultStore(tmp_path, meta)
    await run_items(url, items, config, resumed, progress=False)
    jobs = sum(1 + any(q["type"] == "choice" for q in i.request["questions"].values()) for i in items)
    assert len(engine.plans) == jobs  # each request sent once over both runs
    assert len(resumed.records) == jobs
    before = len(engine.plans)
    await run_items(url, items, config, ResultStore(tmp_path, meta), progress=False)
    assert len(engine.plans) == before  # nothing left to send
    scored, facts = score(items, resumed)
    assert len(scored) == sum(len(i.expected) for i in items)
    assert facts["readout"] == ["yesno"] and facts["items_failed"] == 0
    assert all(s.flipped is not None for s in scored if s.qtype == "choice")
    with pytest.raises(RunMismatch, match="readout"):
        ResultStore(tmp_path, run_meta([DEV], url, RunConfig(readout="letters")))


async def test_failed_requests_are_recorded_and_retried(fake_server, tmp_path):
    url, _engine = fake_server
    (item,) = load_items(DEV)[:1]
    bad = type(item)(item.id, {**item.request, "model": "gpt-4"}, item.expected)  # 404 not_found
    store = ResultStore(tmp_path, {"x": 1})
    await run_items(url, [bad], RunConfig(flips=False), store, progress=False)
    scored, facts = score([bad], store)
    assert scored == [] and facts["items_failed"] == 1 and facts["failures"][0]["status"] == 404
    await run_items(url, [item], RunConfig(flips=False), ResultStore(tmp_path, {"x": 1}), progress=False)
    assert ResultStore(tmp_path, {"x": 1}).done((item.id, "main"))


def test_eval_command_writes_summary_table_and_diagram(fake_server, tmp_path, capsys):
    url, _ = fake_server
    out = tmp_path / "run"
    assert (
        main(
            [
                "eval",
                DEV,
                "--url",
                url,
                "--out",
                str(out),
                "--limit",
                "8",
                "--no-progress",
                "--readout",
                "letters",
                "--rotations",
                "2",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["readout"] == ["letters;rotations=2"]
    assert set(summary["metrics"]) == {"noul", "choice", "score", "all"}
    assert 0 <= summary["metrics"]["all"]["ece"] <= 1 and summary["metrics"]["choice"]["order_flip_rate"] is not None
    # under the server's abstain rule: the share answered, and the accuracy on those
    assert summary["metrics"]["all"]["coverage"] == pytest.approx(1 - summary["run"]["abstained_share"])
    assert "acc. answered" in (out / "summary.md").read_text()
    assert (out / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| all |" in (out / "summary.md").read_text() and "| all |" in capsys.readouterr().out


def test_calibrate_command_writes_a_loadable_file_bound_to_the_server(fake_server, tmp_path):
    url, _ = fake_server
    target = tmp_path / "cal.json"
    assert (
        main(
            [
                "calibrate",
                DEV,
                "--url",
                url,
                "--config",
                "letters",
                "--config",
                "yesno",
                "-o",
                str(target),
                "--out",
                str(tmp_path / "runs"),
                "--no-progress",
                "--id",
                "fake-cal",
            ]
        )
        == 0
    )
    cal = calib.load(target)
    assert cal.id == "fake-cal" and cal.fingerprint == "" and cal.prompt_version
    assert {f.spec.describe() for f in cal.fits} == {"letters", "yesno"}
    assert all(set(f.types) == {"noul", "choice", "score"} for f in cal.fits)


def test_bad_data_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text("{\n")
    assert main(["eval", str(tmp_path / "d.jsonl"), "--url", "http://127.0.0.1:9", "--no-progress"]) == 2
    assert "not JSON" in capsys.readouterr().err
