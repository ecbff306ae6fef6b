"""The lettered readouts: options lettered A, B, C ... after the question.

`letters`: one reading per question, options lettered A, B, C ...; with `rotations`
R > 1, R cyclic rotations of the options are read (evenly spaced shifts) and the
per-option probabilities averaged, which cancels the model's preference for early
letters. A score question is an ordered scale: its second ordering is the reversed
scale (a rotation would break the scale), so it has at most two.

`canonical`: parallel's sequential twin, for engines that cannot run layouts: a choice
question's options lettered once, one after another, in the same canonical order. The
answer does not depend on the caller's order (order flips are zero by construction) at
one reading's cost; the model's preference for early letters stays, but falls on options
by their text, not by where the caller put them (a calibration fit may divide it out: a
position prior). A 2-option choice is read in both of its orders (the reverse is the only
other one). noul is read as letters R=1; a scale both
ways (ascending and reversed, as letters R=2), so reversing the caller's scale mirrors its
answer: the reversed scale's two readings show the same levels at the same letters.

`mirror`: every question read in one order and its mirror image, the two averaged: a
choice's canonical order and its reverse, noul true-then-false and false-then-true, a
scale ascending and descending. Order-free like canonical, and the model's preference for
a position is cancelled to first order (the first letter of one reading is the last of
the other) instead of landing on an option by its text. A 2-option choice and a noul
with the same texts are the same two readings. Two readings per question.

Rotations apply to questions with at most `max_rotated_options` options (26 by default):
each ordering repeats the option list, so a 255-option question read four times would cost
about ten thousand tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from openjev.core import scoring, wording
from openjev.core.readouts.order import canonical_order, clones_of, shared
from openjev.core.readouts.spec import Reading, ReadoutContext, ReadoutSpec, n_options
from openjev.core.types import ChoiceQuestion, Combined, Question, ScoreQuestion


class LettersReadout:
    def __init__(
        self,
        labels: Sequence[str],
        label_ids: Sequence[int],
        *,
        rotations: int = 1,
        temperature: float = 1.0,
        max_rotated_options: int = 26,
        canonical: bool = False,
        mirror: bool = False,
    ) -> None:
        # canonical: a choice's options in canonical_order, read once (the `canonical` readout);
        # mirror: every question in that order and its reverse (the `mirror` readout)
        name = "mirror" if mirror else "canonical" if canonical else "letters"
        self.spec = ReadoutSpec(name, rotations)
        self._canonical = canonical or mirror
        self._mirror = mirror
        self._labels = tuple(labels)
        self._ids = tuple(label_ids)
        self._temperature = temperature
        # Each ordering repeats the whole option list: past this many options the extra
        # readings cost more than the question (255 options x 4 = ~10k tokens), so one.
        self._max_rotated = max_rotated_options

    def orders(self, question: Question) -> list[tuple[int, ...]]:
        """The option orders read: position j of ordering k shows option orders[k][j]."""
        n = n_options(question)
        ascending = tuple(range(n))
        if self._canonical and isinstance(question, ChoiceQuestion):
            first = canonical_order(question)
            # two options: the reverse is the only other order, so canonical reads both (as a scale)
            both = (self._mirror or n == 2) and 1 < n <= self._max_rotated
            return [first, first[::-1]] if both else [first]
        if n > self._max_rotated:
            return [ascending]
        if self._mirror:
            return [ascending, ascending[::-1]] if n > 1 else [ascending]
        if isinstance(question, ScoreQuestion):
            both = self.spec.rotations > 1 or self._canonical
            return [ascending, ascending[::-1]] if both else [ascending]
        r = min(self.spec.rotations, n)
        shifts = [(k * n) // r for k in range(r)]  # evenly spaced, distinct since r <= n
        return [tuple((s + j) % n for j in range(n)) for s in shifts]

    def count(self, question: Question) -> int:
        n = n_options(question)
        if self._mirror:
            return 2 if 1 < n <= self._max_rotated else 1
        if n > self._max_rotated:
            return 1
        if isinstance(question, ScoreQuestion):
            return 2 if self.spec.rotations > 1 or self._canonical else 1
        if self._canonical and isinstance(question, ChoiceQuestion):
            return 2 if n == 2 else 1
        return min(self.spec.rotations, n)

    def reading(self, question: Question, k: int) -> Reading:
        return Reading(
            wording.letters_text(question, self.orders(question)[k], self._labels), self._ids[: n_options(question)]
        )

    def readings(self, question: Question) -> list[Reading]:
        n = n_options(question)
        return [
            Reading(wording.letters_text(question, order, self._labels), self._ids[:n])
            for order in self.orders(question)
        ]

    def combine(self, question: Question, logprobs: Sequence[Sequence[float]]) -> Combined:
        orders = self.orders(question)
        n = n_options(question)
        per_order: list[list[float]] = []
        for order, lp in zip(orders, logprobs, strict=True):
            shown = scoring.softmax(lp, self._temperature)
            probs = [0.0] * n
            for position, option in enumerate(order):
                probs[option] = shown[position]
            per_order.append(probs)
        mean = [math.fsum(p[i] for p in per_order) / len(per_order) for i in range(n)]
        clones: tuple[tuple[int, ...], ...] = ()
        if self._canonical and isinstance(question, ChoiceQuestion):
            clones = clones_of(question)
            mean = shared(mean, clones)
        mass = math.fsum(scoring.label_mass(lp) for lp in logprobs) / len(logprobs)
        top = scoring.argmax(mean)
        agreement = sum(scoring.argmax(p) == top for p in per_order) / len(per_order) if len(per_order) > 1 else None
        mirrored = len(orders) == 2 and orders[1] == orders[0][::-1]
        lettered = orders[0] if len(orders) == 1 or mirrored else None
        return Combined(tuple(mean), mass, agreement, lettered, clones, mirrored)


def build(spec: ReadoutSpec, context: ReadoutContext) -> LettersReadout:
    """`letters`, `canonical` or `mirror` as `spec` names it, for the model of `context`."""
    return LettersReadout(
        context.labels,
        context.label_ids,
        rotations=spec.rotations,
        temperature=context.temperature,
        max_rotated_options=context.max_rotated_options,
        canonical=spec.name == "canonical",
        mirror=spec.name == "mirror",
    )
