"""Whether a request's compile is small enough to run on the event loop: an over-estimate
of the text it renders, counted only until the limit is passed (the service compiles a
larger request in a worker thread)."""

from __future__ import annotations

from openjev.core.readouts import Readout
from openjev.core.types import ChoiceQuestion, DecisionRequest, Question
from openjev.core.wording import option_texts

# Requests whose compile renders at most about this much text compile on the event loop (a
# few hundred microseconds of tokenizing); larger ones in a thread, so the loop keeps
# serving (bench/bench_api.py).
INLINE_COMPILE_CHARS = 4096
# What the template adds per turn and the wording per question or option, over-estimated:
# a state of many empty turns is costly to render though it holds no characters.
TURN_OVERHEAD_CHARS = 32
QUESTION_OVERHEAD_CHARS = 256
OPTION_OVERHEAD_CHARS = 8


def _question_chars(question: Question) -> int:
    texts = option_texts(question)
    return (
        QUESTION_OVERHEAD_CHARS
        + len(question.instructions or "")
        + sum(len(t) + OPTION_OVERHEAD_CHARS for t in texts)
        + (sum(len(o.name) for o in question.options) if isinstance(question, ChoiceQuestion) else 0)
    )


def compiles_inline(request: DecisionRequest, readout: Readout, limit: int = INLINE_COMPILE_CHARS) -> bool:
    """Whether the compile is small enough for the event loop: an over-estimate of the text
    it renders (state turns with their template overhead, each question once per reading).
    Stops counting as soon as `limit` is passed, so this check itself stays bounded."""
    total = 0
    for turn in request.state.turns:
        total += len(turn.content) + TURN_OVERHEAD_CHARS
        if total > limit:
            return False
    for _, question in request.questions:
        total += readout.count(question) * _question_chars(question)
        if total > limit:
            return False
    return True
