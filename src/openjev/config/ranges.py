"""Fixed ranges that settings are checked against; not settings themselves (the readout
names are the core's, core/readouts/spec.py `READOUT_NAMES`)."""

from __future__ import annotations

# The contract's fixed ranges (docs/api-jev.md); not settings: clients rely on them.
MIN_CHOICE_OPTIONS = 2
MAX_CHOICE_OPTIONS = 255
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10
