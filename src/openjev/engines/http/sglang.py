"""The production engine: SGLang's native HTTP API (SGLang on GPUs, SGLang-JAX on TPUs),
either a running server (`--connect URL`) or a child we start and supervise
(`--sglang-python PATH`).

This module is the engine registry's entry (preflight, load) and SGLang's start-up checks;
the protocol is sglang_protocol.py's, the engine engine.py's, the wiring shared with
vLLM remote.py's.
"""

from __future__ import annotations

import logging
import random
import uuid
from typing import Any

import httpx

from openjev.config import LimitSettings, RemoteSettings, ServedSettings
from openjev.core.ports import ChatTokenizer
from openjev.engines.http import remote, sglang_protocol
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.protocol import HTTPProtocol
from openjev.engines.loaded import LoadedEngine
from openjev.errors import EngineError

__all__ = ["load", "preflight", "verify_tokenizer"]

log = logging.getLogger(__name__)


def kind(http: RemoteSettings) -> remote.ServerKind:
    return remote.ServerKind(
        engine="sglang",
        name="SGLang",
        python=http.sglang_python,
        python_flag="--sglang-python",
        port=http.sglang_port,
        module=http.sglang_module,
        model_flag="--model-path",
        child_args=tuple(http.sglang_args),
        namespaces="API keys' cache namespaces go to its radix cache as extra_key",
    )


def preflight(served: ServedSettings, http: RemoteSettings) -> None:
    """Settings that cannot work are refused before the server listens."""
    from openjev.engines.http.server_process import check_args

    remote.preflight(served, http, kind(http))
    check_args(http.sglang_args, http.strategy)


def verify_tokenizer(
    url: str, tokenizer: ChatTokenizer, timeout_s: float = 60.0, client: httpx.Client | None = None
) -> bool:
    """remote.verify_tokenizer over SGLang's /generate: the probe is sent as text, so the
    server tokenizes it, and its input log-probs list the ids it read."""

    def server_ids(text: str) -> list[int]:
        first = tokenizer.encode(text)[:1]
        r = (client or httpx).post(
            url + sglang_protocol.GENERATE, json=sglang_protocol.tokenize_body(text, first[0]), timeout=timeout_s
        )
        r.raise_for_status()
        return sglang_protocol.tokenized_ids(r.json())

    return remote.verify_tokenizer(tokenizer, server_ids)


def check(url: str, tokenizer: ChatTokenizer, strategy: str) -> dict[str, Any]:
    """Refuse a server with its radix cache off (unless --strategy all) or another
    tokenizer; returns {"model": the server's model path, if it says, "max_prompt_tokens",
    "protocol": what the server takes (capabilities)}."""
    from openjev.engines.http.server_process import check_args

    info = server_info(url)
    if info.get("disable_radix_cache") and strategy != "all":
        check_args(("--disable-radix-cache",), strategy)
    verify_tokenizer(url, tokenizer)
    protocol = capabilities(url, tokenizer.encode(remote.PROBE_TEXT)[:8])
    log.info(
        "SGLang %s at %s: %s, %s",
        info.get("version", "(version not given)"),
        url,
        "a stage's branches in one /generate" if protocol.batch_body else "one /generate per branch",
        "prefill-only" if protocol.prefill_only else "one token generated per call",
    )
    return {
        "model": info.get("model_path"),
        "max_prompt_tokens": max_prompt_tokens(info),
        "step_tokens": step_tokens(info),
        "protocol": protocol,
    }


def step_tokens(info: dict[str, Any]) -> int | None:
    """The most the server prefills per scheduling step: its /server_info
    `chunked_prefill_size`, or `max_prefill_tokens` if smaller; None if it does not chunk
    (-1) or does not say."""

    def size(key: str) -> int | None:
        v = info.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    chunk, cap = size("chunked_prefill_size"), size("max_prefill_tokens")
    return None if chunk is None else min(chunk, cap or chunk)


