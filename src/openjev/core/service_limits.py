"""What the decision service holds every request to: its token budgets, in-flight cap,
deadline and readout bounds (built at the edge from the settings, api/server/assembly.py)."""

from __future__ import annotations

from dataclasses import dataclass

from openjev.core.compile_limits import CompileLimits


@dataclass(frozen=True)
class ServiceLimits:
    """Every value required: their defaults are the settings' (built at the edge, api/server/assembly.py)."""

    max_branch_tokens: int
    max_request_tokens: int
    max_in_flight: int
    engine_timeout_s: float
    retry_after_s: int
    temperature: float
    rotation_max_options: int
    max_branches: int
    max_prompt_tokens: int
    # The model's positions (None where the engine does not say): a longer branch is refused
    # while it compiles, before any engine work, as the per-branch budget is.
    context_tokens: int | None

    @property
    def branch_tokens(self) -> int:
        """The longest branch served: the budget, or the model's context where it is less."""
        if self.context_tokens is not None and self.context_tokens < self.max_branch_tokens:
            return self.context_tokens
        return self.max_branch_tokens

    def compile_limits(self) -> CompileLimits:
        by_context = self.branch_tokens < self.max_branch_tokens
        return CompileLimits(
            max_branch_tokens=self.branch_tokens,
            max_branches=self.max_branches,
            max_prompt_tokens=self.max_prompt_tokens,
            branch_limit="per branch: the model's context length" if by_context else "per branch",
        )
