"""Calibration files bound to the fake model of tests/api (its name, an empty fingerprint and
this prompt version), written for a running_app's `calibration=` setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openjev.core import calibration as calib
from openjev.core.wording import PROMPT_VERSION


def fake_model_calibration(folder: Path, cal_id: str, fits: list[dict[str, Any]], defaults: dict[str, Any]) -> str:
    """The file's path: `fits` and `defaults` as in a shipped file, for the fake model."""
    doc = {
        "format": calib.FORMAT,
        "id": cal_id,
        "model": {"name": "fake-model-1", "fingerprint": ""},
        "prompt_version": PROMPT_VERSION,
        "base_temperature": 1.0,
        "fits": fits,
        "defaults": defaults,
    }
    path = folder / "cal.json"
    path.write_text(json.dumps(doc))
    return str(path)