def capabilities(url: str, ids: list[int], timeout_s: float = 60.0, client: httpx.Client | None = None) -> HTTPProtocol:
    """The protocol the server at `url` takes, found by asking it (two probe calls of the
    `ids`, a few tokens): batched and prefill-only (SGLang 0.5.23), else each alone, else
    today's one call per branch generating a token (older SGLang, servers without either).
    A probe answers only if its reply is what the engine would read (sglang_protocol.py's
    parsers), so a server that takes a shape but answers it otherwise is not used so."""
    labels = ids[:1]

    def works(protocol: HTTPProtocol) -> bool:
        try:
            if protocol.batch_body is not None and protocol.parse_batch_reply is not None:
                rids = [uuid.uuid4().hex, uuid.uuid4().hex]
                body = protocol.batch_body(rids, [(ids, labels), (ids[:-1] or ids, labels)], "")
                r = (client or httpx).post(url + sglang_protocol.GENERATE, json=body, timeout=timeout_s)
                r.raise_for_status()
                protocol.parse_batch_reply(r.json(), rids, [labels, labels])
            else:
                body = protocol.request_body(uuid.uuid4().hex, ids, labels, "")
                r = (client or httpx).post(url + sglang_protocol.GENERATE, json=body, timeout=timeout_s)
                r.raise_for_status()
                protocol.parse_reply(r.json(), labels)
        except (httpx.HTTPError, EngineError, ValueError) as e:
            log.info("the SGLang server does not take %s: %s", _shape(protocol), e)
            return False
        return True

    for batch, prefill_only in ((True, True), (False, True), (True, False)):
        protocol = sglang_protocol.sglang(batch=batch, prefill_only=prefill_only)
        if works(protocol):
            if batch and not keeps_namespace(url, ids, protocol, timeout_s, client):
                log.warning(
                    "the SGLang server drops extra_key in batched calls: namespaced plans go one call per branch"
                )
                protocol = sglang_protocol.sglang(batch=True, prefill_only=prefill_only, keeps_namespace=False)
            return protocol
    return sglang_protocol.SGLANG


def keeps_namespace(
    url: str, ids: list[int], protocol: HTTPProtocol, timeout_s: float, client: httpx.Client | None
) -> bool:
    """Whether a batched call's items keep its `extra_key` (the cache namespace): a new
    sequence sent batched under a fresh key, then alone under none, must not find the batch's
    tokens cached (SGLang-JAX 0.1.0rc0 loses the key when it splits a batch, so the second
    finds all but its last token). A few tokens found are another keyless sequence's: its
    random tokens come from a small pool, and a server that saw an earlier start-up's probe
    (a restart, a second openjev) has cached sequences that start the same (reading any
    token found as a dropped key turned batching off there). False if the server does not
    say what it found cached."""
    if protocol.batch_body is None:
        return False
    # Not starting as `ids` does, which the probes before this one cached without a key.
    pool = [t for t in ids if t != ids[0]] or ids
    seq = random.Random(uuid.uuid4().int).choices(pool, k=24)
    labels = ids[:1]
    http = client or httpx
    try:
        body = protocol.batch_body([uuid.uuid4().hex, uuid.uuid4().hex], [(seq, labels), (seq[:-1], labels)], "")
        body["extra_key"] = f"openjev-probe-{uuid.uuid4().hex}"
        http.post(url + sglang_protocol.GENERATE, json=body, timeout=timeout_s).raise_for_status()
        r = http.post(
            url + sglang_protocol.GENERATE,
            json=protocol.request_body(uuid.uuid4().hex, seq, labels, ""),
            timeout=timeout_s,
        )
        r.raise_for_status()
        _, _, cached = protocol.parse_reply(r.json(), labels)
    except (httpx.HTTPError, EngineError, ValueError) as e:
        log.info("could not tell whether batched calls keep extra_key: %s", e)
        return False
    return cached is not None and cached < len(seq) // 2


def _shape(protocol: HTTPProtocol) -> str:
    new = 0 if protocol.prefill_only else 1
    return f"{'batched' if protocol.batch_body else 'single'} calls with max_new_tokens {new}"


def max_prompt_tokens(info: dict[str, Any]) -> int | None:
    """The longest prompt the server takes, from its /server_info: the scheduler's
    `max_req_input_len` (its context, or its KV pool if smaller, less one generated token),
    else `context_length` less one; None if it says neither. A longer branch is then refused
    as a 4xx before it is sent, not answered 400 by the server (a 502 to our caller)."""
    limit = info.get("max_req_input_len")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return limit
    context = info.get("context_length")
    if isinstance(context, int) and not isinstance(context, bool) and context > 1:
        return context - 1
    return None


def load(served: ServedSettings, http: RemoteSettings, limits: LimitSettings) -> LoadedEngine:
    """Start or reach the server, check it, and return the engine (blocking)."""
    preflight(served, http)
    return remote.load(
        served,
        http,
        kind(http),
        check=lambda url, tokenizer: check(url, tokenizer, http.strategy),
        make=lambda url, info: HTTPEngine(
            url,
            info["protocol"],
            max_prompt_tokens=info.get("max_prompt_tokens"),
            step_tokens=info.get("step_tokens"),
            **remote.engine_options(http, limits),
        ),
    )


def server_info(url: str) -> dict[str, Any]:
    """GET /server_info (SGLang 0.5.23, which logs a deprecation warning for the older name),
    falling back to /get_server_info (SGLang-JAX, older SGLang), then /get_model_info; {} if
    none answers."""
    for path in ("/server_info", "/get_server_info", "/get_model_info"):
        try:
            r = httpx.get(url + path, timeout=10.0)
            if r.status_code == 200:
                body = r.json()
                if isinstance(body, dict):
                    return body
        except (httpx.HTTPError, ValueError):
            continue
    return {}
