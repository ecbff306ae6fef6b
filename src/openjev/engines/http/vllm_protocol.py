"""vLLM's wire, as the one HTTP engine (engine.py) is given it: the token route's bodies and
replies (`VLLM`) and, where the server takes it, a stage's branches in one completions call
(`VLLM_BATCHED`, vllm_batch.py). Pure functions over JSON shapes: no I/O here (vllm.py
checks the server and wires the engine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from openjev.engines.http import vllm_batch
from openjev.engines.http.protocol import HTTPProtocol, Reply
from openjev.engines.http.sglang_protocol import HEALTH
from openjev.errors import EngineError

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
