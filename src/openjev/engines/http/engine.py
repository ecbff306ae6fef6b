"""The engine port over an HTTP engine server, one class for every protocol it speaks:
SGLang's native one (SGLang, SGLang-JAX; sglang_protocol.SGLANG) and vLLM's token route
(vllm_protocol.VLLM). What differs between them is data, an `HTTPProtocol`.

Submission order (submission.py) makes the server's radix cache compute each shared prefix
once. A stage's branches go in one call where the protocol batches (`batch_body`), else
one call per branch. Calls in flight are capped for the whole server; a failing call
cancels its siblings, and whatever is still running when a request is cancelled
(deadline, client gone) is aborted on the server with `/abort_request`, every branch of a
batched call by its rid. A server that cannot be reached
(refused, reset, killed mid-call) is a retryable 503 with Retry-After; one that accepts
and never answers is cut off by the request's deadline (504) and its calls aborted.

The wire shapes are sglang_protocol.py's and vllm_protocol.py's; the start-up wiring is remote.py's,
sglang.py's and vllm.py's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from openjev.config import LimitSettings, RemoteSettings
from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, Engine, PlanResult
from openjev.engines.http.coalesce import Coalescer
from openjev.engines.http.protocol import HTTPProtocol, Item, Reply, computed, json_of
from openjev.engines.http.submission import CallCosts, RecentPrefixes, choose, execute, first_error, together
from openjev.errors import EngineError, EngineTimeout, EngineUnavailable, TokensExceeded

if TYPE_CHECKING:
    from openjev.engines.http.server_process import ServerProcess

log = logging.getLogger(__name__)


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
        strategy: str = RemoteSettings.strategy,  # the defaults are the settings' (config/sections.py)
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
        self.step_tokens = step_tokens  # the most the server prefills per scheduling step, if known
        self.strategy = strategy
        self._max_calls = max_calls
        self._timeout = httpx.Timeout(call_timeout_s, connect=10.0)
        self._warmup_min = warmup_min_tokens
        self._stage_min = stage_min_tokens
        self._transport = transport
        self._retry_after = {"Retry-After": str(max(1, int(retry_after_s)))}
        self._probe_timeout_s = probe_timeout_s
        self._last_reply = -math.inf  # time.monotonic() of the server's last answer to a call
        self._last_unreachable = -math.inf  # ... and of the last call that could not reach it
        self._calls = self._calls_in_flight = 0
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self.recent = RecentPrefixes()
        self.costs = CallCosts()  # what a call costs this server, from the calls made (auto's choice)
        self.strategies_used: dict[str, int] = {}
        self._aborts: set[asyncio.Task] = set()  # fire-and-forget aborts, kept alive until done
        # concurrent requests' stages in shared calls, where the protocol reads a call by parts
        self.coalescer = (
            Coalescer(
                self._shared_call,
                lambda rids: self._abort([protocol.abort_body(r) for r in rids]),
                depth=coalesce_calls,
            )
            if coalesce_calls > 0 and protocol.parse_batch_parts is not None and protocol.batch_body is not None
            else None
        )
        self.process: ServerProcess | None = None  # the child server, when we started it (stopped on close)

    def _http(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        # Created on first use, inside the serving event loop.
        if self._client is None or self._slots is None:
            self._client = httpx.AsyncClient(
                base_url=self.url,
                timeout=self._timeout,
                transport=self._transport,
                limits=httpx.Limits(max_connections=self._max_calls, max_keepalive_connections=self._max_calls),
            )
            self._slots = asyncio.Semaphore(self._max_calls)
        return self._client, self._slots

    async def close(self) -> None:
        if self._aborts:
            await asyncio.gather(*self._aborts, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)

    async def probe(self) -> str | None:
        """Whether the server answers now: None if it does, else why not (for our /health,
        which is public: the reason names no address; the log has it). A reply to any call
        within the last `probe_timeout_s` counts (a busy CPU server answers /health slowly)
        unless a call has failed to reach the server since; otherwise GET /health must say
        200 within `probe_timeout_s`."""
        if self._last_reply > self._last_unreachable and time.monotonic() - self._last_reply < self._probe_timeout_s:
            return None
        client, _ = self._http()
        try:
            r = await client.get(self.protocol.health_path, timeout=self._probe_timeout_s)
        except httpx.TimeoutException:
            return f"the engine server did not answer within {self._probe_timeout_s:g} s"
        except httpx.TransportError as e:
            log.warning("engine health probe of %s failed: %r", self.url, e)
            return "the engine server cannot be reached"
        return None if r.status_code == 200 else f"the engine server's health check answered {r.status_code}"

    async def run(self, plan: Plan) -> PlanResult:
        longest = max(len(b) for b in plan.branches)
        if self.max_prompt_tokens is not None and longest > self.max_prompt_tokens:
            raise self._too_long(longest)  # before any call: no branch of a refused plan is computed
        strategy = self._strategy(plan)
        self.strategies_used[strategy] = self.strategies_used.get(strategy, 0) + 1
        results: list[BranchResult | None] = [None] * len(plan.branches)
        totals = {"prompt": 0, "cached": 0, "known": True}
        t0 = time.perf_counter()
        first_done: list[float] = []

        def account(prompt: int | None, cached: int | None) -> None:
            if prompt is None or cached is None:
                totals["known"] = False
            else:
                totals["prompt"] += prompt
                totals["cached"] += cached
            if not first_done:
                first_done.append(time.perf_counter())

        async def branch(i: int) -> None:
            b = plan.branches[i]
            values, prompt, cached = await self._generate(b.input_ids, b.label_ids, plan.cache_namespace)
            results[i] = BranchResult(values)
            account(prompt, cached)

        async def batch(indices: Sequence[int], shared: bool) -> None:
            items = [(plan.branches[i].input_ids, plan.branches[i].label_ids) for i in indices]
            salt = plan.cache_namespace
            got = await (
                self.coalescer.submit(items, salt) if shared and self.coalescer else self._call_batch(items, salt)
            )
            for i, (values, prompt, cached) in zip(indices, got, strict=True):
                results[i] = BranchResult(values)
                account(prompt, cached)

        async def branches(indices: Sequence[int]) -> None:
            groups = self._groups(plan, indices)
            shared = self._shares_calls(plan, groups)
            await together([batch(g, shared) if len(g) > 1 or shared else branch(g[0]) for g in groups])

        async def prefix(tokens: Sequence[int]) -> None:
            # Any label id will do: the point is a selected-logprob request (sglang#34719).
            _, prompt, cached = await self._generate(tokens, plan.branches[0].label_ids[:1], plan.cache_namespace)
            account(prompt, cached)

        try:
            await execute(strategy, plan, branches, prefix, stage_min_tokens=self._stage_min)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        self.recent.add(plan.root.tokens, plan.cache_namespace)
        t2 = time.perf_counter()
        t1 = first_done[0] if first_done else t2
        computed = totals["prompt"] - totals["cached"] if totals["known"] else None
        return PlanResult(
            branches=tuple(results),  # type: ignore[arg-type]
            computed_tokens=computed,
            cached_tokens=totals["cached"] if totals["known"] else None,
            timings_ms={"prefill": (t1 - t0) * 1000, "branches": (t2 - t1) * 1000},
        )

    def _strategy(self, plan: Plan) -> str:
        if self.strategy == "auto" and self.protocol.shares_prefix_within_a_batch:
            return "all"
        return choose(
            self.strategy,
            plan,
            self.recent,
            warmup_min_tokens=self._warmup_min,
            batched=self.protocol.batch_body is not None,
            step_tokens=self.step_tokens,
            stage_min_tokens=self._stage_min,
            costs=self.costs.estimate() if self.protocol.batch_body is not None else None,
        )

    def _shares_calls(self, plan: Plan, groups: Sequence[Sequence[int]]) -> bool:
        """Whether these calls of `plan` go through the coalescer: where there is one, and
        each call is a batch the protocol takes whole (not a lone branch whose labels are
        split over calls, not a namespace the batch form would drop)."""
        per_call = self.protocol.max_ids_per_call
        return (
            self.coalescer is not None
            and (not plan.cache_namespace or self.protocol.batch_keeps_namespace)
            and all(per_call is None or len(plan.branches[g[0]].label_ids) <= per_call for g in groups if len(g) == 1)
        )

    def _too_long(self, tokens: int) -> TokensExceeded:
        return TokensExceeded(
            f"a branch of {tokens} tokens exceeds the {self.protocol.name} server's context "
            f"({self.max_prompt_tokens} prompt tokens; raise its {self.protocol.context_flag})"
        )

    async def _generate(self, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "") -> Reply:
        """(label log-probs, prompt tokens, cached tokens) of one branch, in the cache
        namespace `salt` (Plan.cache_namespace)."""
        if self.max_prompt_tokens is not None and len(input_ids) > self.max_prompt_tokens:
            raise self._too_long(len(input_ids))
        per_call = self.protocol.max_ids_per_call
        if per_call is None or len(label_ids) <= per_call:
            return await self._call(input_ids, label_ids, salt)
        values: list[float] = []
        prompt: int | None = 0
        cached: int | None = 0
        # More labels than one call takes: the next call finds this call's prompt in the cache.
        for start in range(0, len(label_ids), per_call):
            v, p, c = await self._call(input_ids, label_ids[start : start + per_call], salt)
            values.extend(v)
            prompt = None if prompt is None or p is None else prompt + p
            cached = None if cached is None or c is None else cached + c
        return tuple(values), prompt, cached

    def _groups(self, plan: Plan, indices: Sequence[int]) -> list[list[int]]:
        """The calls these branches (sent together) go in, as lists of branch indices: all
        in one where the protocol batches (keeping the plan's cache namespace, if it has
        one), else one each. A branch whose labels need splitting over calls goes alone;
        where a call asks every item for the union of labels, a new call starts before
        that union would pass max_ids_per_call."""
        p, per_call = self.protocol, self.protocol.max_ids_per_call
        if p.batch_body is None or (plan.cache_namespace and not p.batch_keeps_namespace):
            return [[i] for i in indices]
        if per_call is None:
            return [list(indices)]
        labels = {i: plan.branches[i].label_ids for i in indices}
        groups = [[i] for i in indices if len(labels[i]) > per_call]
        current: list[int] = []
        union: set[int] = set()
        for i in (i for i in indices if len(labels[i]) <= per_call):
            wider = union | set(labels[i]) if p.batch_shares_labels else union
            if current and len(wider) > per_call:
                groups.append(current)
                current, wider = [], set(labels[i])
            current.append(i)
            union = wider
        return [*groups, current] if current else groups

    async def _call(self, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "") -> Reply:
        """One branch in one call, its reply validated."""
        rid = uuid.uuid4().hex
        body = self.protocol.request_body(rid, input_ids, label_ids, salt)
        ticket, t0 = self.costs.begin(), time.perf_counter()
        replies: list[Reply] = []
        try:
            payload = await self._post(self.protocol.generate_path, body, [self.protocol.abort_body(rid)])
            replies.append(self.protocol.parse_reply(payload, label_ids))
        finally:
            self.costs.end(ticket, computed(replies), time.perf_counter() - t0)
        return replies[0]

    async def _call_batch(self, items: Sequence[tuple[Sequence[int], Sequence[int]]], salt: str) -> list[Reply]:
        """Many branches in one call (protocol.batch_body), one Reply each, in order."""
        parse = self.protocol.parse_batch_reply
        if parse is None:
            raise ValueError(f"the {self.protocol.name} protocol has no batched calls")
        rids = [uuid.uuid4().hex for _ in items]  # (run refused any branch too long before a call)

        def read(payload: object) -> tuple[list[Reply], list[Reply]]:
            return (replies := parse(payload, rids, [lb for _, lb in items])), replies

        return await self._batched(rids, items, salt, read)

    async def _shared_call(self, parts: Sequence[tuple[Sequence[str], Sequence[Item]]], salt: str) -> list:
        """One batched call carrying several requests' parts (coalesce.py): per part, its
        replies or the EngineError that fails it; raises what fails the call as a whole."""
        parse = self.protocol.parse_batch_parts
        if parse is None:
            raise ValueError(f"the {self.protocol.name} protocol does not share batched calls")
        rids = [rid for part_rids, _ in parts for rid in part_rids]
        items = [item for _, part_items in parts for item in part_items]

        def read(payload: object) -> tuple[list, list[Reply]]:
            got = parse(payload, [r for r, _ in parts], [[lb for _, lb in its] for _, its in parts])
            whole = not any(isinstance(g, BaseException) for g in got)  # else the cost is not known
            return got, [r for g in got for r in g] if whole else []

        return await self._batched(rids, items, salt, read)

    async def _batched(self, rids: Sequence[str], items: Sequence[Item], salt: str, read: Callable) -> Any:
        """One batch_body call of `items` (named by `rids`), aborted whole where cancelled;
        `read(reply)` gives (the result, the replies the cost model learns from)."""
        p = self.protocol
        if p.batch_body is None:
            raise ValueError(f"the {p.name} protocol has no batched calls")
        aborts = p.batch_abort_bodies(rids) if p.batch_abort_bodies else [p.abort_body(rid) for rid in rids]
        ticket, t0 = self.costs.begin(), time.perf_counter()
        learned: list[Reply] = []
        try:
            payload = await self._post(p.batch_path or p.generate_path, p.batch_body(rids, items, salt), aborts)
            result, learned = read(payload)
        finally:
            self.costs.end(ticket, computed(learned), time.perf_counter() - t0)
        return result

    async def _post(self, path: str, body: dict, aborts: Sequence[dict]) -> object:
        """One call: capped by the server-wide slots, aborted server-side (the `aborts`
        bodies, which name every item in it) when cancelled or timed out, overload and
        outage mapped to retryable errors; the reply's JSON."""
        client, slots = self._http()
        async with slots:
            self._calls += 1
            self._calls_in_flight += 1
            try:
                # orjson, not httpx's json=: a call carries every branch's token ids, and the
                # stdlib's encoder was a tenth of this process's work per request (bench_sglang_own --tiny)
                response = await client.post(path, content=orjson.dumps(body), headers=_JSON)
            except asyncio.CancelledError:
                self._abort(aborts)
                raise
            except httpx.TimeoutException:
                self._abort(aborts)
                raise EngineTimeout(f"the engine did not answer within {self._timeout.read:g} s") from None
            except httpx.TransportError as e:
                # Refused, reset, or closed mid-call (the server died): nothing to abort.
                self._last_unreachable = time.monotonic()
                raise EngineUnavailable(
                    "cannot reach the engine", detail=f"{self.url}: {e!r}", headers=self._retry_after
                ) from None
            finally:
                self._calls_in_flight -= 1
        self._last_reply = time.monotonic()
        if response.status_code in (429, 503):
            retry = response.headers.get("retry-after", "").strip()
            retry = retry if retry.isdigit() else ""  # a number of seconds, or nothing of the backend's
            raise EngineUnavailable(
                f"the engine is busy ({response.status_code})", headers={"Retry-After": retry} if retry else None
            )
        if response.status_code >= 400:
            raise EngineError(
                f"the engine answered {response.status_code}", detail=f"{self.url}: {response.text[:300]!r}"
            )
        return json_of(response.content)

    def stats(self) -> dict[str, float]:
        """The HTTP calls made to the server (one per branch, or one per batched stage) and
        those in flight now (at most --max-engine-calls)."""
        out: dict[str, float] = {"engine_http_calls": self._calls, "engine_http_calls_in_flight": self._calls_in_flight}
        if self.coalescer is not None:
            out["engine_shared_calls"] = self.coalescer.calls
            out["engine_shared_call_parts"] = self.coalescer.parts
        return out

    def _abort(self, bodies: Sequence[dict]) -> None:
        """Post every abort body (fire and forget: the caller is already leaving): one per
        rid for SGLang, whose /abort_request takes one; one per call for vLLM's, which takes
        a list."""
        client = self._client
        if client is None:
            return

        async def abort(body: dict) -> None:
            try:
                await client.post(self.protocol.abort_path, json=body, timeout=5.0)
            except httpx.HTTPError as e:
                log.warning("abort %s failed: %s", body, e)

        async def abort_all() -> None:
            await asyncio.gather(*(abort(body) for body in bodies))

        task = asyncio.get_running_loop().create_task(abort_all())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


_JSON = {"content-type": "application/json"}
