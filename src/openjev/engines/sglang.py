"""The production engine: SGLang's native HTTP API (SGLang on GPUs, SGLang-JAX on TPUs).

Each branch is one `POST /generate` with its token ids, one new token, and the
log-probabilities of the label ids (`token_ids_logprob`) at the last prompt position
(`logprob_start_len: -1`). Replies are read by token id, never by position, and
validated. Every call asks for selected-token log-probs, warm-ups included: batches that
mix logprob and non-logprob requests crash SGLang 0.5.19 (sgl-project/sglang#34719).

Submission order (submission.py) makes SGLang's radix cache compute each shared prefix
once. Calls in flight are capped for the whole server; a failing branch cancels its
siblings, and whatever is still running when a request is cancelled (deadline, client
gone) is aborted on the server with `/abort_request`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, PlanResult
from openjev.engines.submission import RecentPrefixes, choose, execute
from openjev.errors import EngineError, EngineTimeout, EngineUnavailable, OpenjevError

log = logging.getLogger(__name__)


def parse_reply(body: Any, label_ids: Sequence[int]) -> tuple[tuple[float, ...], int | None, int | None]:
    """(label log-probs aligned with `label_ids`, prompt_tokens, cached_tokens) from a
    /generate reply; raises EngineError for anything unusable."""
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise EngineError("the engine's reply has no meta_info")
    meta = body["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise EngineError("the engine aborted the request", detail=str(finish.get("message") or finish))
    completion = meta.get("completion_tokens")
    if completion is not None and completion != 1:
        raise EngineError("the engine's reply is unusable", detail=f"{completion} tokens generated, expected 1")
    steps = meta.get("output_token_ids_logprobs")
    if not isinstance(steps, list) or not steps or not isinstance(steps[0], list):
        raise EngineError("the engine's reply has no output_token_ids_logprobs (is token_ids_logprob supported?)")
    by_id: dict[int, float] = {}
    for entry in steps[0]:
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise EngineError("the engine's reply is unusable", detail=f"malformed log-prob entry {entry!r}")
        value, token = entry[0], entry[1]
        # orjson writes -inf as null
        by_id[int(token)] = -math.inf if value is None else float(value)
    missing = [t for t in label_ids if t not in by_id]
    if missing:
        raise EngineError("the engine's reply is unusable", detail=f"no log-probs for label tokens {missing}")
    values = tuple(by_id[t] for t in label_ids)
    if any(math.isnan(v) or v == math.inf for v in values):
        raise EngineError("the engine's reply is unusable", detail=f"non-finite log-probs {values}")
    if all(v == -math.inf for v in values):
        raise EngineError("the engine gave every label probability zero")
    prompt = meta.get("prompt_tokens")
    cached = meta.get("cached_tokens")  # the Rust frontend omits it
    return values, (int(prompt) if prompt is not None else None), (int(cached) if cached is not None else None)


class SGLangEngine:
    """Engine port over a running SGLang-protocol server at `url`."""

    def __init__(
        self,
        url: str,
        *,
        strategy: str = "auto",
        max_calls: int = 64,
        call_timeout_s: float = 120.0,
        warmup_min_tokens: int = 256,
        stage_min_tokens: int = 32,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.strategy = strategy
        self._max_calls = max_calls
        self._timeout = httpx.Timeout(call_timeout_s, connect=10.0)
        self._warmup_min = warmup_min_tokens
        self._stage_min = stage_min_tokens
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self.recent = RecentPrefixes()
        self.strategies_used: dict[str, int] = {}
        self._aborts: set[asyncio.Task] = set()  # fire-and-forget aborts, kept alive until done
        self.process = None  # the child server, when we started it (stopped on close)

    def _http(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        # Created on first use, inside the serving event loop.
        if self._client is None:
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

    # Whether the server lets requests admitted in the same scheduling step share a prefix
    # (then `auto` never needs to stage). SGLang: no, its radix cache takes a prefix once
    # the request that computed it is done.
    shares_prefix_within_a_batch = False

    async def run(self, plan: Plan) -> PlanResult:
        if self.strategy == "auto" and self.shares_prefix_within_a_batch:
            strategy = "all"
        else:
            strategy = choose(self.strategy, plan, self.recent, warmup_min_tokens=self._warmup_min)
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

        async def prefix(tokens: Sequence[int]) -> None:
            # Any label id will do: the point is a selected-logprob request (sglang#34719).
            _, prompt, cached = await self._generate(tokens, plan.branches[0].label_ids[:1], plan.cache_namespace)
            account(prompt, cached)

        try:
            await execute(strategy, plan, branch, prefix, stage_min_tokens=self._stage_min)
        except BaseExceptionGroup as group:
            raise _first_error(group) from None
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

    # The wire protocol, in four parts a subclass for another server overrides (vllm.py):
    # where a call goes, its body, how to abort it, how to read its reply.
    generate_path = "/generate"
    abort_path = "/abort_request"

    def _request_body(self, rid: str, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "") -> dict:
        body = {
            "input_ids": list(input_ids),
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": -1,
            "token_ids_logprob": list(label_ids),
            "return_text_in_logprobs": False,
            "rid": rid,
        }
        if salt:  # the radix cache's namespace (GenerateReqInput.extra_key; api/tenancy.py)
            body["extra_key"] = salt
        return body

    def _abort_body(self, rid: str) -> dict:
        return {"rid": rid}

    def _parse(self, payload, label_ids: Sequence[int]):
        return parse_reply(payload, label_ids)

    async def _generate(self, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = ""):
        """(label log-probs, prompt tokens, cached tokens) of one branch, in the cache
        namespace `salt` (Plan.cache_namespace)."""
        return await self._call(input_ids, label_ids, salt)

    async def _call(self, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = ""):
        """One call: capped by the server-wide slots, aborted server-side when cancelled or
        timed out, overload and outage mapped to retryable errors, the reply validated."""
        client, slots = self._http()
        rid = uuid.uuid4().hex
        async with slots:
            try:
                response = await client.post(
                    self.generate_path, json=self._request_body(rid, input_ids, label_ids, salt)
                )
            except asyncio.CancelledError:
                self._abort(rid)
                raise
            except httpx.TimeoutException:
                self._abort(rid)
                raise EngineTimeout(f"the engine did not answer within {self._timeout.read:g} s") from None
            except httpx.TransportError as e:
                raise EngineUnavailable("cannot reach the engine", detail=f"{self.url}: {e!r}") from None
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
        try:
            payload = response.json()
        except ValueError:
            raise EngineError("the engine's reply is not JSON") from None
        return self._parse(payload, label_ids)

    def _abort(self, rid: str) -> None:
        """Ask the server to drop `rid` (fire and forget: the caller is already leaving)."""
        client = self._client

        async def abort() -> None:
            try:
                await client.post(self.abort_path, json=self._abort_body(rid), timeout=5.0)
            except httpx.HTTPError as e:
                log.warning("abort of %s failed: %s", rid, e)

        if client is not None:
            task = asyncio.get_running_loop().create_task(abort())
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to report for a failed request: ours if any, else the first."""
    flat: list[BaseException] = []

    def walk(g: BaseExceptionGroup) -> None:
        for e in g.exceptions:
            walk(e) if isinstance(e, BaseExceptionGroup) else flat.append(e)

    walk(group)
    return next((e for e in flat if isinstance(e, OpenjevError)), flat[0])


