"""GET /v1/limits: what a client may rely on, built at the edge from the settings, the
served model's abstain rule, and the calling key's own limits (its per-key
requests/tokens per minute where the keys file sets them, else the server's defaults,
which is what the key is held to)."""

from __future__ import annotations

from typing import Any

from openjev.api.identity.keys import Allowance, KeyEntry
from openjev.config import (
    MAX_CHOICE_OPTIONS,
    MAX_SCORE_LEVELS,
    MIN_CHOICE_OPTIONS,
    MIN_SCORE_LEVELS,
    KeySettings,
    Settings,
    flat_values,
)
from openjev.core.service import DecisionService

# The settings a client may rely on (of several sections), served under their own names.
_SETTINGS = (
    "max_questions",
    "max_body_bytes",
    "max_json_depth",
    "max_branch_tokens",
    "max_request_tokens",
    "max_branches",
    "max_prompt_tokens",
    "max_in_flight",
    "engine_timeout_s",
    "max_rotations",
    "rotation_max_options",
    "max_tokens_in_flight",
    "max_batch_items",
    "max_batch_tokens",
    "max_connections",
    "max_connections_per_client",
    "head_timeout_s",
    "body_timeout_s",
    "max_head_bytes",
    "send_timeout_s",
    "max_body_chunks",
    "max_task_examples",
    "max_example_tokens",
    "max_queued_tasks",
)


def key_limits_of(keys: KeySettings, entry: KeyEntry | None) -> dict[str, int]:
    """The calling key's own limits (0: none) and weight; the server's defaults without a key."""
    held = Allowance(keys.key_requests_per_min, keys.key_tokens_per_min).of(entry)
    return {
        "key_requests_per_min": held.requests_per_min,
        "key_tokens_per_min": held.tokens_per_min,
        "key_weight": held.weight,
    }


def limits_body(
    settings: Settings, entry: KeyEntry | None, service: DecisionService | None, store: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The body of GET /v1/limits for the caller `entry` (None: no keys in use); `store`: where
    the per-key limits are kept (`limits_store`: memory, or redis with its mode and whether it
    answers: api/server/operator_state.py `store_state`)."""
    flat = flat_values(settings)
    out: dict[str, Any] = {name: flat[name] for name in _SETTINGS}
    out.update(
        {
            "max_choice_options": MAX_CHOICE_OPTIONS,
            "min_choice_options": MIN_CHOICE_OPTIONS,
            "max_score_levels": MAX_SCORE_LEVELS,
            "min_score_levels": MIN_SCORE_LEVELS,
            "abstain": {
                "min_label_mass": settings.quality.abstain_min_label_mass,
                "min_order_agreement": settings.quality.abstain_min_order_agreement,
                "min_confidence": settings.quality.abstain_min_confidence,
            },
            **key_limits_of(settings.keys, entry),
        }
    )
    if store is not None:
        out["limits_store"] = store
    if entry is not None:
        out["key"] = entry.name
    if service is not None:  # the rule in force: the served model's file may have set it
        out["abstain"] = service.abstain.describe()
    return out
