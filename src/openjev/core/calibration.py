"""Calibration: pure functions applied to a readout's option probabilities.

Per question type and per readout, a fit holds a temperature T and a per-position prior
correction b (log-space, added at option position i; positions past its end get 0):

    p'_i  proportional to  exp(log p_i / T + b_i)

T > 1 softens an over-confident model, T < 1 sharpens; b removes a preference for some
positions (a small model's "A"). Position i is the option's index in the request (noul:
0 = true, 1 = false; score: the level). Fitting lives beside the server (`openjev
calibrate`, numpy/scipy); the request path only applies a fit.

A calibration file may also name the model's measured defaults (`"defaults"`): the readout
(and rotations) the server reads with when its operator chose none, and the abstain rule's
floors; both chosen on the same dev data as the fits (evals/quality_model_table.py). The
default readout must be one the file has a fit for. It may name another readout per
question type (`"per_type": {"choice": {"readout": "yesno"}}`), each with its fit.

A calibration file is bound to what produced its inputs: the model's weights
fingerprint, the prompt wording's version, the base softmax temperature, and per fit the
readout and rotations. Anything else is refused (`check_binding`), because a fit for
other log-probs would silently mis-state every probability.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjev.core.abstain import AbstainRule
from openjev.core.content_free import divide
from openjev.core.readouts import ReadoutSpec
from openjev.errors import ConfigError

FORMAT = "openjev-calibration/1"
QUESTION_TYPES = ("noul", "choice", "score")
_FLOOR = 1e-12  # log(0) guard: a zero probability stays (practically) zero


@dataclass(frozen=True)
class TypeFit:
    """`position_prior`: per option count n, the probability the model puts on each letter
    position regardless of the options (PriDe, estimated without labels); an answer read in
    one lettered ordering is divided by it position by position before T applies, an answer
    read in one ordering and its reverse by its symmetrised form (the geometric mean of
    positions j and n-1-j). Empty: none. `content_free`: the answer is first divided by the
    question's content-free answer (core/content_free.py), which the service reads."""

    temperature: float
    bias: tuple[float, ...] = ()
    position_prior: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    content_free: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and positive, got {self.temperature!r}")
        if not all(math.isfinite(b) for b in self.bias):
            raise ValueError("bias values must be finite")
        for n, prior in self.position_prior.items():
            if len(prior) != n or not all(math.isfinite(p) and p > 0 for p in prior):
                raise ValueError(f"position prior for {n} options must be {n} positive numbers")


@dataclass(frozen=True)
class ReadoutFit:
    spec: ReadoutSpec
    types: Mapping[str, TypeFit]


@dataclass(frozen=True)
class Calibration:
    id: str
    model_name: str
    fingerprint: str
    prompt_version: str
    base_temperature: float
    fits: tuple[ReadoutFit, ...]
    source: str = ""
    default_readout: ReadoutSpec | None = None  # the model's measured default readout, if named
    default_abstain: AbstainRule | None = None  # the model's measured abstain floors, if named

    def fit_for(self, spec: ReadoutSpec, qtype: str) -> TypeFit | None:
        for fit in self.fits:
            if fit.spec == spec:
                return fit.types.get(qtype)
        return None

    def covers(self, spec: ReadoutSpec) -> bool:
        """Whether it has a fit for `spec` (a per-type readout: for any of its parts)."""
        return any(fit.spec == part for fit in self.fits for part in spec.parts())


def apply(
    fit: TypeFit,
    probs: Sequence[float],
    shown: Sequence[int] | None = None,
    clones: Sequence[Sequence[int]] = (),
    mirrored: bool = False,
    free: Sequence[float] | None = None,
) -> tuple[float, ...]:
    """Calibrated probabilities (same length, sum 1). `shown`: the option at each letter of
    the one ordering read (Combined.shown), for the fit's position prior; without it (or
    without a prior for this many options) none is applied. `mirrored` (Combined.mirrored):
    `shown` was read in both directions, so the prior applies symmetrised and a reversed
    ordering still gets the mirrored answer. `clones`: groups of options that must keep one
    probability (Combined.clones): the prior of their letters is shared. `free`: the
    question's content-free answer, divided out first (where the fit says so)."""
    if free is not None:
        probs = divide(probs, free)
    logs = [math.log(max(p, _FLOOR)) for p in probs]
    prior = fit.position_prior.get(len(probs)) if shown is not None else None
    if prior is not None and shown is not None:
        last = len(shown) - 1
        for position, option in enumerate(shown):
            if mirrored:
                logs[option] -= (math.log(prior[position]) + math.log(prior[last - position])) / 2
            else:
                logs[option] -= math.log(prior[position])
        for members in clones:
            mean = math.fsum(logs[i] for i in members) / len(members)
            for i in members:
                logs[i] = mean
    z = [v / fit.temperature + (fit.bias[i] if i < len(fit.bias) else 0.0) for i, v in enumerate(logs)]
    top = max(z)
    w = [math.exp(v - top) for v in z]
    total = math.fsum(w)
    return tuple(v / total for v in w)


