"""What every readout shares: the names a readout may have (`READOUT_NAMES`, the one list:
the settings check `--readout` against it), the spec that picks one (`ReadoutSpec`), the
port every family implements (`Readout`: `count`, `reading`, `readings`, `combine`), and
what crosses it (`Reading`; `Combined` is in core/types.py, since results carry it). The
families are the package's other modules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from openjev.core.types import ChoiceQuestion, Combined, NoulQuestion, Question
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


@dataclass(frozen=True)
class ReadoutContext:
    """What a family is built from for one served model: the answer labels and their token
    ids, Yes/No's ids (None where they are not single tokens after the answer cue), the
    softmax temperature, and the most options a question may have to be read rotated."""

    labels: tuple[str, ...]
    label_ids: tuple[int, ...]
    yes_no: tuple[int, int] | None
    temperature: float
    max_rotated_options: int
