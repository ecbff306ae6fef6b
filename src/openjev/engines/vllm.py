"""The vLLM engine: vLLM's token-in route `POST /inference/v1/generate`, and a submission
stage's branches in one `POST /v1/completions` where the server takes it (vllm_batch.py).

A call on the token route is one branch: its token ids, one new token (`max_tokens: 1`),
and the raw log-probabilities of the label ids at the last prompt position
(`logprob_token_ids`, at most 128 per call; more labels take a second call on the then
cached prefix). vLLM 0.32's completions route takes many token-id prompts with one
`logprob_token_ids` list and hands its engine every prompt at once, as vLLM's own
`/v1/systemone` does; `check_server` probes it at start-up against the token route
(`VLLM_BATCHED` if it answers the same, else `VLLM`, one call per branch). Replies are read
by token id, never by position, and validated. Top-k log-probs would silently lose labels
outside the top k, so this engine never falls back to them, and it needs the token route
(lone branches, labels over 128, the probe) and refuses a server without it. Server flags:
`--enable-scale-out` (the route answers 403 without it), `--max-logprobs 128` (a reply
only carries log-probs when `logprobs` is set, and that is capped at 20 by default) and
`--enable-prompt-tokens-details` (cached-token accounting; without it the usage is
reported unknown). A child started by openjev gets all three.

The run loop (submission strategies planned on the trie, the server-wide cap on calls in
flight, cancellation of siblings, token accounting) is the one HTTP engine's
(http_engine.py); only the wire differs, and this module gives it as data (`VLLM`). Cancelled or timed-out calls are aborted on the server with
`/inference/v1/abort_requests` (vLLM also aborts a request whose connection closes).
Starting or reaching the server and checking it is remote.py's, shared with SGLang; this
module gives it vLLM's ServerKind and its two hooks (`check`, `make`).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from openjev.config import LimitSettings, RemoteSettings, ServedSettings
from openjev.core.ports import ChatTokenizer
from openjev.engines import remote, vllm_batch
from openjev.engines.http_engine import HTTPEngine
from openjev.engines.http_protocol import HEALTH, HTTPProtocol, Reply
from openjev.engines.loaded import LoadedEngine
from openjev.errors import ConfigError, EngineError, EngineUnavailable

log = logging.getLogger(__name__)

GENERATE = "/inference/v1/generate"
ABORT = "/inference/v1/abort_requests"
MAX_IDS_PER_CALL = 128  # vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS
# vLLM prefixes the id it was given (our request_id) before it reaches the engine; abort
# by that external id.
ID_PREFIX = "generate-tokens-"
# Flags a child server started by openjev always gets (what this engine needs).
REQUIRED_CHILD_FLAGS = (
    ("--enable-scale-out",),
    ("--enable-prompt-tokens-details",),
    ("--max-logprobs", str(MAX_IDS_PER_CALL)),
)


def parse_reply(body: Any, label_ids: Sequence[int]) -> Reply:
    """(label log-probs aligned with `label_ids`, prompt_tokens, cached_tokens) from a
    /inference/v1/generate reply (output_mode "tokens"); EngineError for anything unusable."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or len(body["choices"]) != 1:
        raise EngineError("the engine's reply has no single choice")
    choice = body["choices"][0]
    if not isinstance(choice, dict):
        raise EngineError("malformed choice in the engine's reply")
    if choice.get("finish_reason") == "abort":
        raise EngineError("the engine aborted the request")
    generated = choice.get("token_ids")
    if isinstance(generated, list) and len(generated) != 1:
        raise EngineError("the engine's reply is unusable", detail=f"{len(generated)} tokens generated, expected 1")
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        raise EngineError("the engine's reply has no logprobs (is the server started with --max-logprobs 128?)")
    step = content[0]
    by_id: dict[int, float] = {}
    for entry in (step, *(step.get("top_logprobs") or ())):
        if not isinstance(entry, dict) or "token_id" not in entry or "logprob" not in entry:
            raise EngineError("the engine's reply is unusable", detail=f"malformed log-prob entry {entry!r}")
        value = entry["logprob"]
        # vLLM clamps -inf (and NaN) to -9999.0 in this shape
        by_id[int(entry["token_id"])] = -math.inf if value is None or value <= -9999.0 else float(value)
    values = vllm_batch.label_values(by_id, label_ids)
    usage = body.get("usage") or {}
    prompt = usage.get("prompt_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return values, (int(prompt) if prompt is not None else None), (int(cached) if cached is not None else None)


def request_body(rid: str, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "") -> dict:
    """One prefill with the labels' raw log-probs at the last position.

    `allowed_token_ids` = the labels makes the sampled token a label: vLLM lists the sampled
    token first and keeps `logprobs` entries in all, so an unlisted sampled token would push
    the last label out. It does not touch the values: vLLM's log-probs are computed from the
    raw logits before any logits processor (logprobs mode `raw_logprobs`, the default).
    """
    ids = list(label_ids)
    body: dict = {
        "request_id": rid,
        "token_ids": list(input_ids),
        "sampling_params": {
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": len(ids),
            "logprob_token_ids": ids,
            "allowed_token_ids": ids,
            "detokenize": False,
            "skip_special_tokens": False,
        },
        "output_mode": "tokens",
        "stream": False,
    }
    if salt:  # the prefix cache's namespace (GenerateRequest.cache_salt; api/identity/tenancy.py)
        body["cache_salt"] = salt
    return body


def abort_body(rid: str) -> dict:
    return {"request_ids": [ID_PREFIX + rid]}


VLLM = HTTPProtocol(
    name="vLLM",
    generate_path=GENERATE,
    abort_path=ABORT,
    health_path=HEALTH,
    request_body=request_body,
    abort_body=abort_body,
    parse_reply=parse_reply,
    # vLLM registers a prompt's full KV blocks in its prefix cache when it schedules them
    # (KVCacheManager.allocate_slots), so requests admitted together share the prefix: four
    # branches on a cold 600-token state, sent at once behind a busy server, reported
    # 0, 512, 512, 512 cached tokens (128-token blocks). `auto` therefore sends everything
    # at once; `staged` and `warmup` stay available and only add round trips here.
    shares_prefix_within_a_batch=True,
    max_ids_per_call=MAX_IDS_PER_CALL,
    context_flag="--max-model-len",
)
# A stage's branches in one /v1/completions call (vllm_batch.py), where the server takes it
# (check_server's probe); a lone branch, and labels over 128, still take the token route.
VLLM_BATCHED = replace(
    VLLM,
    batch_body=vllm_batch.batch_body,
    parse_batch_reply=vllm_batch.parse_batch_reply,
    batch_keeps_namespace=True,
    batch_path=vllm_batch.COMPLETIONS,
    batch_shares_labels=True,
    batch_abort_bodies=vllm_batch.batch_abort_bodies,
)


# ---- start-up checks (blocking; before the server listens)


def check_server(
    url: str, label_ids: Sequence[int], client: httpx.Client | None = None, timeout_s: float = 120.0
) -> dict:
    """Refuse a server that cannot give what the engine needs; returns what was learned:
    {"model": served name, "max_model_len": int | None, "cached_tokens": bool, "protocol":
    VLLM_BATCHED if a stage goes in one /v1/completions call (`batches`), else VLLM}.

    One probe call asks for MAX_IDS_PER_CALL label log-probs, the most a call ever asks:
    a 403 means no `--enable-scale-out`, a 404 a vLLM without the token route, a cap below
    128 shows as a 400 naming --max-logprobs. Never falls back to top-k log-probs.
    """
    if client is None:
        with httpx.Client(timeout=timeout_s) as own:
            return check_server(url, label_ids, own)
    http = client
    info: dict = {"model": None, "max_model_len": None}
    try:
        r = http.get(url + "/v1/models")
        if r.status_code == 200:
            first = (r.json().get("data") or [{}])[0]
            info["model"] = first.get("id")
            info["max_model_len"] = first.get("max_model_len")
    except (httpx.HTTPError, ValueError, AttributeError, IndexError):
        pass
    ids = list(label_ids)[:MAX_IDS_PER_CALL]
    try:
        r = http.post(url + GENERATE, json=request_body(uuid.uuid4().hex, [1, 2, 3, 4], ids))
    except httpx.HTTPError as e:
        raise EngineUnavailable(f"cannot reach the vLLM server at {url}: {e}") from None
    if r.status_code == 403:
        raise ConfigError(f"the vLLM server at {url} refuses {GENERATE} (403): start it with --enable-scale-out")
    if r.status_code == 404:
        raise ConfigError(
            f"the server at {url} has no {GENERATE} (404): openjev needs vLLM's token-in route "
            "(vLLM 0.32 or later, started with --enable-scale-out)"
        )
    if r.status_code == 400 and "max allowed" in r.text:
        raise ConfigError(
            f"the vLLM server at {url} caps log-probs below {len(ids)} per call: start it with "
            f"--max-logprobs {MAX_IDS_PER_CALL} ({r.text[:200]})"
        )
    if r.status_code != 200:
        raise ConfigError(f"the vLLM server at {url} answered the probe with {r.status_code}: {r.text[:300]}")
    try:
        body = r.json()
        values, _, cached = parse_reply(body, ids)
    except (ValueError, EngineError) as e:
        raise ConfigError(f"the vLLM server at {url} does not return the label log-probs openjev needs: {e}") from None
    info["cached_tokens"] = cached is not None
    info["protocol"] = VLLM_BATCHED if batches(http, url, ids, values) else VLLM
    if cached is None:
        log.warning(
            "the vLLM server reports no cached tokens: start it with --enable-prompt-tokens-details; "
            "computed and cached token counts are reported as unknown"
        )
    return info


def batches(http: httpx.Client, url: str, ids: list[int], values: Sequence[float]) -> bool:
    """Whether the server takes a stage in one /v1/completions call: a two-item probe (the
    token-route probe's prompt and a shorter one) must parse, and its first item give the
    token route's `values` (1e-4), so a server that reads the batch otherwise is not used so."""
    prompt = [1, 2, 3, 4]
    rids = [uuid.uuid4().hex, uuid.uuid4().hex]
    try:
        r = http.post(
            url + vllm_batch.COMPLETIONS, json=vllm_batch.batch_body(rids, [(prompt, ids), (prompt[:3], ids)])
        )
        r.raise_for_status()
        first, _ = vllm_batch.parse_batch_reply(r.json(), rids, [ids, ids])
    except (httpx.HTTPError, ValueError, EngineError) as e:
        log.info("the vLLM server does not take a stage in one %s call: %s", vllm_batch.COMPLETIONS, e)
        return False
    if any(not math.isclose(a, b, abs_tol=1e-4) for a, b in zip(first[0], values, strict=True)):
        log.warning(
            "the vLLM server's %s reads labels otherwise than its token route: not used", vllm_batch.COMPLETIONS
        )
        return False
    return True


def verify_tokenizer(
    url: str, tokenizer: ChatTokenizer, client: httpx.Client | None = None, timeout_s: float = 60.0
) -> bool:
    """remote.verify_tokenizer over vLLM's `/tokenize`."""

    def server_ids(text: str) -> list[int]:
        r = (client or httpx).post(
            url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=timeout_s
        )
        r.raise_for_status()
        return [int(t) for t in r.json()["tokens"]]

    return remote.verify_tokenizer(tokenizer, server_ids)


def child_args(extra: Sequence[str]) -> tuple[str, ...]:
    """The child's flags: the user's, plus whichever required flag they did not give."""
    args = list(extra)
    for flag in REQUIRED_CHILD_FLAGS:
        if flag[0] not in args:
            args += flag
    return tuple(args)


# ---- wiring: settings -> a ready engine


def kind(http: RemoteSettings) -> remote.ServerKind:
    return remote.ServerKind(
        engine="vllm",
        name="vLLM",
        python=http.vllm_python,
        python_flag="--vllm-python",
        port=http.vllm_port,
        module=http.vllm_module,
        model_flag="--model",
        child_args=child_args(http.vllm_args),
        namespaces="API keys' cache namespaces go to its prefix cache as cache_salt",
    )


def preflight(served: ServedSettings, http: RemoteSettings) -> None:
    """Settings that cannot work are refused before the server listens."""
    remote.preflight(served, http, kind(http))
    if "--no-enable-prefix-caching" in http.vllm_args and http.strategy != "all":
        raise ConfigError(
            f"--no-enable-prefix-caching turns off the prefix cache that the {http.strategy!r} "
            "strategy relies on; remove it or use --strategy all"
        )


def check(url: str, tokenizer: ChatTokenizer) -> dict[str, Any]:
    """check_server with every label the compiler can use, then the tokenizer."""
    from openjev.config import MAX_CHOICE_OPTIONS
    from openjev.core.prompts import PromptCompiler

    labels = PromptCompiler(tokenizer, max_labels=MAX_CHOICE_OPTIONS).labels
    info = check_server(url, labels.ids)
    verify_tokenizer(url, tokenizer)
    return info


def load(served: ServedSettings, http: RemoteSettings, limits: LimitSettings) -> LoadedEngine:
    """Start or reach the server, check it, and return the engine (blocking)."""
    preflight(served, http)

    def make(url: str, info: dict[str, Any]) -> HTTPEngine:
        max_len = info.get("max_model_len")
        protocol = info.get("protocol", VLLM)
        log.info(
            "vLLM at %s: %s",
            url,
            "a stage's branches in one /v1/completions" if protocol.batch_body else "one token-route call per branch",
        )
        return HTTPEngine(
            url,
            protocol,
            max_prompt_tokens=int(max_len) - 1 if max_len else None,
            **remote.engine_options(http, limits),
        )

    return remote.load(served, http, kind(http), check=check, make=make)
