"""Fixed ranges and names that settings are checked against; not settings themselves."""

from __future__ import annotations

# core.readouts.READOUT_NAMES (config sits below core: tests/test_cli_config.py keeps them equal)
READOUTS = ("letters", "yesno", "parallel", "canonical", "mirror")

# The contract's fixed ranges (docs/api-jev.md); not settings: clients rely on them.
MIN_CHOICE_OPTIONS = 2
MAX_CHOICE_OPTIONS = 255
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10
