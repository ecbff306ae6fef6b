"""SGLang's native HTTP protocol, as openjev speaks it (SGLang on GPUs, SGLang-JAX on TPUs).

Each branch is one `POST /generate` with its token ids, one new token, and the
log-probabilities of the label ids (`token_ids_logprob`) at the last prompt position
(`logprob_start_len: -1`). Replies are read by token id, never by position, and
validated. Every call asks for selected-token log-probs, warm-ups included: batches that
mix logprob and non-logprob requests crash SGLang 0.5.19 (sgl-project/sglang#34719).

Pure functions over JSON shapes: no I/O here (http_engine.py sends, sglang.py wires).
`HTTPProtocol` is what the one HTTP engine is given: SGLang's (`SGLANG`, below) or vLLM's
(`vllm.VLLM`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from openjev.errors import EngineError

GENERATE = "/generate"
ABORT = "/abort_request"
HEALTH = "/health"

# (label log-probs aligned with the label ids, prompt tokens, cached tokens); None where
# the server does not say.
Reply = tuple[tuple[float, ...], int | None, int | None]


@dataclass(frozen=True)
class HTTPProtocol:
    """What differs between the servers the HTTP engine (http_engine.py) speaks to: where a
    call goes, its body, how to abort it, how to read its reply, and three facts about the
    server. The run loop, the calls, the aborts and the health probe are the engine's."""

    name: str  # as messages name the server
    generate_path: str
    abort_path: str
    health_path: str
    # (rid, input ids, label ids, the cache namespace's salt) -> the JSON body of one call
    request_body: Callable[[str, Sequence[int], Sequence[int], str], dict]
    abort_body: Callable[[str], dict]
    # (the reply's JSON, the label ids asked for) -> Reply; EngineError for anything unusable
    parse_reply: Callable[[Any, Sequence[int]], Reply]
    # Whether requests admitted in the same scheduling step share a prefix (then `auto`
    # never needs to stage). SGLang: no, its radix cache takes a prefix once the request
    # that computed it is done.
    shares_prefix_within_a_batch: bool = False
    # At most this many label ids per call; more take further calls on the cached prefix.
    max_ids_per_call: int | None = None
    # The server's flag that raises its context, named when a branch is too long for it.
    context_flag: str = "its context length"


def request_body(rid: str, input_ids: Sequence[int], label_ids: Sequence[int], salt: str = "") -> dict:
    """One prefill, one new token, the labels' log-probs at the last prompt position, in
    the radix cache's namespace `salt` (Plan.cache_namespace; "" for the shared one)."""
    body: dict = {
        "input_ids": list(input_ids),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": -1,
        "token_ids_logprob": list(label_ids),
        "return_text_in_logprobs": False,
        "rid": rid,
    }
    if salt:  # the radix cache's namespace (GenerateReqInput.extra_key; api/identity/tenancy.py)
        body["extra_key"] = salt
    return body


def abort_body(rid: str) -> dict:
    return {"rid": rid}


def parse_reply(body: Any, label_ids: Sequence[int]) -> Reply:
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


SGLANG = HTTPProtocol(
    name="SGLang",
    generate_path=GENERATE,
    abort_path=ABORT,
    health_path=HEALTH,
    request_body=request_body,
    abort_body=abort_body,
    parse_reply=parse_reply,
    context_flag="--context-length",
)
