"""Every text the model is shown besides the caller's own, in one place.

`PROMPT_VERSION` names this wording. Calibration files are bound to it: a change of any
text here changes the model's log-probs, so bump the version with it (a test pins the
wording's hash to the version to make that hard to forget).
"""

from __future__ import annotations

from collections.abc import Sequence

from openjev.core.types import ChoiceQuestion, NoulQuestion, Question

PROMPT_VERSION = "2"

ANSWER_CUE = "Answer:"
LABEL_SEPARATOR = " "

LETTERS_INSTRUCTION = "Answer the question about the content above with the letter of exactly one option."
YESNO_INSTRUCTION = "Judge the proposed answer to the question about the content above."
YESNO_ASK = "Is the proposed answer correct? Answer Yes or No."
YES, NO = "Yes", "No"

DEFAULT_ASK = {
    NoulQuestion: "Is the statement described by the options true?",
    ChoiceQuestion: "Which option fits best?",
}
DEFAULT_SCORE_ASK = "Where on this scale does it fall?"


def option_texts(question: Question) -> list[str]:
    """What the model sees for each option, in the question's own order.

    noul: (true side, false side); choice: the description, or the name where the
    description is null (names are often terse keys); score: the levels, lowest first.
    """
    if isinstance(question, NoulQuestion):
        yes = YES if question.true_description is None else f"{YES}: {question.true_description}"
        no = NO if question.false_description is None else f"{NO}: {question.false_description}"
        return [yes, no]
    if isinstance(question, ChoiceQuestion):
        return [o.name if o.description is None else o.description for o in question.options]
    return list(question.levels)


def ask_text(question: Question) -> str:
    if question.instructions:
        return question.instructions
    return DEFAULT_ASK.get(type(question), DEFAULT_SCORE_ASK)


def letters_text(question: Question, order: Sequence[int], labels: Sequence[str]) -> str:
    """The letters readout's question turn: options shown in `order` (option indices),
    position j labelled `labels[j]`. A score question's `order` is ascending or descending."""
    options = option_texts(question)
    if isinstance(question, (NoulQuestion, ChoiceQuestion)):
        heading = "Options:"
    elif list(order) == sorted(order):
        heading = "Options (a scale, from lowest to highest):"
    else:
        heading = "Options (a scale, from highest to lowest):"
    # What every question shares comes first, so it joins the prefix computed once per request.
    lines = [
        LETTERS_INSTRUCTION,
        "",
        f"Question: {ask_text(question)}",
        "",
        heading,
        *(f"{labels[j]}. {options[i]}" for j, i in enumerate(order)),
    ]
    return "\n".join(lines)


def letters_parallel_parts(question: Question, order: Sequence[int], labels: Sequence[str]) -> tuple[str, list[str]]:
    """The parallel readout's question turn, as (head, option lines): the same words as
    `letters_text`, but each option line is read side by side with the others after the
    head (core/plan.py, parallel layouts); the line for position j shows option order[j]
    labelled labels[j]. Joined, head + lines is `letters_text` for a choice question."""
    options = option_texts(question)
    head = "\n".join([LETTERS_INSTRUCTION, "", f"Question: {ask_text(question)}", "", "Options:"])
    return head, [f"\n{labels[j]}. {options[i]}" for j, i in enumerate(order)]


def yesno_noul_text(question: NoulQuestion) -> str:
    """The yes/no readout of a noul question: the question itself, read as Yes/No."""
    lines = [f"Answer the question about the content above with {YES} or {NO}.", "", f"Question: {ask_text(question)}"]
    if question.true_description is not None:
        lines.append(f"{YES} means: {question.true_description}")
    if question.false_description is not None:
        lines.append(f"{NO} means: {question.false_description}")
    return "\n".join(lines)


def yesno_candidate_text(question: Question, index: int) -> str:
    """The yes/no readout of one candidate (a choice option or a score level).

    The instruction and question come first so that a question's candidates share them in
    the trie; the candidate alone ends the turn. A score question also lists its scale in
    the shared part (a level means little without its neighbours; sharing keeps it cheap).
    """
    options = option_texts(question)
    lines = [YESNO_INSTRUCTION, "", f"Question: {ask_text(question)}"]
    if isinstance(question, ChoiceQuestion):
        lines += ["", f"Proposed answer: {options[index]}"]
    else:
        lines += ["", "The scale, from lowest to highest:", *(f"{k + 1}. {text}" for k, text in enumerate(options))]
        lines += ["", f"Proposed answer: level {index + 1} ({options[index]})"]
    # The ask repeats after the candidate: a few tokens per candidate, but a model told
    # last what to reply puts far more of its mass on Yes/No (measured: label mass).
    lines += ["", YESNO_ASK]
    return "\n".join(lines)
