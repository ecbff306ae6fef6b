"""What a plan will cost an in-process engine (transformers, llama.cpp), in seconds, measured
as it works. Shared by the families that compute on this machine; pure arithmetic.

A forward's time is modelled as `a * tokens + b * attended`, where `attended` sums, over the
forward's new tokens, the context each attends to: the dense part of a transformer costs
the same per token, attention grows with the length before it. Both rates are measured on
the engine's own forwards (exponentially smoothed): `a` on forwards whose context is short
(attention a small share; a small forward's fixed overhead weighs in little), `b` on the
others. Until a long forward was seen, `b` is `a / knee`, `knee` being the context at which
attention costs as much per token as the rest of the model: 6 x the hidden size by FLOPs
(attention's 4*d*c per token per layer against the dense layers' ~24*d^2), but measured
lower (the embedded model, hidden 576, bfloat16, on a 2-core AMD EPYC: 1.0 ms/token at
context 0, 21 ms at 32,000, a knee of about 1,600), so the prior is 2 x the hidden size: it
over-prices attention until the first long forward replaces it by the measured slope, and a
fresh server refuses at least what a measured one does.

Each engine measures `a` once at load (`warm_up`, before /health says ready), so a request
is priced from the first one on; in llama.cpp, whose attention also runs over every cell the
request holds, a decode call is a forward. `estimate_s(plan)` prices a plan before it runs (the
prefix the cache holds subtracted): the admission gate refuses what could not finish before
the engine's deadline.
"""

from __future__ import annotations

from openjev.core.plan import Plan

SMOOTHING = 0.3
KNEE_PER_HIDDEN = 2.0
FULL_WEIGHT_TOKENS = 512  # a forward of fewer tokens moves `a` less (its fixed overhead is a larger share)


def attended(start: int, count: int) -> float:
    """Sum of the contexts of `count` new tokens continuing `start` tokens."""
    return count * (start + (count - 1) / 2)


class CostModel:
    def __init__(self, hidden_size: int) -> None:
        self.knee = max(64.0, KNEE_PER_HIDDEN * hidden_size)
        self.a: float | None = None  # s per token, at no context
        self.b: float | None = None  # s per token per token of context (None: none measured)
        self.forwards = 0  # forwards measured, the warm-up's included

    def stats(self) -> dict[str, float]:
        """What prices requests now, for /metrics: forwards measured (0: nothing priced yet; 1:
        the warm-up alone), the rate per token, and whether attention's slope was measured
        (0: the prior)."""
        return {
            "pricing_forwards_measured": self.forwards,
            "pricing_seconds_per_token": self.a or 0.0,
            "pricing_attention_measured": 0.0 if self.b is None else 1.0,
        }

    def observe(self, tokens: int, context: float, seconds: float) -> None:
        """One forward: `tokens` new tokens attending to `context` positions in all."""
        if tokens <= 0 or seconds <= 0:
            return
        self.forwards += 1
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

    def tokens_within(self, seconds: float, context: int, *, least: int, most: int) -> int:
        """New tokens that continue `context` positions in about `seconds` at the measured
        rates, within [least, most] (`least` before anything was measured)."""
        if self.a is None:
            return least
        per_token = self.a + self.slope() * context
        return max(least, min(most, int(seconds / per_token)))

    def estimate_s(self, plan: Plan, cached: int = 0) -> float | None:
        """Seconds the plan's distinct tokens take to compute (`cached` leading tokens of the
        shared prefix already in the cache); None before anything was measured.

        Priced as the scheduler computes it, not by averages: the plan's trie packed into one
        sequence (packing.py), each token attending to every packed position before it (the
        tree mask hides, it does not skip), so one long question among many short ones costs
        its own length's attention, whatever the others' lengths."""
        if self.a is None:
            return None
        n = plan.unique_tokens
        cached = min(cached, plan.shared_prefix_len)
        return self.a * (n - cached) + self.slope() * attended(cached, n - cached)
