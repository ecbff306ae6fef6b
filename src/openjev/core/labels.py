"""Answer labels: A..Z, AA, AB, ... each a single token *in context*.

The model is read at the position after the answer cue, so a label counts only if the
cue followed by the label tokenizes as the cue's tokens plus exactly one more token
(a bare-word check would miss merges with the preceding text). Candidates that fail are
skipped, keeping the order; a model that yields too few labels is refused.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from openjev.errors import ModelUnsuitable

LETTERS = string.ascii_uppercase


def candidate_labels() -> Iterator[str]:
    """A..Z, then AA..ZZ (702 candidates in all)."""
    yield from LETTERS
    for a, b in itertools.product(LETTERS, repeat=2):
        yield a + b


@dataclass(frozen=True)
class LabelSet:
    """Label texts and their token ids in context, aligned; `ids` are distinct."""

    texts: tuple[str, ...]
    ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.texts)


def verify_labels(encode: Callable[[str], list[int]], context: str, separator: str, needed: int) -> LabelSet:
    """Find the first `needed` candidate labels that are one token after `context + separator`.

    Raises ModelUnsuitable if fewer than `needed` qualify.
    """
    base = encode(context)
    texts: list[str] = []
    ids: list[int] = []
    seen: set[int] = set()
    rejected: list[str] = []
    for label in candidate_labels():
        got = encode(context + separator + label)
        if len(got) == len(base) + 1 and got[: len(base)] == base and got[-1] not in seen:
            texts.append(label)
            ids.append(got[-1])
            seen.add(got[-1])
            if len(texts) == needed:
                return LabelSet(tuple(texts), tuple(ids))
        else:
            rejected.append(label)
    raise ModelUnsuitable(
        f"only {len(texts)} of the {needed} answer labels this server needs are single tokens after the "
        f"prompt ending {context[-40:]!r} with this tokenizer (first rejected: {rejected[:8]}); "
        "this model cannot be read with letter labels"
    )


def verify_words(
    encode: Callable[[str], list[int]], context: str, separator: str, words: tuple[str, ...]
) -> tuple[int, ...] | None:
    """Token ids of `words`, each one token after `context + separator` and all distinct;
    None if any is not (the readout that needs them is then unavailable)."""
    base = encode(context)
    ids: list[int] = []
    for word in words:
        got = encode(context + separator + word)
        if len(got) != len(base) + 1 or got[: len(base)] != base or got[-1] in ids:
            return None
        ids.append(got[-1])
    return tuple(ids)
