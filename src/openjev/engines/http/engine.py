"""The engine port over an HTTP engine server, one class for every protocol it speaks:
SGLang's native one (SGLang, SGLang-JAX; sglang_protocol.SGLANG) and vLLM's token route
(vllm_protocol.VLLM). What differs between them is data, an `HTTPProtocol`.

Submission order (submission.py) makes the server's radix cache compute each shared prefix
once. A stage's branches go in one call where the protocol batches (`batch_body`), else
one call per branch; a failing call cancels its siblings. The engine is three parts:
planning the calls (planning.py), making them and reading the replies (calls.py), sending
them (sender.py: the server-wide cap, failures mapped to the API's errors, aborts of what
a cancelled request left running).

The wire shapes are sglang_protocol.py's and vllm_protocol.py's; the start-up wiring is remote.py's,
sglang.py's and vllm.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx

from openjev.config import LimitSettings, RemoteSettings
from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, Engine, PlanResult
from openjev.engines.http.calls import Calls
from openjev.engines.http.coalesce import Coalescer
from openjev.engines.http.planning import CallPlanner
from openjev.engines.http.protocol import HTTPProtocol, Reply
from openjev.engines.http.sender import Sender
from openjev.engines.http.submission import RecentPrefixes, execute, first_error, together

if TYPE_CHECKING:
    from openjev.engines.http.server_process import ServerProcess


class HTTPEngine(Engine):
    """Engine port over a running engine server at `url` that speaks `protocol`."""

    parallel_layouts = False  # the servers read one sequence per branch

    def __init__(
        self,
        url: str,
        protocol: HTTPProtocol,
        *,
        max_prompt_tokens: int | None = None,
        step_tokens: int | None = None,
        strategy: str = RemoteSettings.strategy,  # the defaults are the settings' (config/engines.py)
        max_calls: int = RemoteSettings.max_engine_calls,
        call_timeout_s: float = LimitSettings.engine_timeout_s,
        warmup_min_tokens: int = RemoteSettings.warmup_min_tokens,
        coalesce_calls: int = RemoteSettings.coalesce_calls,
        stage_min_tokens: int = 32,
        retry_after_s: int = LimitSettings.retry_after_s,
        probe_timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.protocol = protocol
        self.max_prompt_tokens = max_prompt_tokens  # the server's context less one generated token, if known
        self.sender = Sender(
            self.url,
            protocol,
            max_calls=max_calls,
            call_timeout_s=call_timeout_s,
            retry_after_s=retry_after_s,
            probe_timeout_s=probe_timeout_s,
            transport=transport,
        )
        self.calls = Calls(protocol, self.sender, max_prompt_tokens)
        self.costs = self.calls.costs
        self.recent = RecentPrefixes()
        self.planner = CallPlanner(
            protocol, strategy, warmup_min_tokens, stage_min_tokens, step_tokens, self.recent, self.costs
        )
        self.strategies_used: dict[str, int] = {}
        # concurrent requests' stages in shared calls, where the protocol reads a call by parts
        shares = coalesce_calls > 0 and protocol.parse_batch_parts is not None and protocol.batch_body is not None
        self.coalescer = Coalescer(self.calls.shared, self.calls.abort, depth=coalesce_calls) if shares else None
        self.process: ServerProcess | None = None  # the child server, when we started it (stopped on close)

    @property
    def step_tokens(self) -> int | None:
        """The most the server prefills per scheduling step, if known."""
        return self.planner.step_tokens

    @property
    def strategy(self) -> str:
        return self.planner.strategy

    async def close(self) -> None:
        await self.sender.close()
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)

    async def probe(self) -> str | None:
        """Whether the server answers now: None if it does, else why not (Sender.probe)."""
        return await self.sender.probe()

    async def run(self, plan: Plan) -> PlanResult:
        longest = max(len(b) for b in plan.branches)
        if self.max_prompt_tokens is not None and longest > self.max_prompt_tokens:
            raise self.calls.too_long(longest)  # before any call: no branch of a refused plan is computed
        strategy = self.planner.strategy_of(plan)
        self.strategies_used[strategy] = self.strategies_used.get(strategy, 0) + 1
        tally = _Tally(len(plan.branches))
        salt, share = plan.cache_namespace, plan.share  # its calls' namespace and turn at the slots (slots.py)

        async def batch(indices: Sequence[int], shared: bool) -> None:
            items = [(plan.branches[i].input_ids, plan.branches[i].label_ids) for i in indices]
            if len(items) == 1 and not shared:
                tally.add(indices, [await self.calls.generate(*items[0], salt, share)])
                return
            coalescer = self.coalescer if shared else None
            call = coalescer.submit(items, salt, share) if coalescer else self.calls.batch(items, salt, share)
            tally.add(indices, await call)

        async def branches(indices: Sequence[int]) -> None:
            groups = self.planner.groups(plan, indices)
            shared = self.coalescer is not None and self.planner.shares_calls(plan, groups)
            await together([batch(g, shared) for g in groups])

        async def prefix(tokens: Sequence[int]) -> None:
            # Any label id will do: the point is a selected-logprob request (sglang#34719).
            tally.add((), [await self.calls.generate(tokens, plan.branches[0].label_ids[:1], salt, share)])

        try:
            await execute(strategy, plan, branches, prefix, stage_min_tokens=self.planner.stage_min_tokens)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        self.recent.add(plan.root.tokens, plan.cache_namespace)
        return tally.result()

    def stats(self) -> dict[str, float]:
        """The HTTP calls made to the server (one per branch, or one per batched stage) and
        those in flight now (at most --max-engine-calls)."""
        out: dict[str, float] = {
            "engine_http_calls": self.sender.calls,
            "engine_http_calls_in_flight": self.sender.calls_in_flight,
        }
        if self.coalescer is not None:
            out["engine_shared_calls"] = self.coalescer.calls
            out["engine_shared_call_parts"] = self.coalescer.parts
        return out


class _Tally:
    """What a plan's calls answered: each branch's log-probs, the prompt and cached tokens
    the replies report (unknown once one does not), when the first answer came."""

    def __init__(self, n: int) -> None:
        self.results: list[BranchResult | None] = [None] * n
        self.prompt = self.cached = 0
        self.known = True
        self.t0 = time.perf_counter()
        self.first: float | None = None

    def add(self, indices: Sequence[int], replies: Sequence[Reply]) -> None:
        """The replies of a call, in order, for the branches `indices` (none: a prefix's)."""
        for k, (values, prompt, cached) in enumerate(replies):
            if k < len(indices):
                self.results[indices[k]] = BranchResult(values)
            if prompt is None or cached is None:
                self.known = False
            else:
                self.prompt += prompt
                self.cached += cached
            if self.first is None:
                self.first = time.perf_counter()

    def result(self) -> PlanResult:
        t2 = time.perf_counter()
        t1 = self.first if self.first is not None else t2
        return PlanResult(
            branches=tuple(self.results),  # type: ignore[arg-type]
            computed_tokens=self.prompt - self.cached if self.known else None,
            cached_tokens=self.cached if self.known else None,
            timings_ms={"prefill": (t1 - self.t0) * 1000, "branches": (t2 - t1) * 1000},
        )
