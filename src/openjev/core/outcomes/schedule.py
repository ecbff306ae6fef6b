"""When a task fed by outcomes is refitted: after every `every` new outcomes, at most once
per `min_interval_s`, and only once it has the readings a fit needs. Pure: the caller keeps
the counts and the clock."""

from __future__ import annotations

from dataclasses import dataclass

from openjev.core.task_fit import MIN_EXAMPLES

REFIT_EVERY = 10  # new outcomes between refits
REFIT_MIN_INTERVAL_S = 30.0  # at most one refit of a task per this many seconds


@dataclass(frozen=True)
class Refit:
    """`now`: refit now; else `after_s`: seconds until a refit is due (None: not due at all)."""

    now: bool
    after_s: float | None = None


def refit_due(
    pending: int,
    readings: int,
    last_fit: float | None,
    now: float,
    every: int = REFIT_EVERY,
    min_interval_s: float = REFIT_MIN_INTERVAL_S,
) -> Refit:
    """Whether a task with `pending` outcomes since its last fit (at `last_fit`; None: never
    fitted) and `readings` in all (examples and outcomes) is refitted now, later, or not.
    A task never fitted is fitted as soon as it has MIN_EXAMPLES readings."""
    if readings < MIN_EXAMPLES or pending <= 0:
        return Refit(False)
    if last_fit is None:
        return Refit(True)
    if pending < every:
        return Refit(False)
    wait = last_fit + min_interval_s - now
    return Refit(True) if wait <= 0 else Refit(False, wait)
