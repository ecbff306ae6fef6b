"""Frozen data classes at the core's seams: what a decision request is and what it yields."""

from __future__ import annotations

from dataclasses import dataclass, field

# ---- requests


@dataclass(frozen=True)
class Turn:
    """One chat turn of the state. `role` is system, user or assistant."""

    role: str
    content: str


@dataclass(frozen=True)
class State:
    """What every question refers to, as chat turns (a plain state is one user turn)."""

    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Option:
    """A choice option: `name` is returned to the caller; `description` (if any) is what the model sees."""

    name: str
    description: str | None


@dataclass(frozen=True)
class NoulQuestion:
    """Yes/no. At least one of instructions / a criteria side is set (enforced at the edge)."""

    instructions: str | None
    true_description: str | None = None
    false_description: str | None = None


@dataclass(frozen=True)
class ChoiceQuestion:
    instructions: str | None
    options: tuple[Option, ...]


@dataclass(frozen=True)
class ScoreQuestion:
    """Ordered levels, lowest first; the answer is an expectation over level indices."""

    instructions: str | None
    levels: tuple[str, ...]


Question = NoulQuestion | ChoiceQuestion | ScoreQuestion


@dataclass(frozen=True)
class Share:
    """Whose share of the engine a request is served from: `tenant`, the caller's key name
    ("" on a server without keys), and its `weight` (a key of weight 2 gets twice the share
    of a key of weight 1 when both have work waiting). Engines that order work across
    requests read it from the Plan (engines/fair_share.py); it never reaches the model."""

    tenant: str = ""
    weight: int = 1


NO_KEY = Share()  # a server without keys: one share, today's order


@dataclass(frozen=True)
class DecisionRequest:
    """Questions keep the caller's order and ids; ids never reach the model.

    `cache_namespace`: whose cache this request may read and fill ("" is the one shared
    namespace of a server without keys); the API edge sets it from the caller's key, and
    `share` (whose share of the engine serves it) from the same key.
    """

    state: State
    questions: tuple[tuple[str, Question], ...]
    cache_namespace: str = ""
    share: Share = NO_KEY


# ---- answers


# `order_agreement`: share of the option orderings read whose own top option is the
# answer's; None where one ordering was read (see core/readouts.py).
# `abstain`: the service's abstain rule (core/abstain.py) declines this answer; each face
# shows that its own way (a refusal on /v1/decisions, `x_abstain` on /v1/systemone).


@dataclass(frozen=True)
class NoulAnswer:
    p_true: float
    label_mass: float
    order_agreement: float | None = None
    abstain: bool = False


@dataclass(frozen=True)
class ChoiceAnswer:
    choice: str
    probabilities: tuple[tuple[str, float], ...]
    confidence: float
    label_mass: float
    order_agreement: float | None = None
    abstain: bool = False


@dataclass(frozen=True)
class ScoreAnswer:
    score: float
    confidence: float
    probabilities: tuple[float, ...]
    legend: tuple[str, ...]
    label_mass: float
    order_agreement: float | None = None
    abstain: bool = False


Answer = NoulAnswer | ChoiceAnswer | ScoreAnswer


@dataclass(frozen=True)
class Combined:
    """One probability per option in the question's own order (noul: true, false), summing to 1.

    `label_mass`: mean probability the readings put on their valid labels at all.
    `order_agreement`: share of the orderings whose own top option is the combined top
    option; None where one ordering was read.
    `shown`: where one lettered ordering was read (`mirrored`: it and its reverse, averaged),
    the option at each letter (position j showed option shown[j]); a calibration's position
    prior applies by it (symmetrised where mirrored, so a reversed scale's answer still
    mirrors). None otherwise.
    `clones`: groups of options shown with the same text (one probability, kept after calibration).
    """

    probs: tuple[float, ...]
    label_mass: float
    order_agreement: float | None = None
    shown: tuple[int, ...] | None = None
    clones: tuple[tuple[int, ...], ...] = ()
    mirrored: bool = False


@dataclass(frozen=True)
class FitBasis:
    """Which fit answered a question and what it rests on. `kind`: "task" (a task's fit,
    checked on the caller's own labelled text: `examples` and `outcomes` it was fitted on,
    `cv_ece` its cross-validated ECE), "global" (the model's shipped fit, not checked on the
    caller's text) or "none" (the raw reading); `name`: the fit's name as results give it
    (`task:<id>`, the calibration's id), None for "none"."""

    kind: str
    name: str | None = None
    examples: int = 0
    outcomes: int = 0
    cv_ece: float | None = None


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request.

    `input_tokens`: distinct tokens the model read (state once + each question's own part).
    `prompt_tokens`: the sum over branches of their full length (what naive prefills cost).
    `computed_tokens` / `cached_tokens`: what the engine actually prefilled / served from
    cache; None where the engine cannot tell.
    """

    input_tokens: int
    prompt_tokens: int
    computed_tokens: int | None
    cached_tokens: int | None
    output_tokens: int = 0


@dataclass(frozen=True)
class DecisionResult:
    """`readout` names the readout used (e.g. "letters;rotations=4"); `calibration` the id of
    the calibration applied, None where none was; `readings` and `fits` per question (empty
    where a result was made without them)."""

    answers: tuple[tuple[str, Answer], ...]
    usage: Usage
    prefix_tokens: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    readout: str = "letters"
    calibration: str | None = None
    readings: tuple[Combined, ...] = ()  # per question, in request order: what the readout read (before any fit)
    fits: tuple[FitBasis, ...] = ()  # per question, in request order: the fit that answered it
