"""Who a decision is for: one frozen value, made once at the API's door and passed as an
argument to everything that charges, isolates or orders work by caller (never ambient).

The core reads what it needs of it: the caller's stable `tenant` (what is stored per
caller is stored under it), its cache namespace and its share of the engine (both put on
the request and the plan). What the edge charges (the key, its allowance and its
reservation) travels with it as `account`, a handle the core never opens: only the
admission that the edge hands the service (core/ports.py `Admission`) reads it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from openjev.core.types import NO_KEY, DecisionRequest, Share


@dataclass(frozen=True)
class Caller:
    """`tenant`: the caller's stable id ("" on a server without keys: one tenant); never a
    position, so a key that changes place never inherits another's data.
    `cache_namespace`: whose engine cache its requests may read and fill ("" shared).
    `share`: whose share of the engine serves it (engines/fair_share.py).
    `account`: the edge's handle for what it charges (None: nothing to charge)."""

    tenant: str = ""
    cache_namespace: str = ""
    share: Share = NO_KEY
    account: object | None = None

    def scope(self, request: DecisionRequest) -> DecisionRequest:
        """`request` in this caller's cache namespace, served from its share of the engine;
        unchanged for the anonymous caller."""
        if self == ANONYMOUS:
            return request
        return replace(request, cache_namespace=self.cache_namespace or request.cache_namespace, share=self.share)


ANONYMOUS = Caller()  # a server without keys, and the work no caller asked for
