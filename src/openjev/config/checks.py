"""Every setting checked at start, before anything loads: a value that cannot work is a
ConfigError (the CLI exits 2 with it), never a server that answers every request wrong.
The checks read the settings by their flat names (`values`: name -> value, every section's
fields together), so a rule may relate fields of different sections."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from typing import Any

from openjev.config.fleet import check_fleet
from openjev.config.ranges import MAX_CHOICE_OPTIONS
from openjev.config.tasks import parse_retention
from openjev.core.readouts.spec import READOUT_NAMES
from openjev.errors import ConfigError

_DAY = 86_400.0
_POSITIVE = """max_questions max_body_bytes max_json_depth max_branch_tokens max_request_tokens max_branches
    max_prompt_tokens max_in_flight engine_timeout_s retry_after_s attention_budget batch_tokens max_engine_calls
    startup_timeout_s rotations max_rotations rotation_max_options max_batch_items max_batch_tokens slice_ms
    fair_quantum warmup_min_tokens max_connections head_timeout_s body_timeout_s send_timeout_s max_body_chunks
    max_task_examples max_example_tokens""".split()
_NOT_NEGATIVE = """prefix_cache_bytes batch_window_ms max_tokens_in_flight drain_timeout_s max_queue_wait_s
    key_requests_per_min key_tokens_per_min coalesce_calls max_connections_per_client max_queued_tasks""".split()
# Upper bounds: beyond them a value is a typo, and some would overflow a timer or a tensor.
_AT_MOST: dict[str, float] = {
    "temperature": 1000.0,
    **dict.fromkeys(("engine_timeout_s", "startup_timeout_s", "drain_timeout_s", "max_queue_wait_s"), _DAY),
    **dict.fromkeys(("head_timeout_s", "send_timeout_s"), 3600.0),
    "retry_after_s": 3600,
    "body_timeout_s": _DAY,
    "max_body_chunks": 1 << 24,
    "batch_window_ms": 60_000.0,
    "slice_ms": 3_600_000.0,
    "fair_quantum": 1 << 20,
    **dict.fromkeys(("max_rotations", "rotation_max_options"), MAX_CHOICE_OPTIONS),
    "max_body_bytes": 1 << 30,
    "max_head_bytes": 1 << 24,
    "max_connections": 1 << 20,
    "coalesce_calls": 1 << 16,
}
_FRACTIONS = (
    "abstain_min_label_mass",
    "abstain_min_order_agreement",
    "abstain_min_confidence",
    "task_target_precision",
)


def validate(values: Mapping[str, Any]) -> None:
    """Raise ConfigError for the first setting that cannot work."""
    _check_numbers(values)
    _check_names(values)
    check_fleet(values)
    if values["rotations"] > values["max_rotations"]:
        raise ConfigError(f"rotations ({values['rotations']}) exceeds max_rotations ({values['max_rotations']})")
    if values["max_questions"] > 4096:
        raise ConfigError("max_questions above 4096 is not supported")
    try:
        parse_retention(values["outcome_retention"])
    except ValueError as e:
        raise ConfigError(str(e)) from None


def is_loopback_name(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _wildcard(name: str) -> bool:
    return name == "*" or (name.startswith("*.") and "*" not in name[2:] and len(name) > 2)


def _check_numbers(v: Mapping[str, Any]) -> None:
    """Finite and in range (`_check_bounds`); the temperature and the head size have floors."""
    for name, value in v.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
    _check_bounds(v)
    if v["temperature"] < 1e-3:
        raise ConfigError(f"temperature must be between 0.001 and 1000, got {v['temperature']!r}")
    if v["max_head_bytes"] < 1024:
        raise ConfigError(f"max_head_bytes must be at least 1024, got {v['max_head_bytes']!r}")


def _check_bounds(v: Mapping[str, Any]) -> None:
    """Ports, positive and non-negative settings, upper bounds, fractions."""
    for name in ("port", "sglang_port", "vllm_port"):
        if not 1 <= v[name] <= 65535:
            raise ConfigError(f"{name} must be a port number (1-65535), got {v[name]!r}")
    for name in _POSITIVE:
        if v[name] <= 0:
            raise ConfigError(f"{name} must be positive, got {v[name]!r}")
    for name in _NOT_NEGATIVE:
        if v[name] < 0:
            raise ConfigError(f"{name} must not be negative, got {v[name]!r}")
    for name, top in _AT_MOST.items():
        if v[name] > top:
            raise ConfigError(f"{name} must be at most {top}, got {v[name]!r}")
    for name in _FRACTIONS:
        if not 0.0 <= v[name] <= 1.0:
            raise ConfigError(f"{name} must be between 0 and 1, got {v[name]!r}")


def _check_names(v: Mapping[str, Any]) -> None:
    """The settings that name one of a few choices, hosts or networks."""
    if v["log_format"] not in ("text", "json"):
        raise ConfigError(f"log_format must be text or json, got {v['log_format']!r}")
    if v["log_level"].lower() not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError(f"log_level must be debug, info, warning, error or critical, got {v['log_level']!r}")
    if v["readout"] not in READOUT_NAMES:
        raise ConfigError(f"readout must be one of {', '.join(READOUT_NAMES)}, got {v['readout']!r}")
    if v["docs"] not in ("public", "auth", "off"):
        raise ConfigError(f"docs must be public, auth or off, got {v['docs']!r}")
    for name in v["allowed_hosts"]:
        if not name or any(c.isspace() or c in "/@" for c in name) or ("*" in name and not _wildcard(name)):
            raise ConfigError(f"allowed_hosts: {name!r} is not a host name, `*.domain` or `*`")
    for entry in v["trusted_proxies"]:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"trusted_proxies: {entry!r} is not an IP address or network") from None
