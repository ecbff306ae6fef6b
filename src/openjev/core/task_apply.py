"""What a task's fit is when the service applies it: the fit, the readout it was fitted
under, its abstain rule; and the wording hash that ties a question to its task.

A task is bound to one question's wording (its type, instructions and options or levels,
`wording_of`): a request's question of the same wording is the task's question, any other is
not, so a fit is never applied to a question it was not fitted for. Its other bindings (the
model's weights, the prompt version, the base temperature, the readout) are checked where the
task is looked up (api/server/task_binding.py), as a calibration file's are at start.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from openjev.core.abstain import AbstainRule
from openjev.core.calibration import TypeFit
from openjev.core.readouts import ReadoutSpec, question_type
from openjev.core.types import ChoiceQuestion, FitBasis, NoulQuestion, Question


@dataclass(frozen=True)
class TaskCalibration:
    """`id` names it in results (`x-openjev-calibration: task:<id>`); `examples`,
    `outcomes` and `cv_ece`: what its fit rests on, for the answers' basis."""

    id: str
    readout: ReadoutSpec
    fit: TypeFit
    abstain: AbstainRule
    examples: int = 0
    outcomes: int = 0
    cv_ece: float | None = None

    @property
    def name(self) -> str:
        return f"task:{self.id}"

    @property
    def basis(self) -> FitBasis:
        return FitBasis("task", self.name, self.examples, self.outcomes, self.cv_ece)


def wording_of(question: Question) -> str:
    """A hash of what the model reads of the question (type, instructions, options), in hex."""
    if isinstance(question, NoulQuestion):
        parts: list[object] = [question.true_description, question.false_description]
    elif isinstance(question, ChoiceQuestion):
        parts = [[o.name, o.description] for o in question.options]
    else:
        parts = list(question.levels)
    text = json.dumps([question_type(question), question.instructions, parts], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
