"""Readouts: how a question becomes branches, and how their label log-probs become answers.

A readout has two jobs: `readings(question)` (the question turns to prefill, each with
the label ids read at its end) and `combine(question, logprobs)` (per reading, the label
log-probs; back comes one probability per option, in the question's own order). Engines
never see a readout: its readings become ordinary branches of the request's trie, so
extra readings share the state's computation like any other branch.

- `letters`: one reading per question, options lettered A, B, C ...; with `rotations`
  R > 1, R cyclic rotations of the options are read (evenly spaced shifts) and the
  per-option probabilities averaged, which cancels the model's preference for early
  letters. A score question is an ordered scale: its second ordering is the reversed
  scale (a rotation would break the scale), so it has at most two.
- `parallel`: a choice question's options are read side by side (core/plan.py, parallel
  layouts): each option line sees the question and itself, all at the same positions, and
  the answer position sees every line. The lines are labelled and laid out in a canonical
  order (by the text the model sees, then the name), never the caller's, so the answer
  does not depend on the order the options came in, at the cost of one reading. noul and
  score questions are read as letters (their order is the API's, not the caller's). Only
  an engine that runs parallel layouts can read it (the service falls back otherwise).
- `canonical`: parallel's sequential twin, for engines that cannot run layouts: a choice
  question's options lettered once, one after another, in the same canonical order. The
  answer does not depend on the caller's order (order flips are zero by construction) at
  one reading's cost; the model's preference for early letters stays, but falls on options
  by their text, not by where the caller put them (a calibration fit may divide it out: a
  position prior). A 2-option choice is read in both of its orders (the reverse is the only
  other one). noul is read as letters R=1; a scale both
  ways (ascending and reversed, as letters R=2), so reversing the caller's scale mirrors its
  answer: the reversed scale's two readings show the same levels at the same letters.
- `mirror`: every question read in one order and its mirror image, the two averaged: a
  choice's canonical order and its reverse, noul true-then-false and false-then-true, a
  scale ascending and descending. Order-free like canonical, and the model's preference for
  a position is cancelled to first order (the first letter of one reading is the last of
  the other) instead of landing on an option by its text. A 2-option choice and a noul
  with the same texts are the same two readings. Two readings per question.
- `yesno` (the second seed's method): noul reads Yes/No directly; every choice option
  and score level is its own reading, judged Yes/No; P(yes) of each candidate (Yes vs No,
  renormalised) is normalised over the question's candidates. The candidates of a
  question share the state and the question in the trie. It is order-free by
  construction: no candidate sees the others' order.

Rotations apply to questions with at most `max_rotated_options` options (26 by default):
each ordering repeats the option list, so a 255-option question read four times would cost
about ten thousand tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from openjev.core import scoring, wording
from openjev.core.types import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion
from openjev.errors import ConfigError

READOUT_NAMES = ("letters", "yesno", "parallel", "canonical", "mirror")
ONE_READING = ("yesno", "parallel", "canonical", "mirror")  # readouts rotations mean nothing to
# Readouts that letter a choice's options in canonical_order, never the caller's: a fit
# corrects no request position for them, and rotations asked alone ask for letters instead.
CANONICAL_ORDER = ("parallel", "canonical", "mirror")
QUESTION_TYPES = ("noul", "choice", "score")


@dataclass(frozen=True)
class ReadoutSpec:
    """Which readout, and for letters how many orderings. Rotations mean nothing to yesno,
    parallel and canonical (normalised to 1 there, so equal specs compare equal).

    `per_type`: other readouts for some question types, as (type, spec) pairs (sorted by
    type, so equal policies compare equal): a model may read choice questions one way and
    noul or score questions another (its calibration file names them, chosen on labelled
    dev data). `name` and `rotations` read the types not named there."""

    name: str = "letters"
    rotations: int = 1
    per_type: tuple[tuple[str, ReadoutSpec], ...] = ()

    def __post_init__(self) -> None:
        if self.name not in READOUT_NAMES:
            raise ConfigError(f"unknown readout {self.name!r}; known: {', '.join(READOUT_NAMES)}")
        if self.rotations < 1:
            raise ConfigError(f"rotations must be at least 1, got {self.rotations}")
        if self.name in ONE_READING and self.rotations != 1:
            object.__setattr__(self, "rotations", 1)
        for qtype, spec in self.per_type:
            if qtype not in QUESTION_TYPES:
                raise ConfigError(f"unknown question type {qtype!r}; known: {', '.join(QUESTION_TYPES)}")
            if spec.per_type:
                raise ConfigError("a per-type readout cannot itself be per type")
        types = [qtype for qtype, _ in self.per_type]
        if len(set(types)) != len(types):
            raise ConfigError("a question type is named twice in a per-type readout")
        # a type read like the rest is not an exception: dropped, so equal policies compare equal
        kept = tuple(sorted((t, s) for t, s in self.per_type if s != self.plain))
        object.__setattr__(self, "per_type", kept)

    @property
    def plain(self) -> ReadoutSpec:
        """The readout of the types `per_type` does not name."""
        return ReadoutSpec(self.name, self.rotations) if self.per_type else self

    def for_type(self, qtype: str) -> ReadoutSpec:
        """The plain readout that reads questions of `qtype`."""
        return dict(self.per_type).get(qtype, self.plain)

    def parts(self) -> list[ReadoutSpec]:
        """Every plain readout this one reads with: the rest's, then each type's."""
        return [self.plain, *(spec for _, spec in self.per_type)]

    def describe(self) -> str:
        """`letters`, `letters;rotations=4`, or per type `letters;choice=yesno;noul=yesno`
        (what `x-openjev-readout` and `/v1/models` say)."""
        head = self.name if self.rotations == 1 else f"{self.name};rotations={self.rotations}"
        for qtype, spec in self.per_type:
            part = spec.name if spec.rotations == 1 else f"{spec.name}:{spec.rotations}"
            head += f";{qtype}={part}"
        return head


@dataclass(frozen=True)
class Reading:
    """One branch of a question: the question turn's content and the labels read after it.

    `parallel`: texts that follow `text` side by side rather than one after another (a
    parallel layout, core/plan.py); the turn ends after them."""

    text: str
    label_ids: tuple[int, ...]
    parallel: tuple[str, ...] = ()


@dataclass(frozen=True)
class Combined:
    """One probability per option in the question's own order (noul: true, false), summing to 1.

    `label_mass`: mean probability the readings put on their valid labels at all.
    `order_agreement`: share of the orderings whose own top option is the combined top
    option; None where one ordering was read.
    `shown`: where one lettered ordering was read (`mirrored`: it and its reverse, averaged),
    the option at each letter (position j showed option shown[j]); a calibration's position
    prior applies by it (symmetrised where mirrored, so a reversed scale's answer still
    mirrors). None otherwise.
    `clones`: groups of options shown with the same text (one probability, kept after calibration).
    """

    probs: tuple[float, ...]
    label_mass: float
    order_agreement: float | None = None
    shown: tuple[int, ...] | None = None
    clones: tuple[tuple[int, ...], ...] = ()
    mirrored: bool = False


class Readout(Protocol):
    """`count(q)` is the number of readings of q, known without building any;
    `reading(q, k)` builds the k-th alone (so a compiler can stop at a budget before
    building the rest); `readings(q)` is all of them."""

    spec: ReadoutSpec

    def count(self, question: Question) -> int: ...

    def reading(self, question: Question, k: int) -> Reading: ...

    def readings(self, question: Question) -> list[Reading]: ...

    def combine(self, question: Question, logprobs: Sequence[Sequence[float]]) -> Combined:
        """Raises ValueError where the log-probs admit no distribution (every label -inf)."""
        ...


def question_type(question: Question) -> str:
    return (
        "noul" if isinstance(question, NoulQuestion) else "choice" if isinstance(question, ChoiceQuestion) else "score"
    )


def n_options(question: Question) -> int:
    if isinstance(question, NoulQuestion):
        return 2
    if isinstance(question, ChoiceQuestion):
        return len(question.options)
    return len(question.levels)


class LettersReadout:
    def __init__(
        self,
        labels: Sequence[str],
        label_ids: Sequence[int],
        *,
        rotations: int = 1,
        temperature: float = 1.0,
        max_rotated_options: int = 26,
        canonical: bool = False,
        mirror: bool = False,
    ) -> None:
        # canonical: a choice's options in canonical_order, read once (the `canonical` readout);
        # mirror: every question in that order and its reverse (the `mirror` readout)
        name = "mirror" if mirror else "canonical" if canonical else "letters"
        self.spec = ReadoutSpec(name, rotations)
        self._canonical = canonical or mirror
        self._mirror = mirror
        self._labels = tuple(labels)
        self._ids = tuple(label_ids)
        self._temperature = temperature
        # Each ordering repeats the whole option list: past this many options the extra
        # readings cost more than the question (255 options x 4 = ~10k tokens), so one.
        self._max_rotated = max_rotated_options

    def orders(self, question: Question) -> list[tuple[int, ...]]:
        """The option orders read: position j of ordering k shows option orders[k][j]."""
        n = n_options(question)
        ascending = tuple(range(n))
        if self._canonical and isinstance(question, ChoiceQuestion):
            first = canonical_order(question)
            # two options: the reverse is the only other order, so canonical reads both (as a scale)
            both = (self._mirror or n == 2) and 1 < n <= self._max_rotated
            return [first, first[::-1]] if both else [first]
        if n > self._max_rotated:
            return [ascending]
        if self._mirror:
            return [ascending, ascending[::-1]] if n > 1 else [ascending]
        if isinstance(question, ScoreQuestion):
            both = self.spec.rotations > 1 or self._canonical
            return [ascending, ascending[::-1]] if both else [ascending]
        r = min(self.spec.rotations, n)
        shifts = [(k * n) // r for k in range(r)]  # evenly spaced, distinct since r <= n
        return [tuple((s + j) % n for j in range(n)) for s in shifts]

    def count(self, question: Question) -> int:
        n = n_options(question)
        if self._mirror:
            return 2 if 1 < n <= self._max_rotated else 1
        if n > self._max_rotated:
            return 1
        if isinstance(question, ScoreQuestion):
            return 2 if self.spec.rotations > 1 or self._canonical else 1
        if self._canonical and isinstance(question, ChoiceQuestion):
            return 2 if n == 2 else 1
        return min(self.spec.rotations, n)

    def reading(self, question: Question, k: int) -> Reading:
        return Reading(
            wording.letters_text(question, self.orders(question)[k], self._labels), self._ids[: n_options(question)]
        )

    def readings(self, question: Question) -> list[Reading]:
        n = n_options(question)
        return [
            Reading(wording.letters_text(question, order, self._labels), self._ids[:n])
            for order in self.orders(question)
        ]

    def combine(self, question: Question, logprobs: Sequence[Sequence[float]]) -> Combined:
        orders = self.orders(question)
        n = n_options(question)
        per_order: list[list[float]] = []
        for order, lp in zip(orders, logprobs, strict=True):
            shown = scoring.softmax(lp, self._temperature)
            probs = [0.0] * n
            for position, option in enumerate(order):
                probs[option] = shown[position]
            per_order.append(probs)
        mean = [math.fsum(p[i] for p in per_order) / len(per_order) for i in range(n)]
        clones: tuple[tuple[int, ...], ...] = ()
        if self._canonical and isinstance(question, ChoiceQuestion):
            clones = _clones(question)
            mean = _shared(mean, clones)
        mass = math.fsum(scoring.label_mass(lp) for lp in logprobs) / len(logprobs)
        top = scoring.argmax(mean)
        agreement = sum(scoring.argmax(p) == top for p in per_order) / len(per_order) if len(per_order) > 1 else None
        mirrored = len(orders) == 2 and orders[1] == orders[0][::-1]
        lettered = orders[0] if len(orders) == 1 or mirrored else None
        return Combined(tuple(mean), mass, agreement, lettered, clones, mirrored)


class YesNoReadout:
    def __init__(self, yes_id: int, no_id: int, *, temperature: float = 1.0) -> None:
        self.spec = ReadoutSpec("yesno")
        self._ids = (yes_id, no_id)
        self._temperature = temperature

    def count(self, question: Question) -> int:
        return 1 if isinstance(question, NoulQuestion) else n_options(question)

    def reading(self, question: Question, k: int) -> Reading:
        if isinstance(question, NoulQuestion):
            return Reading(wording.yesno_noul_text(question), self._ids)
        return Reading(wording.yesno_candidate_text(question, k), self._ids)

    def readings(self, question: Question) -> list[Reading]:
        return [self.reading(question, k) for k in range(self.count(question))]

    def combine(self, question: Question, logprobs: Sequence[Sequence[float]]) -> Combined:
        yes = [scoring.softmax(lp, self._temperature)[0] for lp in logprobs]
        mass = math.fsum(scoring.label_mass(lp) for lp in logprobs) / len(logprobs)
        if isinstance(question, NoulQuestion):
            return Combined((yes[0], 1.0 - yes[0]), mass)
        if len(yes) != n_options(question):
            raise ValueError(f"{len(yes)} candidate readings for {n_options(question)} options")
        total = math.fsum(yes)
        if total <= 0.0:
            raise ValueError("every candidate has P(yes) = 0")
        return Combined(tuple(y / total for y in yes), mass)


def _clones(question: ChoiceQuestion) -> tuple[tuple[int, ...], ...]:
    """Groups of options the model is shown with the same text: the same option to it
    (which of them got the earlier letter was decided by their names alone, so whatever
    separates their probabilities is the position, never the option)."""
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(wording.option_texts(question)):
        groups.setdefault(text, []).append(i)
    return tuple(tuple(m) for m in groups.values() if len(m) > 1)


def _shared(probs: Sequence[float], clones: Sequence[Sequence[int]]) -> list[float]:
    """Each group of clones gets its mean."""
    out = list(probs)
    for members in clones:
        shared = math.fsum(probs[i] for i in members) / len(members)
        for i in members:
            out[i] = shared
    return out


def canonical_order(question: ChoiceQuestion) -> tuple[int, ...]:
    """The options' indices sorted by what the model sees, then by name: the same for any
    order the caller lists them in."""
    texts = wording.option_texts(question)
    return tuple(sorted(range(len(texts)), key=lambda i: (texts[i], question.options[i].name)))


class ParallelReadout:
    def __init__(self, labels: Sequence[str], label_ids: Sequence[int], *, temperature: float = 1.0) -> None:
        self.spec = ReadoutSpec("parallel")
        self._labels = tuple(labels)
        self._ids = tuple(label_ids)
        self._temperature = temperature
        self._letters = LettersReadout(labels, label_ids, temperature=temperature)

    def orders(self, question: Question) -> list[tuple[int, ...]]:
        """The option orders read (as LettersReadout.orders): a choice's one canonical order."""
        if not isinstance(question, ChoiceQuestion) or len(question.options) < 2:
            return self._letters.orders(question)
        return [canonical_order(question)]

    def count(self, question: Question) -> int:
        if not isinstance(question, ChoiceQuestion) or len(question.options) < 2:
            return self._letters.count(question)
        return 1

    def reading(self, question: Question, k: int) -> Reading:
        if not isinstance(question, ChoiceQuestion) or len(question.options) < 2:
            return self._letters.reading(question, k)
        order = canonical_order(question)
        head, lines = wording.letters_parallel_parts(question, order, self._labels)
        return Reading(head, self._ids[: len(order)], tuple(lines))

    def readings(self, question: Question) -> list[Reading]:
        return [self.reading(question, k) for k in range(self.count(question))]

    def combine(self, question: Question, logprobs: Sequence[Sequence[float]]) -> Combined:
        if not isinstance(question, ChoiceQuestion) or len(question.options) < 2:
            return self._letters.combine(question, logprobs)
        (lp,) = logprobs
        shown = scoring.softmax(lp, self._temperature)
        probs = [0.0] * len(shown)
        for position, option in enumerate(canonical_order(question)):
            probs[option] = shown[position]
        return Combined(tuple(probs), scoring.label_mass(lp))


class PerTypeReadout:
    """Reads each question with the readout of its type (ReadoutSpec.per_type); `default`
    reads the types not named. Each part's readings and combination are its own, so a
    question's answer is exactly what that readout alone gives."""

    def __init__(self, spec: ReadoutSpec, default: Readout, by_type: dict[str, Readout]) -> None:
        self.spec = spec
        self._default = default
        self._by_type = by_type

    def part(self, question: Question) -> Readout:
        return self._by_type.get(question_type(question), self._default)

    def count(self, question: Question) -> int:
        return self.part(question).count(question)

    def reading(self, question: Question, k: int) -> Reading:
        return self.part(question).reading(question, k)

    def readings(self, question: Question) -> list[Reading]:
        return self.part(question).readings(question)

    def combine(self, question: Question, logprobs: Sequence[Sequence[float]]) -> Combined:
        return self.part(question).combine(question, logprobs)
