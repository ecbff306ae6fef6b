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
(engine.py); only the wire differs, given as data in vllm_protocol.py (`VLLM`). Cancelled or timed-out calls are aborted on the server with
`/inference/v1/abort_requests` (vLLM also aborts a request whose connection closes).
Starting or reaching the server and checking it is remote.py's, shared with SGLang; this
module gives it vLLM's ServerKind and its two hooks (`check`, `make`).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from openjev.config import LimitSettings, RemoteSettings, ServedSettings
from openjev.core.ports import ChatTokenizer
from openjev.engines.http import remote, vllm_batch
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.vllm_protocol import (
    GENERATE,
    MAX_IDS_PER_CALL,
    REQUIRED_CHILD_FLAGS,
    VLLM,
    VLLM_BATCHED,
    parse_reply,
    request_body,
)
from openjev.engines.loaded import LoadedEngine
from openjev.errors import ConfigError, EngineError, EngineUnavailable

log = logging.getLogger(__name__)

# ---- start-up checks (blocking; before the server listens)


def _served_model(http: httpx.Client, url: str) -> dict:
    """{"model": served name, "max_model_len": int}, None each where /v1/models does not say."""
    info: dict = {"model": None, "max_model_len": None}
    try:
        r = http.get(url + "/v1/models")
        if r.status_code == 200:
            first = (r.json().get("data") or [{}])[0]
            info["model"] = first.get("id")
            info["max_model_len"] = first.get("max_model_len")
    except (httpx.HTTPError, ValueError, AttributeError, IndexError):
        pass
    return info


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
    info = _served_model(http, url)
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
