"""The parallel readout.

`parallel`: a choice question's options are read side by side (core/plan.py, parallel
layouts): each option line sees the question and itself, all at the same positions, and
the answer position sees every line. The lines are labelled and laid out in a canonical
order (by the text the model sees, then the name), never the caller's, so the answer
does not depend on the order the options came in, at the cost of one reading. noul and
score questions are read as letters (their order is the API's, not the caller's). Only
an engine that runs parallel layouts can read it (the service falls back otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

from openjev.core import scoring, wording
from openjev.core.readouts.letters import LettersReadout
from openjev.core.readouts.order import canonical_order
from openjev.core.readouts.spec import Reading, ReadoutContext, ReadoutSpec
from openjev.core.types import ChoiceQuestion, Combined, Question


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


def build(spec: ReadoutSpec, context: ReadoutContext) -> ParallelReadout:  # noqa: ARG001 - the builders' one signature
    return ParallelReadout(context.labels, context.label_ids, temperature=context.temperature)
