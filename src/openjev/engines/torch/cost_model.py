"""What a plan will cost the in-process engine, in seconds, measured as it works.

A forward's time is modelled as `a * tokens + b * attended`, where `attended` sums, over the
forward's new tokens, the context each attends to: the dense part of a transformer costs
the same per token, attention grows with the length before it. Both rates are measured on
the engine's own forwards (exponentially smoothed): `a` on forwards whose context is short
(attention a small share; a small forward's fixed overhead weighs in little), `b` on the
others. Until a long forward was seen, `b` is `a / knee`, `knee` being the context at which
attention costs as much per token as the rest of the model: 6 x the hidden size by FLOPs
(attention's 4*d*c per token per layer against the dense layers' ~24*d^2). Measured on a
2-core AMD EPYC with the embedded model (hidden 576, bfloat16): 1.0 ms/token at context
0, 21 ms at 32,000, a knee of about 1,600 against the prior's 3,456; `a` measured on small
requests' forwards runs high by their fixed overhead, which the prior's lower slope about
offsets, and the first long forward replaces the prior by the measured slope.

`estimate_s(plan)` prices a plan before it runs (the prefix the cache holds subtracted):
the admission gate refuses what could not finish before the engine's deadline.
"""

from __future__ import annotations

from openjev.core.plan import Plan

SMOOTHING = 0.3
FULL_WEIGHT_TOKENS = 512  # a forward of fewer tokens moves `a` less (its fixed overhead is a larger share)


def attended(start: int, count: int) -> float:
    """Sum of the contexts of `count` new tokens continuing `start` tokens."""
    return count * (start + (count - 1) / 2)


class CostModel:
    def __init__(self, hidden_size: int) -> None:
        self.knee = max(64.0, 6.0 * hidden_size)
        self.a: float | None = None  # s per token, at no context
        self.b: float | None = None  # s per token per token of context (None: none measured)

    def observe(self, tokens: int, context: float, seconds: float) -> None:
        """One forward: `tokens` new tokens attending to `context` positions in all."""
        if tokens <= 0 or seconds <= 0:
            return
        if context <= tokens * self.knee / 4 or self.a is None:
            b = self.slope()
            a = (
                max(1e-9, (seconds - b * context) / tokens)
                if self.a is not None
                else seconds / (tokens + context / self.knee)
            )
            weight = SMOOTHING * min(1.0, tokens / FULL_WEIGHT_TOKENS)
            self.a = a if self.a is None else (1 - weight) * self.a + weight * a
            return
        b = max(0.0, (seconds - self.a * tokens) / context)
        self.b = b if self.b is None else (1 - SMOOTHING) * self.b + SMOOTHING * b

    def slope(self) -> float:
        if self.b is not None:
            return self.b
        return (self.a or 0.0) / self.knee

    def estimate_s(self, plan: Plan, cached: int = 0) -> float | None:
        """Seconds the plan's distinct tokens take to compute (`cached` leading tokens of the
        shared prefix already in the cache); None before anything was measured."""
        if self.a is None:
            return None
        prefix = plan.shared_prefix_len
        cached = min(cached, prefix)
        own = plan.unique_tokens - prefix
        branches = max(1, len(plan.branches))
        mean_own = own / branches
        context = attended(cached, prefix - cached) + own * (prefix + (mean_own - 1) / 2)
        return self.a * (plan.unique_tokens - cached) + self.slope() * context
