"""Labelled data for `openjev eval` / `openjev calibrate`: JSON Lines, one item per line.

    {"id": "ticket-001",
     "request": {<a /v1/systemone body: model, state, questions>},
     "expected": {<question id>: <answer>},
     "domain": "tickets"}          (optional: what kind of text the state is)

The expected answer is `true`/`false` for noul, the option name for choice, the 0-based
level index for score. Questions without an expected answer are sent but not scored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A data file that does not follow the format (with file and line)."""


@dataclass(frozen=True)
class Item:
    id: str
    request: dict[str, Any]
    expected: dict[str, Any]
    domain: str = ""  # the kind of text, where the data names it (evals/transfer_table.py groups by it)
    soft: dict[str, dict[str, float]] | None = None  # a soft gold per question, where a source has one


def _check_expected(where: str, qid: str, question: dict, answer: Any) -> None:
    qtype = question.get("type")
    if qtype == "noul":
        ok = isinstance(answer, bool)
    elif qtype == "choice":
        ok = isinstance(answer, str) and answer in (question.get("criteria") or {})
    elif qtype == "score":
        levels = question.get("criteria") or []
        ok = isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(levels)
    else:
        raise DataError(f"{where}: question {qid!r} has unknown type {qtype!r}")
    if not ok:
        raise DataError(f"{where}: expected answer {answer!r} does not fit {qtype} question {qid!r}")


def load_items(*paths: str | Path) -> list[Item]:
    """Every item of the files, in order; raises DataError on malformed lines or duplicate ids."""
    items: list[Item] = []
    seen: set[str] = set()
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not JSON: {e}") from None
            if not isinstance(raw, dict) or not {"id", "request", "expected"} <= set(raw):
                raise DataError(f"{where}: an item needs id, request and expected")
            item = Item(str(raw["id"]), raw["request"], raw["expected"], str(raw.get("domain") or ""))
            questions = item.request.get("questions")
            if not isinstance(questions, dict) or not questions:
                raise DataError(f"{where}: request.questions must be a non-empty object")
            for qid, answer in item.expected.items():
                if qid not in questions:
                    raise DataError(f"{where}: expected answer for unknown question {qid!r}")
                _check_expected(where, qid, questions[qid], answer)
            if item.id in seen:
                raise DataError(f"{where}: duplicate id {item.id!r}")
            seen.add(item.id)
            items.append(item)
    return items


def rotated_choices(item: Item, shift: int = 1) -> dict[str, Any] | None:
    """The item's request with only its choice questions, each with its options rotated
    left by `shift` (what the order-flip rate compares against); None without choices."""
    questions = {}
    for qid, q in item.request["questions"].items():
        if q.get("type") == "choice":
            names = list(q["criteria"])
            k = shift % len(names)
            questions[qid] = {**q, "criteria": {n: q["criteria"][n] for n in names[k:] + names[:k]}}
    if not questions:
        return None
    return {**item.request, "questions": questions}
