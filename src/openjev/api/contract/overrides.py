"""Per-request overrides of the readout, through request headers (so the official SDK,
which cannot add body fields, keeps working unchanged):

- `x-openjev-readout: letters | yesno | parallel` (parallel: in-process engine; others read
  letters with 4 rotations, and `x-openjev-readout` in the response says so)
- `x-openjev-rotations: N` (letters only; 1..--max-rotations in plain ASCII digits, so `0_0_4`
  or `+4` is refused rather than read as 4; default: the server's --rotations).
  Without a readout header on a server whose default is parallel, it asks for letters
  (`x-openjev-rotations: 1` is the raw single reading on every server).
- `x-openjev-calibration: none` answers uncalibrated (what `openjev calibrate` fits on), a
  task's fit included; `default` (or absent) applies the server's calibration where it has a fit.

A bad value is a 422 with `detail[]` pointing at the header, like any validation error.
A header sent more than once is a 400 (which one counts is not guessed), and a value is
trimmed of HTTP's own whitespace only (space, tab): `4\xa0` is not read as 4.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from fastapi.exceptions import RequestValidationError

from openjev.config import QualitySettings
from openjev.core.readouts import CANONICAL_ORDER, READOUT_NAMES, ReadoutSpec
from openjev.errors import RequestError

READOUT_HEADER = "x-openjev-readout"
ROTATIONS_HEADER = "x-openjev-rotations"
CALIBRATION_HEADER = "x-openjev-calibration"
# A task of the calling key whose fit answers the request (api/server/task_binding.py): named
# by this header or the Jev body's `x_task`, in this form. `x-openjev-calibration: none` wins
# over it (the raw reading).
TASK_HEADER = "x-openjev-task"
TASK_ID_PATTERN = r"^task_[0-9a-f]{24}$"
_DIGITS = re.compile(r"[0-9]{1,4}")  # int() would also take "0_0_4", "+4" and non-ASCII digits
_OWS = " \t"  # HTTP's optional whitespace; str.strip() would also drop \xa0 and other Unicode spaces


def _once(headers: Mapping[str, str]) -> None:
    """400 for a readout header sent more than once."""
    getlist = getattr(headers, "getlist", None)
    if getlist is None:
        return
    for header in (READOUT_HEADER, ROTATIONS_HEADER, CALIBRATION_HEADER):
        count = len(getlist(header))
        if count > 1:
            raise RequestError(f"header {header} was sent {count} times; send it once")


def _invalid(header: str, value: str, msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("header", header), "type": "value_error", "msg": msg, "input": value}])


def default_spec(quality: QualitySettings) -> ReadoutSpec:
    """--readout/--rotations as a spec. --rotations set away from its default under a readout
    that reads one order (parallel, canonical) asks for letters, as the rotations header does."""
    if quality.readout in CANONICAL_ORDER and quality.rotations_moved():
        return ReadoutSpec("letters", quality.rotations)
    return ReadoutSpec(quality.readout, quality.rotations)


def decide_options(headers: Mapping[str, str], quality: QualitySettings) -> tuple[ReadoutSpec | None, bool]:
    """(readout spec, whether to calibrate) for one request. The spec is None where neither
    readout header was sent: the service's default applies (which may be the served model's
    measured one, from its calibration file). A header sent alone takes the other part from
    --readout/--rotations."""
    _once(headers)
    if READOUT_HEADER not in headers and ROTATIONS_HEADER not in headers:
        return None, _calibrate(headers)
    name = headers.get(READOUT_HEADER, quality.readout).strip(_OWS).lower()
    if name not in READOUT_NAMES:
        raise _invalid(READOUT_HEADER, name, f"unknown readout; expected one of: {', '.join(READOUT_NAMES)}")
    raw = headers.get(ROTATIONS_HEADER)
    rotations = quality.rotations
    if raw is not None:
        if not _DIGITS.fullmatch(raw.strip(_OWS)):
            raise _invalid(ROTATIONS_HEADER, raw, "rotations must be a whole number in plain digits (e.g. 4)")
        rotations = int(raw.strip(_OWS))
        if not 1 <= rotations <= quality.max_rotations:
            raise _invalid(ROTATIONS_HEADER, raw, f"rotations must be between 1 and {quality.max_rotations}")
    if raw is not None and READOUT_HEADER not in headers and name in CANONICAL_ORDER:
        name = "letters"  # rotations are a letters parameter: asking for them asks for letters
    return ReadoutSpec(name, rotations), _calibrate(headers)


def _calibrate(headers: Mapping[str, str]) -> bool:
    cal = headers.get(CALIBRATION_HEADER, "default").strip(_OWS).lower()
    if cal not in ("default", "none"):
        raise _invalid(CALIBRATION_HEADER, cal, "expected 'default' or 'none'")
    return cal == "default"
