"""Named fakes for the core's seams: a tokenizer with a ChatML-like template and an engine
that records what reaches it. Unit and API tests only; integration tests use the real model."""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass, field
from typing import Sequence

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, PlanResult
from openjev.core.types import Turn

_SPECIAL = re.compile(r"(<\|im_start\|>|<\|im_end\|>)")
_PIECE = re.compile(r" ?[A-Za-z0-9]+| ?[^\sA-Za-z0-9]|\s+")


class FakeTokenizer:
    """Word-level tokenizer: special tokens split first, then ' word', punctuation, whitespace.

    `split_labels`: label texts that encode as two tokens after a space (to exercise
    label skipping). `glued=True`: a template without special tokens between turns, whose
    boundaries merge words (to exercise the whole-branch fallback).
    """

    def __init__(self, split_labels: Sequence[str] = (), glued: bool = False) -> None:
        self.vocab: dict[str, int] = {}
        self.split_labels = set(split_labels)
        self.glued = glued
        self.encode_calls = 0

    def render(self, turns: Sequence[Turn], *, add_generation_prompt: bool) -> str:
        if self.glued:
            text = "".join(f"{t.role}: {t.content}" for t in turns)
            return text + ("assistant: " if add_generation_prompt else "")
        text = "".join(f"<|im_start|>{t.role}\n{t.content}<|im_end|>\n" for t in turns)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def _id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, len(self.vocab) + 1)

    def encode(self, text: str) -> list[int]:
        self.encode_calls += 1
        ids: list[int] = []
        for part in _SPECIAL.split(text):
            if not part:
                continue
            if _SPECIAL.fullmatch(part):
                ids.append(self._id(part))
                continue
            for piece in _PIECE.findall(part):
                if piece.startswith(" ") and piece[1:] in self.split_labels:
                    ids += [self._id(piece[:2]), self._id(piece[2:])]
                else:
                    ids.append(self._id(piece))
        return ids


def fake_logprobs(input_ids: Sequence[int], n: int) -> tuple[float, ...]:
    """Deterministic, distinct log-probs for a branch (a function of its tokens only)."""
    digest = hashlib.sha256(repr(tuple(input_ids)).encode()).digest()
    return tuple(-0.25 - (digest[j % len(digest)] / 64.0) for j in range(n))


@dataclass
class FakeEngine:
    """Records every plan; answers with fake_logprobs after `delay_s`; raises `fail` if set."""

    delay_s: float = 0.0
    fail: Exception | None = None
    plans: list[Plan] = field(default_factory=list)
    cancelled: int = 0
    closed: bool = False

    async def run(self, plan: Plan) -> PlanResult:
        self.plans.append(plan)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail is not None:
            raise self.fail
        return PlanResult(
            branches=tuple(BranchResult(fake_logprobs(b.input_ids, len(b.label_ids))) for b in plan.branches),
            computed_tokens=plan.unique_tokens,
            cached_tokens=0,
            timings_ms={"prefill": 1.0, "branches": 2.0},
        )

    async def close(self) -> None:
        self.closed = True
