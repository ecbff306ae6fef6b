"""SGLang's native HTTP protocol, as openjev speaks it (SGLang on GPUs, SGLang-JAX on TPUs).

A call is one `POST /generate` of token ids asking for the log-probabilities of the label
ids (`token_ids_logprob`) at the last prompt position (`logprob_start_len: -1`). Where the
server takes them (found at start-up: sglang.py `capabilities`), a submission stage's
branches go in ONE call (GenerateReqInput's batch form: `input_ids` a list of lists, a
list of `token_ids_logprob` and of `rid`, one item each), and prefill-only
(`max_new_tokens: 0`: SGLang's `Req.is_prefill_only`, no decode step, as its own
`score_prompts` asks); otherwise one call per branch generating one token, as older
servers need. Replies are read by token id, never by position, and validated. Every call
asks for selected-token log-probs, warm-ups included: batches that mix logprob and
non-logprob requests crash SGLang 0.5.19 (sgl-project/sglang#34719).

Pure functions over JSON shapes: no I/O here (engine.py sends, sglang.py wires). What the one
HTTP engine is given is a `protocol.HTTPProtocol`: SGLang's (`SGLANG`, below) or vLLM's
(vllm_protocol.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

from openjev.engines.http.protocol import HTTPProtocol, Item, Reply
from openjev.errors import EngineError

GENERATE = "/generate"
ABORT = "/abort_request"
HEALTH = "/health"


def request_body(
    rid: str, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "", new_tokens: int = 1
) -> dict:
    """One prefill, `new_tokens` new tokens (0: prefill-only), the labels' log-probs at the
    last prompt position, in the radix cache's namespace `salt` (Plan.cache_namespace; ""
    for the shared one)."""
    body: dict = {
        "input_ids": list(input_ids),
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": -1,
        "token_ids_logprob": list(label_ids),
        "return_text_in_logprobs": False,
        "rid": rid,
    }
    if salt:  # the radix cache's namespace (GenerateReqInput.extra_key; api/identity/tenancy.py)
        body["extra_key"] = salt
    return body


def batch_body(rids: Sequence[str], items: Sequence[Item], salt: str = "", new_tokens: int = 0) -> dict:
    """Every item in one call (GenerateReqInput's batch form): per-item token ids, label
    ids and rids; the scalars (sampling params, return_logprob, logprob_start_len,
    extra_key) are the same for every item, and SGLang's normalization gives each item its
    copy (`_normalize_batch_inputs`). With token ids only, its tokenizer manager hands the
    scheduler the whole batch in one message."""
    body: dict = {
        "input_ids": [list(ids) for ids, _ in items],
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": -1,
        "token_ids_logprob": [list(labels) for _, labels in items],
        "return_text_in_logprobs": False,
        "rid": list(rids),
    }
    if salt:
        body["extra_key"] = salt
    return body


def parse_batch_reply(
    body: Any, rids: Sequence[str], label_ids: Sequence[Sequence[int]], new_tokens: int = 0
) -> list[Reply]:
    """One Reply per item of a batch_body call: the reply is a list in the items' order
    (each item's `meta_info.id` is its rid, checked where present)."""
    if not isinstance(body, list) or len(body) != len(rids):
        got = f"{len(body)} items" if isinstance(body, list) else type(body).__name__
        raise EngineError("the engine's reply is unusable", detail=f"{got} for a batch of {len(rids)}")
    replies = []
    for item, rid, labels in zip(body, rids, label_ids, strict=True):
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if isinstance(meta, dict) and meta.get("id") not in (None, rid):
            raise EngineError("the engine's reply is unusable", detail=f"item {meta.get('id')!r} where {rid!r} was")
        replies.append(parse_reply(item, labels, new_tokens))
    return replies


def parse_batch_parts(
    body: Any, rids: Sequence[Sequence[str]], label_ids: Sequence[Sequence[Sequence[int]]], new_tokens: int = 0
) -> list[list[Reply] | EngineError]:
    """A batch_body call that carried several requests' parts (coalesce.py), each part's
    slice of the reply list read by parse_batch_reply on its own: an item of one part that
    is unusable (aborted: its request left) fails that part only. A reply that is not a list
    of every item raises."""
    total = sum(len(r) for r in rids)
    if not isinstance(body, list) or len(body) != total:
        got = f"{len(body)} items" if isinstance(body, list) else type(body).__name__
        raise EngineError("the engine's reply is unusable", detail=f"{got} for a batch of {total}")
    out: list[list[Reply] | EngineError] = []
    at = 0
    for part_rids, part_labels in zip(rids, label_ids, strict=True):
        try:
            out.append(parse_batch_reply(body[at : at + len(part_rids)], part_rids, part_labels, new_tokens))
        except EngineError as e:
            out.append(e)
        at += len(part_rids)
    return out


def abort_body(rid: str) -> dict:
    return {"rid": rid}


def parse_reply(body: Any, label_ids: Sequence[int], new_tokens: int = 1) -> Reply:
    """(label log-probs aligned with `label_ids`, prompt_tokens, cached_tokens) from a
    /generate reply that asked for `new_tokens`; raises EngineError for anything unusable."""
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise EngineError("the engine's reply has no meta_info")
    meta = body["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise EngineError("the engine aborted the request", detail=str(finish.get("message") or finish))
    completion = meta.get("completion_tokens")
    if completion is not None and completion != new_tokens:
        raise EngineError(
            "the engine's reply is unusable", detail=f"{completion} tokens generated, expected {new_tokens}"
        )
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


def tokenize_body(text: str, first_id: int) -> dict:
    """A /generate of `text` that returns the server's own token ids of it (the tokenizer
    check): log-probs from position 0 list every input token."""
    return {
        "text": text,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "token_ids_logprob": [first_id],
        "return_text_in_logprobs": False,
    }


def tokenized_ids(body: Any) -> list[int]:
    """The input token ids of a tokenize_body reply (KeyError, TypeError, ValueError or
    IndexError if it has none)."""
    return [int(entry[1]) for entry in body["meta_info"]["input_token_logprobs"]]


def sglang(*, batch: bool, prefill_only: bool, keeps_namespace: bool = True) -> HTTPProtocol:
    """SGLang's protocol as the connected server takes it (sglang.py `capabilities`):
    `batch`, a stage's branches in one call; `prefill_only`, `max_new_tokens: 0`;
    `keeps_namespace`, a batch's items keep its `extra_key`."""
    new = 0 if prefill_only else 1
    return HTTPProtocol(
        name="SGLang",
        generate_path=GENERATE,
        abort_path=ABORT,
        health_path=HEALTH,
        request_body=partial(request_body, new_tokens=new),
        abort_body=abort_body,
        parse_reply=partial(parse_reply, new_tokens=new),
        context_flag="--context-length",
        batch_body=partial(batch_body, new_tokens=new) if batch else None,
        parse_batch_reply=partial(parse_batch_reply, new_tokens=new) if batch else None,
        # calls shared by requests only where the batch form is faithful (SGLang-JAX 0.1.0rc0,
        # whose batches lose extra_key, is not trusted to answer an item aborted alone)
        parse_batch_parts=partial(parse_batch_parts, new_tokens=new) if batch and keeps_namespace else None,
        prefill_only=prefill_only,
        batch_keeps_namespace=batch and keeps_namespace,
    )


# One call per branch, one token generated: what every SGLang-protocol server takes.
SGLANG = sglang(batch=False, prefill_only=False)
# A stage in one call, prefill-only: SGLang 0.5.23 (and whatever server passes the probe).
SGLANG_BATCHED = sglang(batch=True, prefill_only=True)