# ---- wiring: settings -> a ready engine (blocking; runs off the event loop)


def preflight(settings) -> None:
    """Settings that cannot work are refused before the server listens."""
    from openjev.engines.submission import STRATEGIES
    from openjev.errors import ConfigError
    from openjev.runtime.sglang_process import check_args

    if settings.strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {settings.strategy!r}: expected one of {', '.join(STRATEGIES)}")
    if bool(settings.connect) == bool(settings.sglang_python):
        raise ConfigError("--engine sglang needs exactly one of --connect URL or --sglang-python PATH")
    if settings.sglang_python and not settings.model:
        raise ConfigError("--sglang-python needs --model (the model the child server loads)")
    _tokenizer_folder(settings)
    check_args(settings.sglang_args, settings.strategy)


def _tokenizer_folder(settings) -> str:
    from pathlib import Path

    from openjev.errors import ConfigError

    folder = settings.tokenizer or settings.model
    if not folder or not Path(folder).is_dir():
        raise ConfigError(
            "the sglang engine tokenizes here: pass --model (or --tokenizer) as a local model folder "
            "with the same tokenizer as the server's model"
        )
    return folder


def verify_tokenizer(url: str, tokenizer, timeout_s: float = 60.0, client: httpx.Client | None = None) -> None:
    """Refuse a server whose tokenizer differs from ours: it would read other tokens than we
    planned. The probe is a real rendered prompt, sent as text so the server tokenizes it."""
    from openjev.core.types import Turn
    from openjev.errors import ModelUnsuitable

    probe = (
        tokenizer.render(
            [Turn("user", "Prüfe: naïve café, 12,345.67 — tabs\tand\nnewlines 🙂 ok?")], add_generation_prompt=True
        )
        + "Answer:"
    )
    ours = tokenizer.encode(probe)
    body = {
        "text": probe,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "token_ids_logprob": ours[:1],
        "return_text_in_logprobs": False,
    }
    try:
        r = (client or httpx).post(url + "/generate", json=body, timeout=timeout_s)
        r.raise_for_status()
        theirs = [int(entry[1]) for entry in r.json()["meta_info"]["input_token_logprobs"]]
    except (httpx.HTTPError, KeyError, TypeError, ValueError, IndexError) as e:
        log.warning(
            "could not verify that the engine's tokenizer equals ours (%s); "
            "a server started with --skip-tokenizer-init cannot be checked",
            e,
        )
        return
    if theirs[-len(ours) :] == ours and len(theirs) - len(ours) <= 1:  # the server may prepend a BOS
        return
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    raise ModelUnsuitable(
        f"the engine's tokenizer differs from ours (first difference at token {at} of the probe: "
        f"ours {ours[at : at + 3]}, the engine's {theirs[at : at + 3]}); serve the same model on both sides"
    )


