"""The held-out sources (openjev.evals.sources): parsed from archives shaped as the registry's
files are (built here, small), subsampled stratified and seeded, gold mapped per type."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from openjev.evals import sources
from openjev.evals.dataset import DataError
from openjev.evals.readings import expected_index


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _fake_sdist(tmp_path: Path, rows: str) -> Path:
    inner = _tar_bytes(
        {
            "hutto_ICWSM_2014/tweets_GroundTruth.txt": rows.encode(),
            "hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt": b"1\t0.0\treserved\r\n",
        }
    )
    path = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    path.write_bytes(_tar_bytes({"vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz": inner}))
    return path


def test_sentiment_levels_split_the_rating_scale_at_their_edges() -> None:
    assert [sources.sentiment_level(m) for m in (-4, -2.01, -2, -0.6, -0.5, 0, 0.49, 0.5, 1.99, 2, 4)] == [
        0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4,
    ]  # fmt: skip


def test_vader_rows_are_read_from_the_inner_archive_of_the_sdist(tmp_path: Path) -> None:
    sdist = _fake_sdist(tmp_path, "1\t2.7\tSo lucky.\r\n2\t-0.2\tmeh\r\n3\t1.0\t\r\n")
    assert sources.vader_rows(sdist, "tweets_GroundTruth.txt") == [("1", 2.7, "So lucky."), ("2", -0.2, "meh")]


def test_a_vader_item_asks_noul_and_choice_only_where_the_rating_is_clear_cut() -> None:
    clear = sources.vader_item("t-1", "Great!", 2.5, "vader-tweets")
    assert clear.expected == {"sentiment": 4, "positive": True, "tone": "positive"}
    neutral = sources.vader_item("t-2", "It is a phone.", 0.2, "vader-tweets")
    assert neutral.expected == {"sentiment": 2, "tone": "neutral"}
    unclear = sources.vader_item("t-3", "Hmm, okay.", -0.7, "vader-tweets")
    assert unclear.expected == {"sentiment": 1}
    assert set(unclear.request["questions"]) == {"sentiment"}
    assert expected_index(clear, "positive") == 0 and expected_index(clear, "tone") == 2


def test_typed_cases_are_checked_against_their_pinned_hash(tmp_path: Path, monkeypatch) -> None:
    case = {
        "id": "customer_service_000001",
        "workflow": "customer_service",
        "state": {"thread": [{"role": "customer", "text": "Where is my parcel?"}]},
        "questions": {
            "late": {"type": "noul", "instructions": "The parcel is late."},
            "tier": {"type": "score", "instructions": "How urgent?", "criteria": ["Low", "High"]},
        },
        "gold": {
            "late": {"type": "noul", "label": "true", "probabilities": {"true": 0.8, "false": 0.2}},
            "tier": {"type": "score", "label": "1", "probabilities": {"0": 0.3, "1": 0.7}},
        },
    }
    raw = (json.dumps(case) + "\n").encode()
    wheel = tmp_path / "tool_eval_bench-3.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(sources._TYPED, gzip.compress(raw))
    with pytest.raises(DataError, match="pinned SHA-256"):
        sources.typed_cases(wheel)
    monkeypatch.setattr(sources, "_TYPED_SHA256", hashlib.sha256(raw).hexdigest())
    (got,) = sources.typed_cases(wheel)
    item = sources.typed_item(got)
    assert item.expected == {"late": True, "tier": 1}
    assert item.soft == {"late": {"true": 0.8, "false": 0.2}, "tier": {"0": 0.3, "1": 0.7}}
    assert item.domain == "customer_service"


def test_stratified_draws_the_same_rows_for_the_same_seed() -> None:
    rows = [(i, i % 3) for i in range(60)]
    first = sources.stratified(rows, lambda r: r[1], 5, seed=7)
    assert first == sources.stratified(rows, lambda r: r[1], 5, seed=7)
    assert first != sources.stratified(rows, lambda r: r[1], 5, seed=8)
    assert sorted(r[1] for r in first) == [0] * 5 + [1] * 5 + [2] * 5
    assert first == sorted(first)  # in the rows' own order


def test_a_file_already_in_the_cache_with_the_pinned_hash_is_used_without_pip(tmp_path: Path, monkeypatch) -> None:
    data = b"package bytes"
    package = sources.Package("x==1", "x-1.tar.gz", hashlib.sha256(data).hexdigest(), binary=False)
    (tmp_path / "sources").mkdir()
    (tmp_path / "sources" / "x-1.tar.gz").write_bytes(data)
    monkeypatch.setattr(sources.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert sources.fetch(package, tmp_path) == tmp_path / "sources" / "x-1.tar.gz"


def test_an_unknown_source_name_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown source"):
        sources.load_source("nyt-editorials", tmp_path)
