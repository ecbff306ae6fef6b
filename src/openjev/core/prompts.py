"""PromptCompiler: a decision request and a readout -> a Plan of token ids.

Each of the readout's readings of a question becomes one branch: the state's chat turns,
then a user turn with the reading's text, then the assistant turn opened by the model's
own template (thinking off) and the answer cue. The branch is read at its last position
for the reading's labels. A question's branches are contiguous, in the readout's order.

Tokenization is split at a turn boundary: the state's turns are encoded once and each
reading's part on its own. That equals encoding the whole text only where the boundary
cannot merge tokens (it falls before the template's turn-opening special token); this is
checked on every request, and where it fails every branch is encoded whole instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from openjev.core.labels import LabelSet, verify_labels, verify_words
from openjev.core.plan import Branch, Plan
from openjev.core.ports import ChatTokenizer, TemplateRefused
from openjev.core.readouts import LettersReadout, Readout
from openjev.core.types import ChoiceQuestion, DecisionRequest, State, Turn
from openjev.core.wording import ANSWER_CUE, LABEL_SEPARATOR, NO, YES, letters_text
from openjev.errors import ModelUnsuitable, TokensExceeded

log = logging.getLogger(__name__)

# Stands in for the question turn while the template is probed; never reaches the model.
_SENTINEL = "\x00openjev-question\x00"

_PROBE_STATE = State(turns=(Turn("user", "The parcel arrived two weeks late and my card was charged twice."),))
_PROBE_QUESTION = ChoiceQuestion(instructions="Which team should handle this?", options=())


# Characters of the shared text's end that the token-stability check encodes again.
STABILITY_WINDOW = 512


@dataclass(frozen=True)
class CompileLimits:
    """What one request may cost, checked while it is compiled (see PromptCompiler.compile)."""

    max_branch_tokens: int
    max_branches: int
    max_prompt_tokens: int


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
        prefix, middle, tails = self._render_texts(_PROBE_STATE, [letters_text(_PROBE_QUESTION, (), ())])
        context = prefix + middle + tails[0]
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

    def _frame(self, state: State) -> tuple[str, str, str]:
        """(prefix, middle, tail): a branch's text is prefix + middle + <reading> + tail.

        `prefix` is the state's own rendering where the template keeps it intact, else "".
        """
        turns = list(state.turns)
        try:
            full = self._tok.render([*turns, Turn("user", _SENTINEL)], add_generation_prompt=True)
        except TemplateRefused:
            # Templates that demand strict user/assistant alternation (Gemma's) refuse a
            # second user turn: the question then joins the last user turn.
            if not turns or turns[-1].role != "user":
                raise
            folded = Turn("user", turns[-1].content + "\n\n" + _SENTINEL)
            full = self._tok.render([*turns[:-1], folded], add_generation_prompt=True)
        at = full.find(_SENTINEL)
        if at < 0:
            raise ModelUnsuitable("the model's chat template dropped the question turn")
        head, tail = full[:at], full[at + len(_SENTINEL) :]
        state_only = self._tok.render(turns, add_generation_prompt=False) if turns else ""
        split = len(state_only) if head.startswith(state_only) else 0
        return head[:split], head[split:], tail + ANSWER_CUE

    def _render_texts(self, state: State, turn_texts: list[str]) -> tuple[str, str, list[str]]:
        """(prefix, middle, tails): branch i's text is prefix + middle + tails[i]."""
        prefix, middle, tail = self._frame(state)
        return prefix, middle, [text + tail for text in turn_texts]

    def compile(  # noqa: C901 - core/ is changed by issue 20 this round; split it after that merge
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
        n_branches = sum(counts)
        if limits is not None and n_branches > limits.max_branches:
            raise _exceeded(
                f"the request reads {n_branches} branches (limit {limits.max_branches} per request; each "
                "question is one branch per rotation, or under the yesno readout one per option)",
                0,
            )
        turns = len(request.state.turns)
        if limits is not None and turns * self.turn_tokens > limits.max_branch_tokens:
            qid = request.questions[0][0] if request.questions else ""
            raise _exceeded(
                f"question {qid!r}: the state's {turns} chat turns alone take at least {turns * self.turn_tokens} "
                f"tokens (limit {limits.max_branch_tokens} per branch)",
                0,
            )
        prefix, middle, tail = self._frame(request.state)
        # The shared part is encoded once: the state's rendering where the template keeps
        # it intact (the boundary then falls before a special token), else everything
        # before the question (the part of each branch is then the reading alone).
        shared_text, lead = (prefix, middle) if prefix else (middle, "")
        shared = tuple(self._tok.encode(shared_text)) if shared_text else ()
        work = len(shared)
        if limits is not None:
            floor = len(shared) + 1  # every branch is the shared part and at least one token more
            if floor > limits.max_branch_tokens:
                qid = request.questions[0][0] if request.questions else ""
                raise _exceeded(
                    f"question {qid!r}: the state and this question take more than {len(shared)} tokens "
                    f"(limit {limits.max_branch_tokens} per branch)",
                    work,
                )
            if n_branches * floor > limits.max_prompt_tokens:
                raise _exceeded(
                    f"the request's {n_branches} branches take at least {n_branches * floor} tokens in all, the "
                    f"state once per branch (limit {limits.max_prompt_tokens} per request)",
                    work,
                )
        parts: list[tuple[int, ...]] = []
        texts: list[str] = []
        label_ids: list[tuple[int, ...]] = []
        spans: list[tuple[int, int]] = []
        total = 0

        def encode_part(text: str) -> tuple[int, ...]:
            nonlocal work
            part = part_cache.get(text) if part_cache is not None else None
            if part is None:
                part = tuple(self._tok.encode(text))
                work += len(part)
                if part_cache is not None:
                    part_cache[text] = part
            return part

        # A parallel reading's turn is its text, then (side by side) its parallel texts, each
        # encoded on its own; the template's tail follows, encoded on its own too. `layouts`
        # holds its spans as offsets into its own part (the shared part's length is added
        # when the branch is made: spans index the whole sequence).
        layouts: list[tuple[tuple[int, int], ...]] = []
        pieces: list[tuple[str, tuple[tuple[int, ...], ...], tuple[int, ...]] | None] = []
        for (qid, question), count in zip(request.questions, counts, strict=True):
            spans.append((len(parts), count))
            for k in range(count):
                reading = readout.reading(question, k)
                if reading.parallel:
                    text = lead + reading.text
                    head = encode_part(text)
                    lines = tuple(encode_part(line) for line in reading.parallel)
                    end = encode_part(tail)
                    cuts: list[tuple[int, int]] = []
                    at = len(head)
                    for line in lines:
                        cuts.append((at, at + len(line)))
                        at += len(line)
                    part = head + tuple(t for line in lines for t in line) + end
                    layouts.append(tuple(cuts))
                    pieces.append((text, lines, end))
                else:
                    text = lead + reading.text + tail
                    part = encode_part(text)
                    layouts.append(())
                    pieces.append(None)
                total += len(shared) + len(part)
                if limits is not None:
                    _check(limits, qid, len(shared) + len(part), total, work)
                parts.append(part)
                texts.append(text)
                label_ids.append(reading.label_ids)
        if shared and not self._split_is_stable(shared_text, texts, same_lead=bool(lead)):
            log.warning("prompt split is not token-stable for this template; encoding branches whole")
            total = 0
            owner = [qid for (qid, _), count in zip(request.questions, counts, strict=True) for _ in range(count)]
            branches = []
            for i, text in enumerate(texts):
                whole = tuple(self._tok.encode(shared_text + text))
                work += len(whole)
                layout: tuple[tuple[int, int], ...] = ()
                piece = pieces[i]
                if piece is not None:  # the head is re-encoded whole; the spans and tail stay apart
                    _, lines, end = piece
                    at = len(whole)
                    cut_list = []
                    for line in lines:
                        cut_list.append((at, at + len(line)))
                        at += len(line)
                    layout = tuple(cut_list)
                    whole = whole + tuple(t for line in lines for t in line) + end
                total += len(whole)
                if limits is not None:
                    _check(limits, owner[i], len(whole), total, work)
                branches.append(Branch(whole, label_ids[i], parallel=layout))
        else:
            base = len(shared)
            branches = [
                Branch(p, ids, shared, parallel=tuple((a + base, b + base) for a, b in layout))
                for p, ids, layout in zip(parts, label_ids, layouts, strict=True)
            ]
        plan = Plan.from_branches(branches, cache_namespace=request.cache_namespace)
        return CompiledRequest(plan=plan, spans=tuple(spans))

    def _split_is_stable(self, shared_text: str, texts: list[str], *, same_lead: bool) -> bool:
        """Whether encoding shared_text and each text apart equals encoding them together.

        Proven on a window: the last STABILITY_WINDOW characters of the shared text, which
        hold every merge a boundary can cause (tokenizers pre-split text into words far
        shorter), so the check costs the same for a 2 MB state as for a short one. One
        text suffices where every text starts with the same boundary text (`same_lead`).
        """
        window = shared_text[-STABILITY_WINDOW:]
        window_ids = self._tok.encode(window)
        for text in texts[:1] if same_lead else texts:
            if self._tok.encode(window + text) != window_ids + self._tok.encode(text):
                return False
        return True


def _exceeded(message: str, work: int) -> TokensExceeded:
    exc = TokensExceeded(message)
    exc.work_tokens = work
    return exc


def _check(limits: CompileLimits, qid: str, branch: int, total: int, work: int) -> None:
    if branch > limits.max_branch_tokens:
        raise _exceeded(
            f"question {qid!r}: the state and this question take {branch} tokens "
            f"(limit {limits.max_branch_tokens} per branch)",
            work,
        )
    if total > limits.max_prompt_tokens:
        raise _exceeded(
            f"the request's branches take more than {total} tokens in all, the state once per branch "
            f"(limit {limits.max_prompt_tokens} per request)",
            work,
        )
