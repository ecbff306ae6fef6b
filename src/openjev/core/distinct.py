"""What must differ for an answer to mean something, one rule for every route: question ids,
option names and what the model reads of each option are compared as `reading` gives them
(Unicode NFKC, invisible format characters removed, whitespace runs as one space), so two
that differ only by a zero-width space, a compatibility form or spacing are the same.

Options the model reads the same are refused: the model cannot tell them apart, and the
pick between them would go by their position. Ids and names that read the same are
refused: an answer keyed by either is ambiguous to the caller."""

from __future__ import annotations

import unicodedata

from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion
from openjev.core.wording import option_texts
from openjev.errors import InvalidInput


def reading(text: str) -> str:
    """`text` as compared for sameness (see the module's docstring)."""
    normal = unicodedata.normalize("NFKC", text)
    visible = "".join(ch for ch in normal if unicodedata.category(ch) != "Cf")
    return " ".join(visible.split())


def first_repeat(texts: list[str]) -> tuple[int, int] | None:
    """The positions (earlier, later) of the first two of `texts` that read the same."""
    seen: dict[str, int] = {}
    for i, text in enumerate(texts):
        key = reading(text)
        if key in seen:
            return seen[key], i
        seen[key] = i
    return None


def refuse_ties(request: DecisionRequest) -> None:
    """InvalidInput (422; OpenAI's 400) for question ids, option names or options the model
    reads that are the same once read as `reading` gives them."""
    ids = [qid for qid, _ in request.questions]
    twice = first_repeat(ids)
    if twice is not None:
        a, b = (ids[i] for i in twice)
        raise InvalidInput(f"question ids {a!r} and {b!r} are the same once normalized: give each its own id")
    for qid, question in request.questions:
        if isinstance(question, ChoiceQuestion):
            names = [o.name for o in question.options]
            twice = first_repeat(names)
            if twice is not None:
                a, b = (names[i] for i in twice)
                raise InvalidInput(
                    f"question {qid!r}: option names {a!r} and {b!r} are the same once normalized "
                    "(invisible characters and Unicode forms aside): give each its own name"
                )
        if isinstance(question, NoulQuestion):
            continue  # yes and no always read apart
        texts = option_texts(question)
        twice = first_repeat(texts)
        if twice is not None:
            shown = texts[twice[1]]
            raise InvalidInput(
                f"question {qid!r}: options {twice[0]} and {twice[1]} read the same to the model ({shown[:40]!r}); "
                "the pick would go by their position: give them different descriptions, or remove one"
            )