def load(settings):
    """Start or reach the server, check it, and return the engine (blocking)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from openjev.engines import LoadedEngine, ModelCard
    from openjev.engines.hf_model import file_date, weights_fingerprint
    from openjev.engines.hf_tokenizer import HFChatTokenizer
    from openjev.runtime.sglang_process import SGLangProcess, check_args, wait_healthy

    t0 = time.perf_counter()
    preflight(settings)
    tokenizer = HFChatTokenizer(AutoTokenizer.from_pretrained(_tokenizer_folder(settings), local_files_only=True))
    process = None
    if settings.sglang_python:
        process = SGLangProcess(
            python=settings.sglang_python,
            model=settings.model,
            port=settings.sglang_port,
            module=settings.sglang_module,
            extra_args=tuple(settings.sglang_args),
        )
        process.start()
        url = process.url
    else:
        url = settings.connect.rstrip("/")
    try:
        wait_healthy(url, settings.startup_timeout_s, process.process if process else None)
        info = _server_info(url)
        if info.get("disable_radix_cache") and settings.strategy != "all":
            check_args(("--disable-radix-cache",), settings.strategy)
        verify_tokenizer(url, tokenizer)
    except BaseException:
        if process is not None:
            process.stop()
        raise
    engine = SGLangEngine(
        url,
        strategy=settings.strategy,
        max_calls=settings.max_engine_calls,
        call_timeout_s=settings.engine_timeout_s,
        warmup_min_tokens=settings.warmup_min_tokens,
    )
    engine.process = process
    model_path = str(info.get("model_path") or settings.model)
    log.info("SGLang at %s serves %s; API keys' cache namespaces go to its radix cache as extra_key", url, model_path)
    name = settings.served_name or Path(model_path.rstrip("/")).name.lower()
    local = Path(settings.model) if settings.model and Path(settings.model).exists() else None
    card = ModelCard(
        name=name,
        description=f"{Path(model_path.rstrip('/')).name} served by SGLang",  # no paths, no URL
        release_date=file_date(local) if local else time.strftime("%Y-%m-%d"),
        fingerprint=weights_fingerprint(local) if local else "",
    )
    return LoadedEngine(
        engine=engine,
        tokenizer=tokenizer,
        card=card,
        load_seconds=time.perf_counter() - t0,
        supervise=process.watch if process is not None else None,
    )


def _server_info(url: str) -> dict:
    """GET /get_server_info, falling back to /get_model_info; {} if neither answers."""
    for path in ("/get_server_info", "/get_model_info"):
        try:
            r = httpx.get(url + path, timeout=10.0)
            if r.status_code == 200:
                return r.json()
        except (httpx.HTTPError, ValueError):
            continue
    return {}