def check_binding(cal: Calibration, *, fingerprint: str, prompt_version: str, base_temperature: float) -> None:
    """Raise ConfigError (with what differs) unless `cal` was made for exactly these inputs."""
    problems = []
    if cal.fingerprint != fingerprint:
        problems.append(
            f"it was fitted for model {cal.model_name!r} with weights fingerprint {cal.fingerprint}, "
            f"this server's model has {fingerprint}"
        )
    if cal.prompt_version != prompt_version:
        problems.append(
            f"it was fitted for prompt version {cal.prompt_version!r}, this server renders version {prompt_version!r}"
        )
    if not math.isclose(cal.base_temperature, base_temperature):
        problems.append(
            f"it was fitted at --temperature {cal.base_temperature:g}, this server uses {base_temperature:g}"
        )
    if problems:
        where = f" ({cal.source})" if cal.source else ""
        raise ConfigError(
            f"calibration {cal.id!r}{where} does not fit this server: "
            + "; ".join(problems)
            + ". Refit it with `openjev calibrate`, or serve with --calibration none."
        )


def from_dict(data: Mapping[str, Any], source: str = "") -> Calibration:
    """Parse a calibration document; raises ConfigError for anything malformed."""
    try:
        if data.get("format") != FORMAT:
            raise ValueError(f"format must be {FORMAT!r}, got {data.get('format')!r}")
        fits = [_fit_of(entry) for entry in data["fits"]]
        specs = [f.spec for f in fits]
        if len(set(specs)) != len(specs):
            raise ValueError("two fits for the same readout")
        defaults = data.get("defaults") or {}
        default_readout = None
        if "readout" in defaults:
            per_type = tuple(
                (str(qtype), ReadoutSpec(str(part["readout"]), int(part.get("rotations", 1))))
                for qtype, part in (defaults.get("per_type") or {}).items()
            )
            default_readout = ReadoutSpec(str(defaults["readout"]), int(defaults.get("rotations", 1)), per_type)
            for part in default_readout.parts():
                if part not in specs:
                    raise ValueError(f"default readout {part.describe()!r} has no fit")
        default_abstain = None
        if "abstain" in defaults:
            floors = defaults["abstain"]
            default_abstain = AbstainRule(
                float(floors.get("min_label_mass", 0.0)),
                float(floors.get("min_order_agreement", 0.0)),
                float(floors.get("min_confidence", 0.0)),
            )
        return Calibration(
            id=str(data["id"]),
            model_name=str(data["model"]["name"]),
            fingerprint=str(data["model"]["fingerprint"]),
            prompt_version=str(data["prompt_version"]),
            base_temperature=float(data.get("base_temperature", 1.0)),
            fits=tuple(fits),
            source=source,
            default_readout=default_readout,
            default_abstain=default_abstain,
        )
    except (KeyError, TypeError, ValueError, AttributeError, ConfigError) as e:
        where = source or "calibration"
        raise ConfigError(f"{where}: not a valid calibration file: {e}") from None


def _fit_of(entry: Mapping[str, Any]) -> ReadoutFit:
    """One readout's fit, per question type; ValueError for an unknown type."""
    spec = ReadoutSpec(str(entry["readout"]), int(entry.get("rotations", 1)))
    types = {}
    for qtype, t in entry["types"].items():
        if qtype not in QUESTION_TYPES:
            raise ValueError(f"unknown question type {qtype!r}")
        prior = {int(n): tuple(float(p) for p in ps) for n, ps in (t.get("position_prior") or {}).items()}
        free = t.get("content_free", False)
        if not isinstance(free, bool):
            raise ValueError(f"{qtype}: content_free must be true or false, got {free!r}")
        types[qtype] = TypeFit(float(t["temperature"]), tuple(float(b) for b in t.get("bias", ())), prior, free)
    return ReadoutFit(spec, types)


def load(path: str | Path) -> Calibration:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"--calibration {str(path)!r}: cannot read it: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--calibration {str(path)!r}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--calibration {str(path)!r}: not a calibration document")
    return from_dict(data, str(path))
