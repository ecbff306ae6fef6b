"""The one Settings object, made of sections (config/sections.py, config/engines.py,
config/tasks.py) that each component receives alone; every default is defined there, once.

Each field has an `OPENJEV_<NAME>` environment twin and a `--<name>` flag on
`openjev serve` (the CLI builds its flags from `setting_fields()`). Precedence: flag, then
environment, then the default. Settings are read once, at startup. `load_settings` and
`replace_settings` take flat field names (`{"dtype": "float32"}`): each name belongs to one
section.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from openjev.config.checks import is_loopback_name, validate
from openjev.config.engines import (
    DEFAULT_ENGINE,
    DEFAULT_MODEL,
    EMBEDDED_MODEL,
    INSTALL_DEFAULT,
    InProcessSettings,
    RemoteSettings,
    ServedSettings,
)
from openjev.config.fields import ENV_PREFIX, env_name, flag_name, parse_value
from openjev.config.fleet import FleetSettings
from openjev.config.ranges import MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS, MIN_CHOICE_OPTIONS, MIN_SCORE_LEVELS
from openjev.config.sections import (
    ConnectionSettings,
    KeySettings,
    LimitSettings,
    ListenSettings,
    LogSettings,
    QualitySettings,
)
from openjev.config.tasks import TaskSettings

__all__ = [
    "DEFAULT_ENGINE",
    "DEFAULT_MODEL",
    "EMBEDDED_MODEL",
    "ENV_PREFIX",
    "INSTALL_DEFAULT",
    "MAX_CHOICE_OPTIONS",
    "MAX_SCORE_LEVELS",
    "MIN_CHOICE_OPTIONS",
    "MIN_SCORE_LEVELS",
    "ConnectionSettings",
    "FleetSettings",
    "InProcessSettings",
    "KeySettings",
    "LimitSettings",
    "ListenSettings",
    "LogSettings",
    "QualitySettings",
    "RemoteSettings",
    "ServedSettings",
    "Settings",
    "TaskSettings",
    "env_name",
    "flag_name",
    "flat_values",
    "is_loopback_name",
    "load_settings",
    "replace_settings",
    "section_of",
    "setting_fields",
]


@dataclass(frozen=True)
class Settings:
    """Every section; the order of the fields is the order of `openjev serve --help`."""

    listen: ListenSettings = field(default_factory=ListenSettings)
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    served: ServedSettings = field(default_factory=ServedSettings)
    quality: QualitySettings = field(default_factory=QualitySettings)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    keys: KeySettings = field(default_factory=KeySettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    inprocess: InProcessSettings = field(default_factory=InProcessSettings)
    logging: LogSettings = field(default_factory=LogSettings)
    tasks: TaskSettings = field(default_factory=TaskSettings)

    def validate(self) -> Settings:
        """Every setting checked (config/checks.py); returns self."""
        validate(flat_values(self))
        return self


def _sections() -> dict[str, type]:
    """Section attribute -> its dataclass, in Settings' order."""
    return {f.name: f.default_factory for f in dataclasses.fields(Settings)}  # type: ignore[misc]


def setting_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(section attribute, field) of every setting, in Settings' order."""
    for section, cls in _sections().items():
        for f in dataclasses.fields(cls):
            yield section, f


def _section_index() -> dict[str, str]:
    """Flat setting name -> its section; a name in two sections is a bug (flags and env names are flat)."""
    index: dict[str, str] = {}
    for section, f in setting_fields():
        if f.name in index:
            raise TypeError(f"setting {f.name} is in two sections: {index[f.name]} and {section}")
        index[f.name] = section
    return index


_SECTION_OF = _section_index()


def section_of(name: str) -> str:
    """The section attribute that holds the flat setting `name` (KeyError for an unknown one)."""
    return _SECTION_OF[name]


def flat_values(settings: Settings) -> dict[str, Any]:
    """Every setting by its flat name."""
    return {f.name: getattr(getattr(settings, section), f.name) for section, f in setting_fields()}


def _grouped(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if name not in _SECTION_OF:
            raise TypeError(f"unknown setting {name!r}")
        grouped.setdefault(_SECTION_OF[name], {})[name] = value
    return grouped


def replace_settings(settings: Settings, **values: Any) -> Settings:
    """A copy with the flat-named settings replaced (not validated: `load_settings` validates)."""
    changed = {
        section: dataclasses.replace(getattr(settings, section), **given) for section, given in _grouped(values).items()
    }
    return dataclasses.replace(settings, **changed)


def load_settings(overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from defaults, then `OPENJEV_*` environment, then explicit overrides.

    `overrides` holds already-typed values by flat name (from CLI flags); None values are ignored.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for _, f in setting_fields():
        raw = environ.get(env_name(f))
        if raw is not None:
            values[f.name] = parse_value(f, raw)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = value
    return replace_settings(Settings(), **values).validate()
