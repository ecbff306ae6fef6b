"""The invariance relations of jevbench-mini (PyPI `jevbench`), measured beside accuracy and
calibration by `openjev eval --invariance`.

jevbench needs no labels: it edits the questions of its own frozen cases (never the state)
and checks that the answers keep relations every decision model should keep. The four
run here bear on how a readout reads a question:

- `option_permutation`: choice options reordered, score levels reversed -> each option's
  probability unchanged (tolerance 0.05 in total variation);
- `noul_as_choice`: a noul and the same question as a yes/no choice -> the same P(yes);
- `clone_symmetry`: two options with the same description -> equal probabilities (this server
  refuses such a choice with a 422 on every route, so its trials count as errors, not tests);
- `batch_order`: the batch's questions in reverse order -> the same answers.

Each is the share of its tests (24 on jevbench-mini) that hold. Requests go to the server
under test with the eval's own readout and calibration headers, so the relations are those
of the configuration the accuracy figures are for.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx

RELATIONS = ("option_permutation", "noul_as_choice", "clone_symmetry", "batch_order")
SUITE = "jevbench-mini"
RETRIED = (429, 503, 529)


class MissingJevbench(RuntimeError):
    """jevbench is not installed."""


def _jevbench() -> Any:
    try:
        import jevbench
    except ImportError:
        raise MissingJevbench(
            "--invariance needs jevbench (pip install 'openjev[eval]', or pip install jevbench)"
        ) from None
    return jevbench


def asker(url: str, headers: Mapping[str, str], *, model: str = "jev-latest", timeout_s: float = 600.0):
    """`fn(state, questions) -> answers` for jevbench: one POST /v1/systemone per call, with
    `headers`; 429/503/529 retried after Retry-After, other errors raised (jevbench records a
    4xx as a refused request)."""
    jb = _jevbench()
    client = httpx.Client(timeout=timeout_s)

    def ask(state: Any, questions: dict[str, Any]) -> dict[str, Any]:
        body = {"model": model, "state": state, "questions": questions}
        for attempt in range(8):
            r = client.post(url + "/v1/systemone", json=body, headers=dict(headers))
            if r.status_code in RETRIED:
                time.sleep(jb.backends.retry_after(r.headers.get("retry-after"), attempt))
                continue
            if 400 <= r.status_code < 500:
                raise jb.backends.Refused(f"{r.status_code}: {r.text[:300]}")
            r.raise_for_status()
            answers: dict[str, Any] = r.json()["answers"]
            return answers
        raise RuntimeError(f"the server kept answering {r.status_code}")

    return ask


def measure(
    url: str, headers: Mapping[str, str], *, relations: tuple[str, ...] = RELATIONS, concurrency: int = 1
) -> dict[str, Any]:
    """{"suite", "relations": {name: share of tests that hold}, "tests", "errors"} for the
    server at `url` read with `headers`. Nothing is cached between runs."""
    jb = _jevbench()
    model = jb.from_callable(asker(url, headers), name="openjev-eval", concurrent=concurrency > 1)
    report = jb.evaluate(model, suite=SUITE, relations=list(relations), cache=None, concurrency=concurrency)
    trials: dict[str, set[str]] = {}
    for outcome in report.result.get("outcomes", []):
        trials.setdefault(outcome.get("relation"), set()).add(outcome.get("trial_id"))
    return {
        "suite": SUITE,
        "jevbench": getattr(jb, "__version__", "?"),
        "relations": {name: report.relations.get(name) for name in relations},
        "tests": {name: len(trials.get(name, ())) for name in relations},
        "errors": len(report.errors),
    }
