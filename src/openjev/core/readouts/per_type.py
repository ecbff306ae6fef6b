"""A readout per question type: each question read by the readout its type names
(`ReadoutSpec.per_type`), the rest by the default."""

from __future__ import annotations

from collections.abc import Sequence

from openjev.core.readouts.spec import Reading, Readout, ReadoutSpec, question_type
from openjev.core.types import Combined, Question


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
