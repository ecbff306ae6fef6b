"""The abstain rule: when the core declines to answer one question.

A question is answered by reading label probabilities; some readings are too weak to
trust. Three signals the core already measures say so:

- `label_mass`: the probability the model put on the valid answer labels at all. A low
  mass means the model did not follow the answer format for this question (it wanted to
  say something else), so the renormalised label probabilities describe little.
- `order_agreement`: where several option orders were read (rotations), the share of
  orderings whose own top option is the answer's. Below 1 the model's pick moved with
  the option order: a position preference, not a judgement.
- `confidence`: the answer's own top probability after calibration (noul: the larger of
  P(true) and P(false)). It needs no second reading, so it works at one ordering, where
  agreement cannot; it means something only where the calibration made probabilities
  honest (a fit on labelled dev data for the served model).

The rule refuses a question when any falls below its floor. A floor of 0 turns that
signal off; the default (config/sections.py) was chosen on the dev split and reported on the test
split (evals/abstain_table.py). Each face decides how to show it: OpenAI's /v1/decisions
answers `{"type": "refusal"}`, Jev's /v1/systemone (whose contract has no refusal) keeps
the answer and marks it `x_abstain`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AbstainRule:
    """Floors on the reading's label mass, order agreement and calibrated top probability,
    each in [0, 1]; 0 disables."""

    min_label_mass: float = 0.0
    min_order_agreement: float = 0.0
    min_confidence: float = 0.0

    def __post_init__(self) -> None:
        for name in ("min_label_mass", "min_order_agreement", "min_confidence"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.min_label_mass > 0.0 or self.min_order_agreement > 0.0 or self.min_confidence > 0.0

    def refuses(self, label_mass: float, order_agreement: float | None, confidence: float = 1.0) -> bool:
        """Whether a question read with this mass, agreement and (calibrated) top probability
        is declined. An agreement of None (one ordering read) cannot fail the agreement floor:
        there was nothing to agree."""
        if label_mass < self.min_label_mass or confidence < self.min_confidence:
            return True
        return order_agreement is not None and order_agreement < self.min_order_agreement

    def describe(self) -> dict[str, float]:
        return {
            "min_label_mass": self.min_label_mass,
            "min_order_agreement": self.min_order_agreement,
            "min_confidence": self.min_confidence,
        }
