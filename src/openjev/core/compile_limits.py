"""What one request may cost while it compiles (`CompileLimits`), and the refusals
(TokensExceeded, carrying the tokens encoded before it: what the refusal cost) as soon as
the arithmetic shows a limit is passed."""

from __future__ import annotations

from dataclasses import dataclass

from openjev.core.types import DecisionRequest
from openjev.errors import TokensExceeded


@dataclass(frozen=True)
class CompileLimits:
    """What one request may cost, checked while it is compiled (see PromptCompiler.compile)."""

    max_branch_tokens: int
    max_branches: int
    max_prompt_tokens: int
    branch_limit: str = "per branch"  # what bounds a branch, in messages (the model's context, where it is less)


def first_qid(request: DecisionRequest) -> str:
    return request.questions[0][0] if request.questions else ""


def check_shared(limits: CompileLimits, request: DecisionRequest, shared: int, n_branches: int, work: int) -> None:
    """The limits known once the shared part is encoded: every branch is the shared part
    and at least one token more."""
    floor = shared + 1
    if floor > limits.max_branch_tokens:
        raise exceeded(
            f"question {first_qid(request)!r}: the state and this question take more than {shared} tokens "
            f"(limit {limits.max_branch_tokens} {limits.branch_limit})",
            work,
        )
    if n_branches * floor > limits.max_prompt_tokens:
        raise exceeded(
            f"the request's {n_branches} branches take at least {n_branches * floor} tokens in all, the "
            f"state once per branch (limit {limits.max_prompt_tokens} per request)",
            work,
        )


def exceeded(message: str, work: int) -> TokensExceeded:
    exc = TokensExceeded(message)
    exc.work_tokens = work
    return exc


def check(limits: CompileLimits, qid: str, branch: int, total: int, work: int) -> None:
    if branch > limits.max_branch_tokens:
        raise exceeded(
            f"question {qid!r}: the state and this question take {branch} tokens "
            f"(limit {limits.max_branch_tokens} {limits.branch_limit})",
            work,
        )
    if total > limits.max_prompt_tokens:
        raise exceeded(
            f"the request's branches take more than {total} tokens in all, the state once per branch "
            f"(limit {limits.max_prompt_tokens} per request)",
            work,
        )
