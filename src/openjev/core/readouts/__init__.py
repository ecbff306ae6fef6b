"""Readouts: how a question becomes branches, and how their label log-probs become answers.

A readout has two jobs: `readings(question)` (the question turns to prefill, each with
the label ids read at its end) and `combine(question, logprobs)` (per reading, the label
log-probs; back comes one probability per option, in the question's own order). Engines
never see a readout: its readings become ordinary branches of the request's trie, so
extra readings share the state's computation like any other branch.

The families, one module each: `letters.py` (letters, canonical, mirror), `parallel.py`,
`yesno.py`, each with its `build`; `per_type.py` reads each question type with its own;
what they share is in `spec.py` (the names, the spec, the port, what a family is built
from) and `order.py` (the canonical order); `catalog.py` builds a model's readouts by name.
"""

from openjev.core.readouts.letters import LettersReadout
from openjev.core.readouts.order import canonical_order
from openjev.core.readouts.parallel import ParallelReadout
from openjev.core.readouts.per_type import PerTypeReadout
from openjev.core.readouts.spec import (
    CANONICAL_ORDER,
    ONE_READING,
    QUESTION_TYPES,
    READOUT_NAMES,
    Reading,
    Readout,
    ReadoutContext,
    ReadoutSpec,
    n_options,
    question_type,
)
from openjev.core.readouts.yesno import YesNoReadout
from openjev.core.types import Combined

__all__ = [
    "CANONICAL_ORDER",
    "ONE_READING",
    "QUESTION_TYPES",
    "READOUT_NAMES",
    "Combined",
    "LettersReadout",
    "ParallelReadout",
    "PerTypeReadout",
    "Reading",
    "Readout",
    "ReadoutContext",
    "ReadoutSpec",
    "YesNoReadout",
    "canonical_order",
    "n_options",
    "question_type",
]
