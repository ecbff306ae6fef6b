"""The prompt wording is pinned to PROMPT_VERSION: calibration files are bound to the
version, so a wording change that kept the version would silently mis-apply them."""

import hashlib

from openjev.core import wording
from openjev.core.types import ChoiceQuestion, NoulQuestion, Option, ScoreQuestion

# Update both together: bump wording.PROMPT_VERSION, then paste the new digest here.
PINNED = {"2": "54080eb2b35b957b"}

SAMPLES = (
    NoulQuestion("Refund?"),
    NoulQuestion(None, "asks for money back", "does not"),
    ChoiceQuestion("Which team?", (Option("billing", "Payments"), Option("tech", None))),
    ChoiceQuestion(None, ()),
    ScoreQuestion("How urgent?", ("low", "high")),
    ScoreQuestion(None, ("a", "b", "c")),
)


def rendered() -> str:
    parts = [wording.ANSWER_CUE, wording.LABEL_SEPARATOR, wording.YES, wording.NO]
    for q in SAMPLES:
        n = len(wording.option_texts(q))
        parts.append(wording.letters_text(q, range(n), "ABC"))
        parts.append(wording.letters_text(q, range(n)[::-1], "ABC"))
        if isinstance(q, NoulQuestion):
            parts.append(wording.yesno_noul_text(q))
        else:
            parts += [wording.yesno_candidate_text(q, i) for i in range(n)]
    return "\x1e".join(parts)


def test_wording_matches_its_version():
    digest = hashlib.sha256(rendered().encode()).hexdigest()[:16]
    assert PINNED.get(wording.PROMPT_VERSION) == digest, (
        f"the prompt wording changed (digest {digest}) but PROMPT_VERSION is still {wording.PROMPT_VERSION!r}: "
        "bump it, pin the new digest here, and refit the shipped calibration files (docs/quality.md)"
    )


# The parallel readout's wording (added under version 2 without changing a word of the
# others, so no existing calibration changed): pinned on its own, bumped the same way.
PINNED_PARALLEL = {"2": "0f3b4208103102ac"}


def test_parallel_wording_matches_its_version():
    parts = []
    for q in SAMPLES:
        if isinstance(q, ChoiceQuestion):
            n = len(q.options)
            head, lines = wording.letters_parallel_parts(q, range(n)[::-1], "ABC")
            parts += [head, *lines]
    digest = hashlib.sha256("\x1e".join(parts).encode()).hexdigest()[:16]
    assert PINNED_PARALLEL.get(wording.PROMPT_VERSION) == digest, f"parallel wording changed (digest {digest})"
