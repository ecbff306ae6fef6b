"""Rows derived from recorded readings (evals/readings.py) behave like the readouts they
stand for: checked with two synthetic models whose answers are known, one that judges the
options and one that only ever picks a position."""

import math

import pytest

from openjev.core.readouts import LettersReadout, ParallelReadout, canonical_order
from openjev.evals import readings
from openjev.evals.dataset import Item

LABELS = ("A", "B", "C", "D", "E")
IDS = (1, 2, 3, 4, 5)
ITEM = Item(
    "t-1",
    {
        "model": "m",
        "state": "a ticket",
        "questions": {
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "money", "tech": "bugs", "shipping": "parcels", "account": "logins"},
            },
            "refund": {"type": "noul", "instructions": "Refund?"},
        },
    },
    {"team": "shipping", "refund": True},
)


def _record(model, rotations: int, readout=None) -> dict:
    """What `record` writes for ITEM under letters with `rotations` (or under `readout`), from
    `model(order) -> label log-probs` (order: the option index shown at each position)."""
    readout = readout or LettersReadout(LABELS, IDS, rotations=rotations)
    request = readings.core_request(ITEM)
    questions = []
    for qid, question in request.questions:
        orders = readout.orders(question)
        questions.append(
            {
                "qid": qid,
                "type": "choice" if qid == "team" else "noul",
                "orders": [list(o) for o in orders],
                "logprobs": [model(o) for o in orders],
            }
        )
    return {"id": ITEM.id, "readout": readout.spec.name, "rotations": readout.spec.rotations, "questions": questions}


def knows(order):  # prefers option 2 (shipping; noul: "true" is option 0) wherever it is shown
    best = 2 if len(order) == 4 else 0
    return [math.log(0.7) if o == best else math.log(0.1) for o in order]


def position(order):  # the first letter, whatever it shows; a faint preference for option 2 beneath
    first = [0.7] + [0.3 / (len(order) - 1)] * (len(order) - 1)
    return [math.log(p * (1.2 if o == 2 else 1.0)) for p, o in zip(first, order, strict=True)]


def _scored(model, recorded_rotations: int, rotations: int):
    recs = readings.recorded([_record(model, recorded_rotations)])
    return readings.scored_rows([ITEM], recs, LettersReadout(LABELS, IDS, rotations=rotations))


def test_a_model_that_judges_options_is_right_and_never_flips():
    for r in (1, 2, 4):
        rows = _scored(knows, 8, r)
        choice = next(s for s, _ in rows if s.qtype == "choice")
        assert choice.top == choice.correct == 2 and choice.flipped is False
        assert choice.probs[2] == pytest.approx(0.7)


def test_a_position_picker_flips_at_r1_and_every_rotation_uncovers_what_is_beneath():
    one = next(s for s, _ in _scored(position, 8, 1) if s.qtype == "choice")
    assert one.top == 0 and one.flipped is True  # it answered with a position
    four, combined = next((s, c) for s, c in _scored(position, 8, 4) if s.qtype == "choice")
    assert four.top == 2 and four.flipped is False and max(four.probs) < 0.3  # nearly flat, order-free
    assert combined.order_agreement == pytest.approx(0.25)  # each ordering picked its own first letter


def test_derived_rows_equal_the_readouts_own_combine():
    readout = LettersReadout(LABELS, IDS, rotations=2)
    rec = readings.recorded([_record(position, 8)])[(ITEM.id, "team")]
    question = dict(readings.core_request(ITEM).questions)["team"]
    direct = readout.combine(question, [position(o) for o in readout.orders(question)])
    assert readings.combine_letters(readout, question, rec) == direct


def test_rows_that_need_unrecorded_orderings_say_so():
    with pytest.raises(readings.MissingReading):
        _scored(knows, 1, 4)
    rows = _scored(knows, 1, 1)  # R=1 alone: answers, but no order-flip twin to compare
    assert [s.flipped for s, _ in rows if s.qtype == "choice"] == [None]


def test_parallel_readings_map_the_canonical_letters_back_to_the_options_and_never_flip():
    """A parallel reading's letters follow the canonical order (by the text the model sees):
    the recorded order says which option each letter showed, and combining maps them back."""
    readout = ParallelReadout(LABELS, IDS)
    request = readings.core_request(ITEM)
    team = dict(request.questions)["team"]
    assert readout.orders(team) == [canonical_order(team)] != [(0, 1, 2, 3)]  # not the caller's order
    recs = readings.recorded([_record(knows, 1, readout)])
    rows = readings.scored_rows([ITEM], recs, readout)
    choice = next(s for s, _ in rows if s.qtype == "choice")
    assert choice.top == choice.correct == 2 and choice.flipped is False
    assert choice.probs[2] == pytest.approx(0.7)
    letters = readings.recorded([_record(knows, 1)])  # letters' records are not parallel's: refused
    with pytest.raises(readings.MissingReading):
        readings.scored_rows([ITEM], letters, readout)
