"""The ports the core needs; engines and tokenizers implement them (they import the core,
never the reverse)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from openjev.core.caller import Caller
from openjev.core.plan import Plan
from openjev.core.types import Turn


@dataclass(frozen=True)
class BranchResult:
    """Log-probs at the branch's last position, aligned with its `label_ids`.

    Values are natural-log probabilities under the model's full vocabulary; -inf is allowed,
    NaN and +inf are not.
    """

    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class PlanResult:
    """One result per plan branch, in plan order, plus what executing the plan cost.

    `computed_tokens`: token positions actually prefilled; `cached_tokens`: positions served
    from a cache. Either is None where the engine cannot tell. `timings_ms` names the
    engine's phases (e.g. prefill, branches) for the Server-Timing header.
    """

    branches: tuple[BranchResult, ...]
    computed_tokens: int | None
    cached_tokens: int | None
    timings_ms: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    """Executes plans. Sees token ids only: never questions or wire types.

    `run` must not block the event loop; it raises openjev.errors types (EngineError,
    EngineUnavailable, EngineTimeout) and honours cancellation of the awaiting task.
    """

    # Whether it runs parallel layouts (core/plan.py: options read side by side under a tree
    # mask); one that does not is never given such a branch (the service reads their twin).
    parallel_layouts: bool

    async def run(self, plan: Plan) -> PlanResult: ...

    async def close(self) -> None: ...

    def estimate_s(self, plan: Plan) -> float | None:  # noqa: ARG002 - the default ignores it
        """Seconds of engine work `plan` would take by itself, before it runs (what the engine
        caches subtracted); None where the engine cannot tell (it has measured nothing yet, or
        its cost is not its own to know, as over HTTP): what an engine that declares the port
        (subclasses it) and keeps no cost model inherits."""
        return None

    def stats(self) -> Mapping[str, float]:
        """Numbers for metrics and /health (api/operations/metrics.py names them), read from
        any thread without waiting on the engine's work."""
        ...


class Admission(Protocol):
    """What admits a decision's work for its caller before the engine sees it (the edge's,
    api/identity/admission.py). The service runs its plans on `gate(engine)` (the engine,
    measured), and for each decision, with the caller it was given: enters `slot(caller)`
    before it takes one of its evaluation slots, then, once every plan it will run is
    prepared (the request's and its content-free twin's), `admit(caller, plans)` around
    running them: the plans priced and charged as one (it raises the refusal)."""

    def gate(self, engine: Engine) -> Engine: ...

    def slot(self, caller: Caller) -> AbstractAsyncContextManager[object]: ...

    def admit(self, caller: Caller, plans: Sequence[Plan]) -> AbstractAsyncContextManager[object]: ...


class AdmitAll(Admission):
    """The admission of a service given none (one process with no edge: tests, the eval
    tools): the engine as it is, and every caller's work admitted."""

    def gate(self, engine: Engine) -> Engine:
        return engine

    def slot(self, caller: Caller) -> AbstractAsyncContextManager[object]:  # noqa: ARG002 - admits anyone
        return nullcontext()

    def admit(self, caller: Caller, plans: Sequence[Plan]) -> AbstractAsyncContextManager[object]:  # noqa: ARG002
        return nullcontext()


# A text in pieces, each (text, template): a template piece is the chat template's own text
# and may hold its special tokens; every other piece (whatever a caller sent, and the
# wording) is plain text, never read as a special token. Joined, the pieces are one text.
Segments = tuple[tuple[str, bool], ...]


class TemplateRefused(Exception):
    """The chat template refuses these turns (e.g. Gemma's demands strict user/assistant
    alternation); `ChatTokenizer.render` raises it so callers can try another arrangement."""


class ChatTokenizer(Protocol):
    """The model's tokenizer and chat template."""

    def render(self, turns: Sequence[Turn], *, add_generation_prompt: bool) -> str:
        """The chat template applied to `turns`, thinking disabled where the template supports
        it. Raises TemplateRefused where the template rejects the turns themselves."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, adding no special tokens of its own (the template has them);
        special tokens spelled in `text` are read as such: for the template's own text only."""
        ...

    def encode_pieces(self, pieces: Segments) -> list[int]:
        """Token ids of the pieces joined as one text (tokens may span pieces, as in
        encode(joined)), where only a template piece may yield a special (added) token: a
        plain piece's characters are encoded as ordinary text even where they spell one
        (`<|im_start|>` in a caller's text is as many tokens as its characters). For joined
        text that spells no special token in its plain pieces, this equals encode(joined)."""
        ...

    def breaks_before(self, piece: tuple[str, bool]) -> bool:
        """Whether no token can span the start of `piece`: True only where, for all pieces
        `a` and `b` with `b` starting with `piece`, encode_pieces(a + b) equals
        encode_pieces(a) + encode_pieces(b) (a template piece opening with a special token
        that the encoding always splits at). False where it cannot tell."""
        ...
