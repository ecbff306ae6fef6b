"""Calibration files shipped with openjev, and the choice of which one a server applies.

`--calibration auto` (the default) applies the shipped file made for the served model's
weights, prompt version and base temperature, if there is one (the embedded model has
one, fitted on evals/data/dev.jsonl); `none` applies nothing; a path applies that file
and refuses to serve if it was made for another model, prompt or temperature.
"""

from __future__ import annotations

import json
import logging
from importlib import resources

from openjev.core import calibration as calib
from openjev.errors import ConfigError

log = logging.getLogger(__name__)


def shipped() -> list[calib.Calibration]:
    """Every calibration file in this package."""
    found = []
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            found.append(calib.from_dict(json.loads(entry.read_text()), f"openjev/calibrations/{entry.name}"))
    return found


def preflight(setting: str) -> None:
    """Fail fast (ConfigError) on a --calibration path that is missing or malformed."""
    if setting not in ("auto", "none"):
        calib.load(setting)


def select(setting: str, *, fingerprint: str, prompt_version: str, base_temperature: float) -> calib.Calibration | None:
    """The calibration to apply; raises ConfigError for a given file that does not fit."""
    if setting == "none":
        return None
    if setting != "auto":
        chosen = calib.load(setting)
        calib.check_binding(
            chosen, fingerprint=fingerprint, prompt_version=prompt_version, base_temperature=base_temperature
        )
        return chosen
    for candidate in shipped():
        try:
            calib.check_binding(
                candidate, fingerprint=fingerprint, prompt_version=prompt_version, base_temperature=base_temperature
            )
        except ConfigError:
            continue
        return candidate
    log.info("no shipped calibration for this model (fingerprint %s); answers are uncalibrated", fingerprint)
    return None
