"""Held-out labelled sources that are not ours, read from registry packages at eval time.

`openjev eval vader-tweets` (or any name in `SOURCES`) builds its items from a package the
registry serves, fetched hash-pinned into the cache (`<cache>/sources/`) and never
committed: the third-party texts are for evaluation only.

- `vader-tweets`, `vader-amazon`, `vader-movies`: the vaderSentiment 3.3.2 **sdist**
  (MIT; `additional_resources/hutto_ICWSM_2014.tar.gz`), the mean of about 20 human ratings
  on -4..+4 for each text. Each item asks three questions of one text: `sentiment`, a score
  on five levels from the mean rating; `positive`, a noul asked only where the rating is
  clear-cut (|mean| >= 1); `tone`, a choice of negative / neutral / positive asked only where
  the class is clear (|mean| >= 1, or |mean| <= 0.3 for neutral). The fourth file (New York
  Times editorial snippets) is never opened: it is reserved.
- `typed-decisions`: tool-eval-bench 3.0.0's vendored Typed Decisions test split
  (Apache-2.0; 400 cases, 5 questions each) whose gold is a ~4B teacher model's answer
  distribution: its label is the teacher's most likely answer, so accuracy here is
  agreement with that model and calibration is against its opinion, not a human's.

Every source is subsampled stratified by its gold level (vader) or workflow (typed
decisions) with a fixed seed, so a run is the same items on every machine.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import subprocess
import sys
import tarfile
import zipfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjev.evals.dataset import DataError, Item


@dataclass(frozen=True)
class Package:
    """One registry file, pinned by its SHA-256 (`requirement` as pip takes it)."""

    requirement: str
    filename: str
    sha256: str
    binary: bool  # a wheel (True) or the sdist (False)


VADER = Package(
    "vaderSentiment==3.3.2",
    "vaderSentiment-3.3.2.tar.gz",
    "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
    binary=False,
)
TOOL_EVAL_BENCH = Package(
    "tool-eval-bench==3.0.0",
    "tool_eval_bench-3.0.0-py3-none-any.whl",
    "bdae8901c3ff11a69ffe8e804819f63a0804a98e2bd90f838697793fca3f1f50",
    binary=True,
)
_TYPED = "tool_eval_bench/plugins/decision/vendor/typed_decisions/test.jsonl.gz"
_TYPED_SHA256 = "78a228c8be4244389a9977f8bafa8068cadac20ba8879c94116c963e0902831f"

SENTIMENT_LEVELS = ["Very negative", "Negative", "Neutral", "Positive", "Very positive"]
_LEVEL_EDGES = (-2.0, -0.5, 0.5, 2.0)  # mean rating on -4..+4 -> level 0..4
TONE = {
    "negative": "The writer expresses a negative opinion or feeling.",
    "neutral": "The writer expresses neither a clearly positive nor a clearly negative opinion.",
    "positive": "The writer expresses a positive opinion or feeling.",
}


def fetch(package: Package, cache_dir: str | Path) -> Path:
    """The package file in `<cache>/sources/`, downloaded with pip (hash required) when absent
    or not matching; DataError when pip fails or the hash differs."""
    folder = Path(cache_dir).expanduser() / "sources"
    path = folder / package.filename
    if path.is_file() and _sha256(path.read_bytes()) == package.sha256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    req = folder / f"{package.filename}.req"
    req.write_text(f"{package.requirement} --hash=sha256:{package.sha256}\n")
    kind = ["--only-binary", ":all:"] if package.binary else ["--no-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes", *kind]
    done = subprocess.run([*cmd, "-r", str(req), "-d", str(folder)], check=False)
    if done.returncode != 0 or not path.is_file():
        raise DataError(
            f"could not download {package.requirement} from the package registry (pip exit {done.returncode})"
        )
    if _sha256(path.read_bytes()) != package.sha256:
        raise DataError(f"{path}: SHA-256 differs from the pinned {package.sha256}")
    return path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sentiment_level(mean: float) -> int:
    """The five-level score of a mean rating on -4..+4."""
    return sum(mean >= edge for edge in _LEVEL_EDGES)


def vader_item(item_id: str, text: str, mean: float, domain: str) -> Item:
    """One text's item: the sentiment score always, `positive` and `tone` where clear-cut."""
    questions: dict[str, Any] = {
        "sentiment": {
            "type": "score",
            "instructions": "How positive or negative is the writer's overall sentiment in this text?",
            "criteria": SENTIMENT_LEVELS,
        }
    }
    expected: dict[str, Any] = {"sentiment": sentiment_level(mean)}
    if abs(mean) >= 1.0:
        questions["positive"] = {"type": "noul", "instructions": "Is the writer's sentiment in this text positive?"}
        expected["positive"] = mean > 0
    if abs(mean) >= 1.0 or abs(mean) <= 0.3:
        questions["tone"] = {
            "type": "choice",
            "instructions": "What is the overall tone of this text?",
            "criteria": TONE,
        }
        expected["tone"] = "neutral" if abs(mean) <= 0.3 else ("positive" if mean > 0 else "negative")
    return Item(item_id, {"model": "jev-latest", "state": text, "questions": questions}, expected, domain)


