"""PromptCompiler: a decision request and a readout -> a Plan of token ids.

Each of the readout's readings of a question becomes one branch: the state's chat turns,
then a user turn with the reading's text, then the assistant turn opened by the model's
own template (thinking off) and the answer cue. The branch is read at its last position
for the reading's labels. A question's branches are contiguous, in the readout's order.

Caller text is text (core/frame.py): the template is rendered around placeholders and
the caller's texts put in their places by position, never found by searching the
rendering; every text but the template's own is encoded as plain text
(`ChatTokenizer.encode_pieces`), so no caller text becomes a control token.

Tokenization is split at a turn boundary: the state's turns are encoded once and each
reading's part on its own. That equals encoding the whole text only where the boundary
cannot merge tokens (it falls before the template's turn-opening special token); this is
checked on every request, and where it fails every branch is encoded whole instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from openjev.core.compile_limits import CompileLimits, check, check_shared, exceeded, first_qid
from openjev.core.encoding import Encoded, Encoder, lay_out
from openjev.core.frame import Frame, content_rule, frame, tail_chars, text_of
from openjev.core.labels import LabelSet, verify_labels, verify_words
from openjev.core.plan import Branch, Plan
from openjev.core.ports import ChatTokenizer, Segments
from openjev.core.readouts import LettersReadout, Readout
from openjev.core.shared_ids import SHARED_IDS_TOKENS, SharedIds
from openjev.core.types import ChoiceQuestion, DecisionRequest, State, Turn
from openjev.core.wording import ANSWER_CUE, LABEL_SEPARATOR, NO, YES, letters_text

log = logging.getLogger(__name__)

_PROBE_STATE = State(turns=(Turn("user", "The parcel arrived two weeks late and my card was charged twice."),))
_PROBE_QUESTION = ChoiceQuestion(instructions="Which team should handle this?", options=())


# Characters of the shared text's end that the token-stability check encodes again.
STABILITY_WINDOW = 512


@dataclass(frozen=True)
class CompiledRequest:
    """The plan and, per question in request order, the (start, count) of its branches."""

    plan: Plan
    spans: tuple[tuple[int, int], ...]


class PromptCompiler:
    """Renders with the model's chat template and produces token-id plans.

    Construction probes the template and verifies `max_labels` letter labels in context
    (raises ModelUnsuitable if the model cannot be read with letters) and the Yes/No words
    (`yes_no` is None where they are not single tokens: the yesno readout is unavailable).
    """

    def __init__(self, tokenizer: ChatTokenizer, *, max_labels: int) -> None:
        self._tok = tokenizer
        self._rule = content_rule(tokenizer)
        self._shared_ids = SharedIds(SHARED_IDS_TOKENS)
        probe = self._frame(_PROBE_STATE)
        context = text_of((*probe.prefix, *probe.middle, (letters_text(_PROBE_QUESTION, (), ()), False), *probe.tail))
        self.labels: LabelSet = verify_labels(tokenizer.encode, context, LABEL_SEPARATOR, max_labels)
        yes_no = verify_words(tokenizer.encode, context, LABEL_SEPARATOR, (YES, NO))
        self.yes_no: tuple[int, int] | None = None if yes_no is None else (yes_no[0], yes_no[1])
        self.turn_tokens = self._tokens_per_turn()
        if self.yes_no is None:
            log.warning(
                "%r and %r are not single tokens after the answer cue: the yesno readout is unavailable", YES, NO
            )

    def _tokens_per_turn(self) -> int:
        """The fewest tokens the template spends on one more (empty) chat turn, measured on
        repeated turn patterns (0 where it cannot be measured): a state of N turns takes at
        least N times this many tokens, known before the state is rendered."""
        found: list[int] = []
        for pattern in (("user", "assistant"), ("user",), ("assistant",), ("system",)):
            try:
                sizes = [
                    len(
                        self._tok.encode(
                            self._tok.render([Turn(r, "") for r in pattern * k], add_generation_prompt=False)
                        )
                    )
                    for k in (2, 4)
                ]
            except Exception:  # noqa: BLE001 - a template that refuses this pattern: no measure from it
                continue
            found.append(max(0, (sizes[1] - sizes[0]) // (2 * len(pattern))))
        return min(found) if found else 0

    def _frame(self, state: State) -> Frame:
        return frame(self._tok, state, self._rule, ANSWER_CUE)

    def compile(
        self,
        request: DecisionRequest,
        readout: Readout | None = None,
        limits: CompileLimits | None = None,
        part_cache: dict[str, tuple[int, ...]] | None = None,
    ) -> CompiledRequest:
        """The request's plan under `readout` (default: letters, one ordering).

        With `limits`, raises TokensExceeded as soon as the arithmetic shows a limit is
        passed, before the work it bounds: the branch count, and the state's turns times the
        fewest tokens a turn takes, before any text is rendered;
        the state's tokens (encoded once) times the branch count before any question is
        encoded; each question's readings one by one, stopping at the first that passes
        the per-branch or the all-branches limit. `TokensExceeded.work_tokens` says how many
        tokens were encoded before the refusal (what it cost).

        `part_cache` (text -> ids), shared by the items of a batch that ask the same
        questions of many states, lets each question part be encoded once for all of them.
        """
        if readout is None:
            readout = LettersReadout(self.labels.texts, self.labels.ids)
        counts = [readout.count(q) for _, q in request.questions]
        self._check_shape(request, sum(counts), limits)
        fr = self._frame(request.state)
        # The shared part is encoded once: the state's rendering where the template keeps
        # it intact (the boundary then falls before a special token), else everything
        # before the question (the part of each branch is then the reading alone).
        shared_text, lead = (fr.prefix, fr.middle) if fr.prefix else (fr.middle, ())
        enc = Encoder(self._tok, part_cache, self._shared_ids, request.cache_namespace)
        # A state (or a question's reading) asked again in the same namespace (a compile's time
        # tells no tenant what another sent) is not encoded again; it is kept only once its
        # request passed the limits, so a refusal is charged what it read every time and fills
        # nothing.
        shared = enc.part(shared_text) if shared_text else ()
        if limits is not None:
            check_shared(limits, request, len(shared), sum(counts), enc.work)
        reads = self._encode_readings(request, readout, counts, enc, lead, fr.tail, len(shared), limits)
        if shared and not self._split_is_stable(shared_text, [r.text for r in reads], same_lead=bool(lead)):
            log.warning("prompt split is not token-stable for this template; encoding branches whole")
            branches = self._whole_branches(shared_text, reads, enc, limits)
        else:
            branches = _on_shared(shared, reads)
        plan = Plan.from_branches(branches, cache_namespace=request.cache_namespace, share=request.share)
        for part_key, ids in enc.fresh.items():
            self._shared_ids.put((request.cache_namespace, part_key), ids)
        return CompiledRequest(plan=plan, spans=_spans(counts))

    def _check_shape(self, request: DecisionRequest, n_branches: int, limits: CompileLimits | None) -> None:
        """The limits known before any text is rendered: the branch count, and the state's
        turns times the fewest tokens a turn takes."""
        if limits is None:
            return
        if n_branches > limits.max_branches:
            raise exceeded(
                f"the request reads {n_branches} branches (limit {limits.max_branches} per request; each "
                "question is one branch per rotation, or under the yesno readout one per option)",
                0,
            )
        turns = len(request.state.turns)
        if turns * self.turn_tokens > limits.max_branch_tokens:
            raise exceeded(
                f"question {first_qid(request)!r}: the state's {turns} chat turns alone take at least "
                f"{turns * self.turn_tokens} tokens (limit {limits.max_branch_tokens} {limits.branch_limit})",
                0,
            )

    def _encode_readings(
        self,
        request: DecisionRequest,
        readout: Readout,
        counts: list[int],
        enc: Encoder,
        lead: Segments,
        tail: Segments,
        shared_len: int,
        limits: CompileLimits | None,
    ) -> list[Encoded]:
        """Every reading of every question, encoded apart from the shared part, checked
        against the limits one by one (the first over a limit stops the encoding)."""
        out: list[Encoded] = []
        total = 0
        for (qid, question), count in zip(request.questions, counts, strict=True):
            for k in range(count):
                reading = readout.reading(question, k)
                if reading.parallel:
                    # the turn's text, then its parallel texts side by side, each encoded on
                    # its own; the template's tail follows, encoded on its own too
                    text = (*lead, (reading.text, False))
                    lines = tuple(enc.part(((line, False),)) for line in reading.parallel)
                    encoded = Encoded.laid_out(qid, text, enc.part(text), lines, enc.part(tail), reading.label_ids)
                else:
                    text = (*lead, (reading.text, False), *tail)
                    encoded = Encoded(qid, text, enc.part(text), reading.label_ids)
                total += shared_len + len(encoded.part)
                if limits is not None:
                    check(limits, qid, shared_len + len(encoded.part), total, enc.work)
                out.append(encoded)
        return out

    def _whole_branches(
        self, shared_text: Segments, reads: list[Encoded], enc: Encoder, limits: CompileLimits | None
    ) -> list[Branch]:
        """The branches encoded whole (the shared text and each reading's text together),
        for a template whose split is not token-stable; a parallel reading's lines and tail
        stay apart, after its re-encoded head."""
        total = 0
        branches = []
        for r in reads:
            head = enc.whole(shared_text + r.text)
            whole: tuple[int, ...] = head
            layout: tuple[tuple[int, int], ...] = ()
            if r.lines is not None:
                whole, layout = lay_out(head, r.lines, r.end)
            total += len(whole)
            if limits is not None:
                check(limits, r.qid, len(whole), total, enc.work)
            branches.append(Branch(whole, r.label_ids, parallel=layout))
        return branches

    def _split_is_stable(self, shared_text: Segments, texts: list[Segments], *, same_lead: bool) -> bool:
        """Whether encoding shared_text and each text apart equals encoding them together.

        Proven on a window: the last STABILITY_WINDOW characters of the shared text, which
        hold every merge a boundary can cause (tokenizers pre-split text into words far
        shorter), so the check costs the same for a 2 MB state as for a short one. One
        text suffices where every text starts with the same boundary text (`same_lead`).
        """
        checked = [t for t in (texts[:1] if same_lead else texts) if not (t and self._tok.breaks_before(t[0]))]
        if not checked:  # every text opens with a special token the encoding splits at
            return True
        window = tail_chars(shared_text, STABILITY_WINDOW)
        window_ids = self._tok.encode_pieces(window)
        for text in checked:
            if self._tok.encode_pieces(window + text) != window_ids + self._tok.encode_pieces(text):
                return False
        return True


def _on_shared(shared: tuple[int, ...], reads: list[Encoded]) -> list[Branch]:
    """Each reading's branch after the shared part (its parallel lines' spans moved past it)."""
    base = len(shared)
    return [
        Branch(r.part, r.label_ids, shared, parallel=tuple((a + base, b + base) for a, b in r.layout)) for r in reads
    ]


def _spans(counts: list[int]) -> tuple[tuple[int, int], ...]:
    """Per question, the (start, count) of its branches, in request order."""
    spans, at = [], 0
    for count in counts:
        spans.append((at, count))
        at += count
    return tuple(spans)
