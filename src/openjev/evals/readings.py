"""Per-reading label log-probabilities, recorded once and combined offline into any readout
configuration whose readings were recorded (the quality table of a model too slow to read
each configuration separately).

`record` serves a model in this process (no HTTP: the same engine, compiler and readouts
as the server), reads each labelled item once under a wide readout (letters with many
rotations reads every cyclic shift of a choice's options and both orders of a scale; yesno
every candidate), and appends per question the orders read and each reading's label
log-probs to a JSON Lines file, resumably (one line per item, items already there are
skipped). `combine` then answers "what would letters R=1, 2, 4 (or their order-flip
twins) have said?" from the recorded readings with the core readout's own `orders` and
`combine`, so a derived row is exactly what a server at that configuration computes from
the same log-probs.

`tokens` compiles (without the model) each item under a configuration and counts the
tokens a cold request computes there (the plan's distinct tokens).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openjev.core.ports import Engine
from openjev.core.readouts import Combined, LettersReadout, ParallelReadout, ReadoutSpec, YesNoReadout, question_type
from openjev.core.service import DecisionService
from openjev.core.types import ChoiceQuestion, DecisionRequest, Option, Question
from openjev.evals.dataset import Item
from openjev.evals.metrics import Scored


def core_request(item: Item) -> DecisionRequest:
    """The item's request as the server's core sees it (the wire schema's own converter)."""
    from openjev.api.contract.jev import convert, schemas

    return convert.request_of(schemas.SystemOneRequest.model_validate(item.request))


@dataclass(frozen=True)
class Recorded:
    """One question's recorded readings: `orders[k]` (letters: the option shown at each
    position; yesno: None) and `logprobs[k]` (the reading's label log-probs)."""

    item: str
    qid: str
    qtype: str
    orders: tuple[tuple[int, ...] | None, ...]
    logprobs: tuple[tuple[float, ...], ...]


async def _record_item(service: DecisionService, engine: Engine, item: Item, spec: ReadoutSpec) -> dict[str, Any]:
    request = core_request(item)
    readout = service.readout(spec)
    compiled = service.prepare_now(request, readout)
    t0 = time.perf_counter()
    result = await engine.run(compiled.plan)  # the service's engine, asked directly: the raw log-probs
    seconds = time.perf_counter() - t0
    questions = []
    for (qid, question), (start, count) in zip(request.questions, compiled.spans, strict=True):
        orders: list[list[int] | None] = (
            [list(o) for o in readout.orders(question)]
            if isinstance(readout, (LettersReadout, ParallelReadout))
            else [None] * count
        )
        lps = [list(r.logprobs) for r in result.branches[start : start + count]]
        questions.append({"qid": qid, "type": question_type(question), "orders": orders, "logprobs": lps})
    return {
        "id": item.id,
        "readout": spec.name,
        "rotations": spec.rotations,
        "questions": questions,
        "computed_tokens": result.computed_tokens,
        "distinct_tokens": compiled.plan.unique_tokens,
        "seconds": round(seconds, 3),
    }


def record(
    service: DecisionService, engine: Engine, items: Sequence[Item], spec: ReadoutSpec, out: Path, *, log=print
) -> list[dict[str, Any]]:
    """Record every item not yet in `out` (JSON Lines, appended item by item); all records.
    `engine`: the one `service` runs on."""
    done = {rec["id"]: rec for rec in load(out) if rec["readout"] == spec.name and rec["rotations"] == spec.rotations}
    todo = [item for item in items if item.id not in done]
    out.parent.mkdir(parents=True, exist_ok=True)
    t_start, tokens = time.perf_counter(), 0
    for n, item in enumerate(todo, 1):
        rec = asyncio.run(_record_item(service, engine, item, spec))
        with open(out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        done[item.id] = rec
        tokens += rec["computed_tokens"] or 0
        elapsed = time.perf_counter() - t_start
        log(
            f"{out.name}: {len(items) - len(todo) + n}/{len(items)} {item.id}: {rec['computed_tokens']} tokens "
            f"in {rec['seconds']:.1f} s ({tokens / elapsed:.1f} tokens/s so far)"
        )
    return [done[item.id] for item in items if item.id in done]


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by an interruption
    return out


def recorded(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Recorded]:
    out = {}
    for rec in records:
        for q in rec["questions"]:
            out[(rec["id"], q["qid"])] = Recorded(
                rec["id"],
                q["qid"],
                q["type"],
                tuple(None if o is None else tuple(o) for o in q["orders"]),
                tuple(tuple(lp) for lp in q["logprobs"]),
            )
    return out


def rotated_left(question: Question, shift: int = 1) -> Question:
    """A choice question with its options rotated left by `shift` (dataset.rotated_choices)."""
    if not isinstance(question, ChoiceQuestion):
        raise ValueError("only choice questions are rotated")
    k = shift % len(question.options)
    options: tuple[Option, ...] = question.options[k:] + question.options[:k]
    return ChoiceQuestion(instructions=question.instructions, options=options)


class MissingReading(LookupError):
    """A derived configuration needs an ordering that was not recorded."""


def combine_letters(readout: LettersReadout, question: Question, rec: Recorded, *, shift: int = 0) -> Combined:
    """What `readout` answers for `question` with its options rotated left by `shift`, from
    the recorded readings of the unrotated question; probabilities in the ROTATED question's
    order. Raises MissingReading where an ordering it reads was not recorded."""
    asked = rotated_left(question, shift) if shift else question
    n = len(rec.orders[0] or ())
    by_order = dict(zip(rec.orders, rec.logprobs, strict=True))
    lps = []
    for order in readout.orders(asked):
        original = tuple((o + shift) % n for o in order)  # rotated option o is original option o + shift
        if original not in by_order:
            raise MissingReading(f"{rec.item}/{rec.qid}: ordering {original} not recorded")
        lps.append(by_order[original])
    return readout.combine(asked, lps)


def combine_yesno(readout: YesNoReadout, question: Question, rec: Recorded) -> Combined:
    return readout.combine(question, list(rec.logprobs))


def combine_parallel(readout: ParallelReadout, question: Question, rec: Recorded) -> Combined:
    """What `readout` answers from the recorded parallel readings (its orders must match:
    a choice's canonical order, letters R=1 for the other types)."""
    if tuple(readout.orders(question)) != rec.orders:
        raise MissingReading(f"{rec.item}/{rec.qid}: recorded orders {rec.orders} are not the parallel readout's")
    return readout.combine(question, list(rec.logprobs))


def expected_index(item: Item, qid: str) -> int:
    q, expected = item.request["questions"][qid], item.expected[qid]
    if q["type"] == "noul":
        return 0 if expected else 1
    if q["type"] == "choice":
        return list(q["criteria"]).index(expected)
    return int(expected)


def scored_rows(
    items: Sequence[Item],
    recs: dict[tuple[str, str], Recorded],
    readout: LettersReadout | YesNoReadout | ParallelReadout,
) -> list[tuple[Scored, Combined]]:
    """(Scored, Combined) per recorded question of `items` under `readout`: choice questions
    under letters carry their order flip (top option moved when the options are rotated by
    one; None where the rotated orderings were not recorded); under parallel and yesno,
    whose plan does not depend on the option order, False. Questions whose item was not
    recorded are left out; MissingReading where `readout` itself needs an unrecorded ordering."""
    out = []
    for item in items:
        request = core_request(item)
        for qid, question in request.questions:
            rec = recs.get((item.id, qid))
            if rec is None:
                continue
            flipped = None
            if isinstance(readout, LettersReadout):
                combined = combine_letters(readout, question, rec)
                if isinstance(question, ChoiceQuestion):
                    n = len(question.options)
                    try:
                        twin = combine_letters(readout, question, rec, shift=1)
                    except MissingReading:
                        twin = None
                    if twin is not None:
                        top = max(range(n), key=combined.probs.__getitem__)
                        top_twin = max(range(n), key=twin.probs.__getitem__)
                        flipped = (top_twin + 1) % n != top  # twin index j is original option j + 1
            elif isinstance(readout, ParallelReadout):
                combined = combine_parallel(readout, question, rec)
                # the same plan, token for token, for any option order: it cannot flip
                flipped = False if isinstance(question, ChoiceQuestion) else None
            else:
                combined = combine_yesno(readout, question, rec)
                # each option is judged alone (it never sees the others): it cannot flip
                flipped = False if isinstance(question, ChoiceQuestion) else None
            out.append((Scored(rec.qtype, combined.probs, expected_index(item, qid), flipped), combined))
    return out


def tokens(service: DecisionService, items: Sequence[Item], spec: ReadoutSpec) -> float:
    """Mean tokens a cold request computes under `spec` (its plan's distinct tokens)."""
    readout = service.readout(spec)
    counts = [service.prepare_now(core_request(item), readout).plan.unique_tokens for item in items]
    return sum(counts) / len(counts)
