"""From a question's combined probabilities to its answer (core/types.py): calibration
applied where a fit covers it, then the choice or the score and their confidence, and
whether the abstain rule declines it."""

from __future__ import annotations

import math

from openjev.core import calibration as calib
from openjev.core import scoring
from openjev.core.abstain import AbstainRule
from openjev.core.readouts import Combined
from openjev.core.types import Answer, ChoiceAnswer, ChoiceQuestion, NoulAnswer, NoulQuestion, Question, ScoreAnswer
from openjev.core.wording import option_texts
from openjev.errors import EngineError


def answer_of(
    question: Question,
    combined: Combined,
    fit: calib.TypeFit | None,
    rule: AbstainRule,
    free: tuple[float, ...] | None = None,
) -> Answer:
    """A question's answer from its readings' combined probabilities: calibrated where `fit`
    applies (divided by its content-free answer `free` first, where the fit asks for one),
    then its choice or score, confidence, and whether `rule` abstains."""
    probs = (
        combined.probs
        if fit is None
        else calib.apply(fit, combined.probs, combined.shown, combined.clones, combined.mirrored, free)
    )
    if not all(math.isfinite(p) for p in probs):
        raise EngineError("the engine's log-probabilities gave non-finite probabilities")
    mass, agreement = combined.label_mass, combined.order_agreement
    abstain = rule.refuses(mass, agreement, max(probs))
    if isinstance(question, NoulQuestion):
        return NoulAnswer(p_true=probs[0], label_mass=mass, order_agreement=agreement, abstain=abstain)
    if isinstance(question, ChoiceQuestion):
        names = [o.name for o in question.options]
        return ChoiceAnswer(
            choice=names[scoring.argmax(probs)],
            probabilities=tuple(zip(names, probs, strict=True)),
            confidence=scoring.choice_confidence(probs),
            label_mass=mass,
            order_agreement=agreement,
            abstain=abstain,
        )
    return ScoreAnswer(
        score=scoring.expectation(probs),
        confidence=scoring.score_confidence(probs),
        probabilities=tuple(probs),
        legend=tuple(option_texts(question)),
        label_mass=mass,
        order_agreement=agreement,
        abstain=abstain,
    )
