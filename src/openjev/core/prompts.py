"""PromptCompiler: a decision request -> a Plan of token ids (letter readout).

One branch per question: the state's chat turns, then a user turn with the question and
lettered options, then the assistant turn opened by the model's own template (thinking
off) and the answer cue. The branch is read at its last position for the option labels.

Tokenization is split at a turn boundary: the state's turns are encoded once and each
question's part on its own. That equals encoding the whole text only where the boundary
cannot merge tokens (it falls before the template's turn-opening special token); this is
checked on every request, and where it fails every branch is encoded whole instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from openjev.core.labels import LabelSet, verify_labels
from openjev.core.plan import Branch, Plan
from openjev.core.ports import ChatTokenizer
from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion, Question, ScoreQuestion, State, Turn

log = logging.getLogger(__name__)

ANSWER_CUE = "Answer:"
INSTRUCTION = "Answer the question about the content above with the letter of exactly one option."
LABEL_SEPARATOR = " "
# Stands in for the question turn while the template is probed; never reaches the model.
_SENTINEL = "\x00openjev-question\x00"

_PROBE_STATE = State(turns=(Turn("user", "The parcel arrived two weeks late and my card was charged twice."),))
_PROBE_QUESTION = ChoiceQuestion(instructions="Which team should handle this?", options=())


@dataclass(frozen=True)
class CompiledRequest:
    """The plan, one branch per question in request order; `n_labels[i]` labels read for question i."""

    plan: Plan
    n_labels: tuple[int, ...]


def option_texts(question: Question) -> list[str]:
    """What the model sees for each option, in label order."""
    if isinstance(question, NoulQuestion):
        yes = "Yes" if question.true_description is None else f"Yes: {question.true_description}"
        no = "No" if question.false_description is None else f"No: {question.false_description}"
        return [yes, no]
    if isinstance(question, ChoiceQuestion):
        # The name speaks only where no description does: names are often terse keys.
        return [o.name if o.description is None else o.description for o in question.options]
    return list(question.levels)


def question_text(question: Question, labels: LabelSet) -> str:
    """The question turn's content. Question ids never appear here."""
    options = option_texts(question)
    if isinstance(question, NoulQuestion):
        ask = question.instructions or "Is the statement described by the options true?"
        heading = "Options:"
    elif isinstance(question, ChoiceQuestion):
        ask = question.instructions or "Which option fits best?"
        heading = "Options:"
    else:
        ask = question.instructions or "Where on this scale does it fall?"
        heading = "Options (a scale, from lowest to highest):"
    # What every question shares comes first, so it joins the prefix computed once per request.
    lines = [
        INSTRUCTION,
        "",
        f"Question: {ask}",
        "",
        heading,
        *(f"{labels.texts[i]}. {text}" for i, text in enumerate(options)),
    ]
    return "\n".join(lines)


class PromptCompiler:
    """Renders with the model's chat template and produces token-id plans.

    Construction probes the template and verifies `max_labels` answer labels in context;
    it raises ModelUnsuitable if the model cannot be read this way.
    """

    def __init__(self, tokenizer: ChatTokenizer, *, max_labels: int) -> None:
        self._tok = tokenizer
        probe = self._render_texts(_PROBE_STATE, [_PROBE_QUESTION], LabelSet((), ()))
        prefix, middle, questions = probe
        context = prefix + middle + questions[0]
        self.labels = verify_labels(tokenizer.encode, context, LABEL_SEPARATOR, max_labels)

    def _render_texts(self, state: State, questions: list[Question], labels: LabelSet) -> tuple[str, str, list[str]]:
        """(prefix, middle, per-question tails): branch i's text is prefix + middle + tails[i].

        `prefix` is the state's own rendering where the template keeps it intact, else "".
        """
        turns = list(state.turns)
        try:
            full = self._tok.render([*turns, Turn("user", _SENTINEL)], add_generation_prompt=True)
        except Exception:
            # Templates that demand strict user/assistant alternation (Gemma's) refuse a
            # second user turn: the question then joins the last user turn.
            if not turns or turns[-1].role != "user":
                raise
            folded = Turn("user", turns[-1].content + "\n\n" + _SENTINEL)
            full = self._tok.render([*turns[:-1], folded], add_generation_prompt=True)
        at = full.find(_SENTINEL)
        if at < 0:
            raise AssertionError("the chat template dropped the question turn")
        head, tail = full[:at], full[at + len(_SENTINEL):]
        state_only = self._tok.render(turns, add_generation_prompt=False) if turns else ""
        split = len(state_only) if head.startswith(state_only) else 0
        tails = [question_text(q, labels) + tail + ANSWER_CUE for q in questions]
        return head[:split], head[split:], tails

    def compile(self, request: DecisionRequest) -> CompiledRequest:
        questions = [q for _, q in request.questions]
        prefix, middle, tails = self._render_texts(request.state, questions, self.labels)
        prefix_ids = self._tok.encode(prefix) if prefix else []
        suffixes = [self._tok.encode(middle + t) for t in tails]
        ids = [prefix_ids + s for s in suffixes]
        # Prove the split on token ids: the branch must equal its whole text's encoding.
        # One check suffices when every branch crosses the same boundary text (`middle`).
        to_check = range(len(ids)) if not middle else range(1)
        for i in to_check:
            whole = self._tok.encode(prefix + middle + tails[i])
            if whole != ids[i]:
                log.warning("prompt split is not token-stable for this template; encoding branches whole")
                ids = [self._tok.encode(prefix + middle + t) for t in tails]
                break
        n_labels = tuple(len(option_texts(q)) for q in questions)
        branches = [Branch(tuple(b), self.labels.ids[:n]) for b, n in zip(ids, n_labels)]
        return CompiledRequest(plan=Plan.from_branches(branches), n_labels=n_labels)
