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
from openjev.core.readouts import LettersReadout, Reading, Readout
from openjev.core.types import ChoiceQuestion, DecisionRequest, State, Turn
from openjev.core.wording import ANSWER_CUE, LABEL_SEPARATOR, NO, YES, letters_text
from openjev.errors import ModelUnsuitable

log = logging.getLogger(__name__)

# Stands in for the question turn while the template is probed; never reaches the model.
_SENTINEL = "\x00openjev-question\x00"

_PROBE_STATE = State(turns=(Turn("user", "The parcel arrived two weeks late and my card was charged twice."),))
_PROBE_QUESTION = ChoiceQuestion(instructions="Which team should handle this?", options=())


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
        if self.yes_no is None:
            log.warning(
                "%r and %r are not single tokens after the answer cue: the yesno readout is unavailable", YES, NO
            )

    def _render_texts(self, state: State, turn_texts: list[str]) -> tuple[str, str, list[str]]:
        """(prefix, middle, tails): branch i's text is prefix + middle + tails[i].

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
        tails = [text + tail + ANSWER_CUE for text in turn_texts]
        return head[:split], head[split:], tails

    def compile(self, request: DecisionRequest, readout: Readout | None = None) -> CompiledRequest:
        """The request's plan under `readout` (default: letters, one ordering)."""
        if readout is None:
            readout = LettersReadout(self.labels.texts, self.labels.ids)
        readings: list[Reading] = []
        spans: list[tuple[int, int]] = []
        for _, question in request.questions:
            own = readout.readings(question)
            spans.append((len(readings), len(own)))
            readings += own
        # A parallel reading's turn is its text, then (side by side) its parallel texts; the
        # template's tail follows. Its tail alone is rendered here and encoded on its own.
        prefix, middle, tails = self._render_texts(request.state, [r.text for r in readings])
        prefix_ids = self._tok.encode(prefix) if prefix else []
        linear = [i for i, r in enumerate(readings) if not r.parallel]
        ids = [prefix_ids + self._tok.encode(middle + t) for t in tails]
        # Prove the split on token ids: the branch must equal its whole text's encoding.
        # One check suffices when every branch crosses the same boundary text (`middle`).
        to_check = linear if not middle else linear[:1]
        for i in to_check:
            whole = self._tok.encode(prefix + middle + tails[i])
            if whole != ids[i]:
                log.warning("prompt split is not token-stable for this template; encoding branches whole")
                ids = [self._tok.encode(prefix + middle + t) for t in tails]
                prefix_ids = []
                middle = prefix + middle
                break
        branches = []
        for i, (b, r) in enumerate(zip(ids, readings, strict=True)):
            if not r.parallel:
                branches.append(Branch(tuple(b), r.label_ids))
                continue
            head = prefix_ids + self._tok.encode(middle + r.text)
            end = tails[i][len(r.text) :]  # the template's tail and the answer cue
            cuts: list[tuple[int, int]] = []
            parts: list[int] = []
            for text in r.parallel:
                part = self._tok.encode(text)
                cuts.append((len(head) + len(parts), len(head) + len(parts) + len(part)))
                parts += part
            branches.append(Branch(tuple(head + parts + self._tok.encode(end)), r.label_ids, tuple(cuts)))
        plan = Plan.from_branches(branches, cache_namespace=request.cache_namespace)
        return CompiledRequest(plan=plan, spans=tuple(spans))