_VADER_FILES = {
    "vader-tweets": "tweets_GroundTruth.txt",
    "vader-amazon": "amazonReviewSnippets_GroundTruth.txt",
    "vader-movies": "movieReviewSnippets_GroundTruth.txt",
}


def vader_rows(sdist: Path, member: str) -> list[tuple[str, float, str]]:
    """(id, mean rating, text) of one ground-truth file inside the sdist's inner archive."""
    with tarfile.open(sdist) as outer:
        inner_name = next(n for n in outer.getnames() if n.endswith("additional_resources/hutto_ICWSM_2014.tar.gz"))
        inner_file = outer.extractfile(inner_name)
        if inner_file is None:
            raise DataError(f"{sdist}: {inner_name} is not a file")
        with tarfile.open(fileobj=io.BytesIO(inner_file.read())) as inner:
            handle = inner.extractfile(f"hutto_ICWSM_2014/{member}")
            if handle is None:
                raise DataError(f"{sdist}: {member} is missing")
            text = handle.read().decode("utf-8", errors="replace")
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("\t")
        if len(parts) >= 3 and parts[2].strip():
            rows.append((parts[0], float(parts[1]), parts[2].strip()))
    return rows


def _vader(name: str) -> Callable[[Path, int, int], list[Item]]:
    def load(cache_dir: Path, per_stratum: int, seed: int) -> list[Item]:
        rows = vader_rows(fetch(VADER, cache_dir), _VADER_FILES[name])
        picked = stratified(rows, lambda r: sentiment_level(r[1]), per_stratum, seed)
        return [vader_item(f"{name}-{rid}", text, mean, name) for rid, mean, text in picked]

    return load


def typed_cases(wheel: Path) -> list[dict[str, Any]]:
    """The 400 test cases from the wheel's vendored file, checked against its pinned hash."""
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(_TYPED)
    if _sha256(gzip.decompress(data)) != _TYPED_SHA256:
        raise DataError(f"{wheel}: {_TYPED} differs from its pinned SHA-256")
    return [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line.strip()]


def typed_item(case: dict[str, Any]) -> Item:
    """One case as an item: the teacher's most likely answer as gold, its distribution in `soft`."""
    expected: dict[str, Any] = {}
    soft: dict[str, dict[str, float]] = {}
    for qid, gold in case["gold"].items():
        label = gold["label"]
        kind = gold["type"]
        expected[qid] = label == "true" if kind == "noul" else int(label) if kind == "score" else label
        soft[qid] = {str(k): float(v) for k, v in gold["probabilities"].items()}
    request = {"model": "jev-latest", "state": case["state"], "questions": case["questions"]}
    return Item(f"typed-{case['id']}", request, expected, str(case["workflow"]), soft=soft)


def _typed(cache_dir: Path, per_stratum: int, seed: int) -> list[Item]:
    cases = typed_cases(fetch(TOOL_EVAL_BENCH, cache_dir))
    return [typed_item(c) for c in stratified(cases, lambda c: c["workflow"], per_stratum, seed)]


def stratified(rows: list, key: Callable[[Any], Any], per_stratum: int, seed: int) -> list:
    """Up to `per_stratum` rows of each stratum, drawn with `seed`, in the rows' own order."""
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[key(row)].append(i)
    rng = random.Random(seed)
    keep: set[int] = set()
    for stratum in sorted(groups, key=str):
        members = groups[stratum]
        keep.update(rng.sample(members, min(per_stratum, len(members))))
    return [rows[i] for i in sorted(keep)]


@dataclass(frozen=True)
class Source:
    name: str
    load: Callable[[Path, int, int], list[Item]]
    per_stratum: int  # the default subsample: items per gold level or workflow
    about: str


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("vader-tweets", _vader("vader-tweets"), 8, "tweets rated by ~20 people (vaderSentiment sdist)"),
        Source("vader-amazon", _vader("vader-amazon"), 8, "Amazon review snippets (vaderSentiment sdist)"),
        Source("vader-movies", _vader("vader-movies"), 8, "movie-review sentences (vaderSentiment sdist)"),
        Source("typed-decisions", _typed, 5, "tool-eval-bench 3.0.0 Typed Decisions test, soft gold of a ~4B model"),
    )
}


def load_source(name: str, cache_dir: str | Path, *, per_stratum: int | None = None, seed: int = 0) -> list[Item]:
    """The subsampled items of a named source."""
    source = SOURCES.get(name)
    if source is None:
        raise DataError(f"unknown source {name!r} (known: {', '.join(SOURCES)})")
    return source.load(Path(cache_dir).expanduser(), per_stratum or source.per_stratum, seed)
