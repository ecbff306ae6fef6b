"""How a setting is named and parsed: each field of a section has an `OPENJEV_<NAME>`
environment twin and a `--<name>` flag on `openjev serve`, from its flat field name (unique
across the sections) unless its metadata names them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from openjev.errors import ConfigError

ENV_PREFIX = "OPENJEV_"


def opt(default: Any, help: str, **extra: Any) -> Any:
    """A setting: its one default, its help text, and optional `flag`, `env`, `metavar`, `comma`."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "openjev")


def env_name(f: dataclasses.Field) -> str:
    return ENV_PREFIX + f.metadata.get("env", f.name.upper())


def flag_name(f: dataclasses.Field) -> str:
    return "--" + f.metadata.get("flag", f.name.replace("_", "-"))


def parse_value(f: dataclasses.Field, raw: str) -> Any:
    """Parse one environment string into the field's type."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind.startswith("tuple"):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError("expected true or false")
        if kind.startswith("str | None"):
            return raw or None
        return raw
    except ValueError as e:
        raise ConfigError(f"{env_name(f)}={raw!r}: {e}") from None
