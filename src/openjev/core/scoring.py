"""From label log-probs to answers: stable softmax, expectations and the vendor's confidence.

Confidence follows the formulas jevcompat checks (docs/api-jev.md):
- choice: (max p - 1/n) / (1 - 1/n)
- score:  max(0, 1 - sum_i p_i |i - k| / D), k = argmax, D = (1/n) sum_i |i - (n-1)/2|
both 1 when n == 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def softmax(logprobs: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Renormalised probabilities over the labels. -inf entries get 0.

    Raises ValueError when every entry is -inf or any is NaN/+inf (no distribution exists).
    """
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    if any(math.isnan(x) or x == math.inf for x in logprobs):
        raise ValueError(f"log-probs must be finite or -inf, got {list(logprobs)}")
    finite = [x for x in logprobs if x != -math.inf]
    if not finite:
        raise ValueError("every label has probability zero")
    top = max(finite)
    weights = [0.0 if x == -math.inf else math.exp((x - top) / temperature) for x in logprobs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def label_mass(logprobs: Sequence[float]) -> float:
    """Probability the model put on the valid labels at all (before renormalising), in [0, 1]."""
    return min(1.0, math.fsum(math.exp(x) for x in logprobs if x != -math.inf))


def argmax(probs: Sequence[float]) -> int:
    """Index of the largest probability; the first one on ties."""
    best = 0
    for i, p in enumerate(probs):
        if p > probs[best]:
            best = i
    return best


def choice_confidence(probs: Sequence[float]) -> float:
    n = len(probs)
    if n == 1:
        return 1.0
    return _clip01((max(probs) - 1.0 / n) / (1.0 - 1.0 / n))


def expectation(probs: Sequence[float]) -> float:
    """sum(i * p_i) over level indices 0..n-1."""
    return math.fsum(i * p for i, p in enumerate(probs))


def score_confidence(probs: Sequence[float]) -> float:
    n = len(probs)
    if n == 1:
        return 1.0
    k = argmax(probs)
    centre = (n - 1) / 2
    uniform_distance = math.fsum(abs(i - centre) for i in range(n)) / n
    spread = math.fsum(p * abs(i - k) for i, p in enumerate(probs))
    return _clip01(1.0 - spread / uniform_distance)


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))
