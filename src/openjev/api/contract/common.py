"""What every wire format shares once its body is parsed: the caller's values as the text
the model sees (`text_of`), the model a request names (`resolve_model`), and a result's
`x-openjev-*` and `Server-Timing` headers (`result_headers`)."""

from __future__ import annotations

import json
from typing import Any

from openjev.core import types as core
from openjev.errors import InvalidInput, ModelNotFound


def text_of(value: Any) -> str:
    """Text as the model sees it: strings as they are, anything else as compact JSON.
    Requests reach here through api/contract/strict_json.py (finite numbers, bounded depth, no lone
    surrogates); anything else that cannot be written is a 422, never a 500."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise InvalidInput("a value nests too deeply to be shown to the model") from None
    except (ValueError, TypeError) as e:
        raise InvalidInput(f"a value cannot be shown to the model as JSON: {e}") from None


def resolve_model(requested: str, served: str) -> str:
    """The concrete model that answers `requested`: the served name, `jev-latest` or any
    `jev-*` alias; anything else is not found."""
    if requested == served or requested == "jev" or requested.startswith("jev-"):
        return served
    shown = repr(requested[:80]) + (f" ({len(requested) - 80} more characters)" if len(requested) > 80 else "")
    raise ModelNotFound(f"model {shown} is not served here; use {served!r} or a jev-* alias such as jev-latest")


BASIS_HEADER = "x-openjev-calibration-basis"


def basis_header(fits: tuple[core.FitBasis, ...]) -> str:
    """Each distinct fit that answered, in question order: its name (`none`: the raw reading)
    and `basis=` task (with the examples and outcomes it was fitted on and its
    cross-validated ECE), global (the shipped fit, not checked on the caller's text) or none."""
    parts = []
    for fit in dict.fromkeys(fits):
        part = f"{fit.name or 'none'}; basis={fit.kind}"
        if fit.kind == "task":
            ece = "unknown" if fit.cv_ece is None else f"{fit.cv_ece:.4f}"
            part += f"; examples={fit.examples}; outcomes={fit.outcomes}; cv_ece={ece}"
        parts.append(part)
    return ", ".join(parts)


def result_headers(result: core.DecisionResult) -> dict[str, str]:
    headers = {
        "x-openjev-prefix-tokens": str(result.prefix_tokens),
        "x-openjev-readout": result.readout,
        "x-openjev-calibration": result.calibration or "none",
    }
    if result.fits:
        headers[BASIS_HEADER] = basis_header(result.fits)
    if result.usage.cached_tokens is not None:
        headers["x-openjev-cached-tokens"] = str(result.usage.cached_tokens)
    if result.usage.computed_tokens is not None:
        headers["x-openjev-computed-tokens"] = str(result.usage.computed_tokens)
    headers["Server-Timing"] = ", ".join(f"{name};dur={ms:.1f}" for name, ms in result.timings_ms.items())
    return headers
