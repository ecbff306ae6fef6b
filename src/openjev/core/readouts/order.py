"""The canonical order of a choice's options (by the text the model sees, then by name: the
same whatever order the caller lists them in), and the options it shows alike (clones);
read by the readouts that letter in that order (letters' canonical and mirror, parallel)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from openjev.core import wording
from openjev.core.types import ChoiceQuestion


def clones_of(question: ChoiceQuestion) -> tuple[tuple[int, ...], ...]:
    """Groups of options the model is shown with the same text: the same option to it
    (which of them got the earlier letter was decided by their names alone, so whatever
    separates their probabilities is the position, never the option)."""
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(wording.option_texts(question)):
        groups.setdefault(text, []).append(i)
    return tuple(tuple(m) for m in groups.values() if len(m) > 1)


def shared(probs: Sequence[float], clones: Sequence[Sequence[int]]) -> list[float]:
    """Each group of clones gets its mean."""
    out = list(probs)
    for members in clones:
        shared = math.fsum(probs[i] for i in members) / len(members)
        for i in members:
            out[i] = shared
    return out


def canonical_order(question: ChoiceQuestion) -> tuple[int, ...]:
    """The options' indices sorted by what the model sees, then by name: the same for any
    order the caller lists them in."""
    texts = wording.option_texts(question)
    return tuple(sorted(range(len(texts)), key=lambda i: (texts[i], question.options[i].name)))
