"""vLLM's batched call: a submission stage's branches in ONE `POST /v1/completions`.

vLLM 0.32's completions route takes `prompt` as a list of token-id lists and hands the
engine every prompt at once (one `engine_client.generate` per prompt, started together and
merged, as its own `/v1/systemone` does through `next_token_label_reads`), where one
token-route call per branch is parsed and admitted one by one. It takes ONE
`logprob_token_ids` list per call, so a batch asks every item for the union of their label
ids (at most 128, vLLM's cap); log-probs of token ids are the raw full-vocabulary values
(logprobs mode `raw_logprobs`), so asking for more ids changes none of them, and each
branch reads its own labels from its item by token id (`return_tokens_as_token_ids`:
"token_id:N" keys). `max_tokens: 1` is a prefill: vLLM samples the first token in the
prefill's own step, and a request with `max_tokens: 1` ends there (no decode step).

What it loses: the reply's `usage.prompt_tokens_details.cached_tokens` is the LAST
prompt's alone (`request_output_to_completion_response`), not the sum, so a batched call's
cached tokens are reported unknown. Its items are engine requests `cmpl-{request_id}-{i}`,
aborted by those ids. Pure functions over JSON shapes (vllm.py wires them into `VLLM_BATCHED`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from openjev.engines.http.protocol import Item, Reply
from openjev.errors import EngineError

COMPLETIONS = "/v1/completions"
TOKEN_KEY = "token_id:"  # vLLM's format_token_id_placeholder


def union(label_ids: Sequence[Sequence[int]]) -> list[int]:
    """Every item's label ids once, in first-seen order."""
    return list(dict.fromkeys(t for labels in label_ids for t in labels))


def batch_body(rids: Sequence[str], items: Sequence[Item], salt: str = "") -> dict:
    """Every item in one completions call, each asked for the union of the items' labels
    (also its allowed tokens: the sampled token is a label, so it adds no entry). The call's
    request_id is the first rid (its items are `cmpl-{rids[0]}-{i}`: batch_abort_bodies)."""
    ids = union([labels for _, labels in items])
    body: dict = {
        "request_id": rids[0],
        "prompt": [list(tokens) for tokens, _ in items],
        "max_tokens": 1,
        "temperature": 0.0,
        "n": 1,
        "logprobs": len(ids),
        "logprob_token_ids": ids,
        "allowed_token_ids": ids,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "add_special_tokens": False,
        "stream": False,
    }
    if salt:  # the prefix cache's namespace, the same for every item of the call
        body["cache_salt"] = salt
    return body


def batch_abort_bodies(rids: Sequence[str]) -> list[dict]:
    """One /inference/v1/abort_requests naming every item of a batch_body call."""
    return [{"request_ids": [f"cmpl-{rids[0]}-{i}" for i in range(len(rids))]}]


def parse_batch_reply(body: Any, rids: Sequence[str], label_ids: Sequence[Sequence[int]]) -> list[Reply]:
    """One Reply per item, in the items' order (a choice's `index` is its prompt's); prompt
    and cached tokens unknown (the reply's usage gives the call's prompt tokens but one
    item's cached tokens)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != len(rids):
        got = f"{len(choices)} choices" if isinstance(choices, list) else "no choices"
        raise EngineError("the engine's reply is unusable", detail=f"{got} for a batch of {len(rids)}")
    by_index = {c.get("index"): c for c in choices if isinstance(c, dict)}
    if sorted(k for k in by_index if isinstance(k, int)) != list(range(len(rids))):
        raise EngineError("the engine's reply is unusable", detail="choice indices do not match the batch")
    return [(read_choice(by_index[i], labels), None, None) for i, labels in enumerate(label_ids)]


def read_choice(choice: dict, label_ids: Sequence[int]) -> tuple[float, ...]:
    """The label log-probs of one completions choice (max_tokens 1), by token id."""
    if choice.get("finish_reason") in ("abort", "error"):
        raise EngineError("the engine aborted the request", detail=str(choice.get("finish_reason")))
    logprobs = choice.get("logprobs")
    steps = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(steps, list) or len(steps) != 1 or not isinstance(steps[0], dict):
        got = f"{len(steps)} steps" if isinstance(steps, list) else "none"
        raise EngineError("the engine's reply is unusable", detail=f"expected the log-probs of 1 token, got {got}")
    by_id: dict[int, float] = {}
    for key, value in steps[0].items():
        if not isinstance(key, str) or not key.startswith(TOKEN_KEY) or not isinstance(value, (int, float, type(None))):
            raise EngineError("the engine's reply is unusable", detail=f"malformed log-prob entry {key!r}: {value!r}")
        # vLLM clamps -inf (and NaN) to -9999.0 in this shape
        by_id[int(key[len(TOKEN_KEY) :])] = -math.inf if value is None or value <= -9999.0 else float(value)
    return label_values(by_id, label_ids)


def label_values(by_id: dict[int, float], label_ids: Sequence[int]) -> tuple[float, ...]:
    """The labels' log-probs from a reply's {token id: log-prob} (both vLLM routes), checked:
    every label present, none positive, NaN or +inf, not all -inf."""
    missing = [t for t in label_ids if t not in by_id]
    if missing:
        raise EngineError("the engine's reply is unusable", detail=f"no log-probs for label tokens {missing}")
    values = tuple(by_id[t] for t in label_ids)
    if any(math.isnan(v) or v == math.inf or v > 1e-6 for v in values):
        raise EngineError("the engine's reply is unusable", detail=f"invalid log-probs {values}")
    if all(v == -math.inf for v in values):
        raise EngineError("the engine gave every label probability zero")
    return values
