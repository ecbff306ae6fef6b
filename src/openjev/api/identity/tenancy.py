"""Cache namespaces: which callers may find each other's states in the engine's cache.

A prefix cache shared by every caller tells one caller, through `x-openjev-cached-tokens`,
`usage.x_cached_tokens` and its latency, how much of its state someone else sent lately.
With API keys configured each key gets its own namespace; keys that name the same
`cache_group` in the keys file share one (api/identity/keys.py). Without keys (one tenant)
everything shares the empty namespace, as before.

The namespace travels as data: the door makes it part of the request's caller
(api/identity/caller.py), the route puts it on the DecisionRequest (`Caller.scope`,
core/caller.py), the compiler on the Plan, and each engine honours it its own way (the in-process prefix cache keys its
entries by it; SGLang gets it as `extra_key`, vLLM as `cache_salt`). It is an HMAC, not
a name: a backend shared with other clients cannot guess it (vLLM asks for exactly that).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib

from openjev.core.types import DecisionRequest


def partitioned(request: DecisionRequest, partition: str) -> DecisionRequest:
    """`request` in a partition of its namespace (OpenAI's `prompt_cache_key`): requests with
    the same partition share the cache, others do not; "" leaves the namespace as it is. A
    partition never leaves the caller's namespace (it is derived from it)."""
    if not partition:
        return request
    derived = hashlib.sha256(f"{request.cache_namespace}\0{partition}".encode()).digest()
    return dataclasses.replace(request, cache_namespace=base64.urlsafe_b64encode(derived).rstrip(b"=").decode())
