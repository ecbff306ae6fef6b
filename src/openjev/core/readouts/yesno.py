"""The yesno readout.

`yesno` (the second seed's method): noul reads Yes/No directly; every choice option
and score level is its own reading, judged Yes/No; P(yes) of each candidate (Yes vs No,
renormalised) is normalised over the question's candidates. The candidates of a
question share the state and the question in the trie. It is order-free by
construction: no candidate sees the others' order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from openjev.core import scoring, wording
from openjev.core.readouts.spec import Reading, ReadoutContext, ReadoutSpec, n_options
from openjev.core.types import Combined, NoulQuestion, Question
from openjev.errors import Unsupported


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


def build(spec: ReadoutSpec, context: ReadoutContext) -> YesNoReadout:  # noqa: ARG001 - the builders' one signature
    """Unsupported where Yes/No are not single tokens after this model's answer cue."""
    if context.yes_no is None:
        raise Unsupported(
            "the yesno readout is unavailable for this model: 'Yes'/'No' are not single tokens after its answer cue"
        )
    return YesNoReadout(*context.yes_no, temperature=context.temperature)
