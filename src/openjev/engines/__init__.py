"""Engine implementations of the core's Engine port, by family (torch/, llamacpp/, http/;
model sources and files in models/), behind a registry whose entries import their family
only when called (so `openjev schema` and the API tests never import torch).

Each entry is a pair of plain functions, not "module:function" strings: the imports they
make are visible to readers, type checkers and the architecture tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openjev.config import Settings
from openjev.engines.loaded import LoadedEngine, ModelCard
from openjev.errors import ConfigError

__all__ = ["ENGINES", "EngineEntry", "LoadedEngine", "ModelCard", "load_engine", "preflight_engine", "prestart_engine"]


@dataclass(frozen=True)
class EngineEntry:
    """`load(*sections) -> LoadedEngine` may take seconds; `preflight(*preflight_sections)
    -> None` is cheap, imports no ML framework, and raises ConfigError for settings that
    cannot work (checked before the server starts listening). `prestart(*prestart_sections)
    -> None`, where an engine declares one, returns at once, having begun on a thread of its
    own what `load` would do first (the CLI calls it once the settings passed preflight, before
    it imports the service, so the two overlap); `load` then takes that work over, and a
    failure in it is `load`'s. Each is called with sections of the settings (attributes of
    Settings, in order), never the whole."""

    load: Callable[..., LoadedEngine]
    preflight: Callable[..., None]
    sections: tuple[str, ...]
    preflight_sections: tuple[str, ...] = ("served",)
    prestart: Callable[..., None] | None = None
    prestart_sections: tuple[str, ...] = ("served",)


_IN_PROCESS = ("served", "inprocess")
# The HTTP engines' calls take the engine deadline and Retry-After of the limits.
_REMOTE = ("served", "remote", "limits")


def _torch_load(*sections: Any) -> LoadedEngine:
    from openjev.engines.torch import engine

    return engine.load(*sections)


def _torch_preflight(*sections: Any) -> None:
    from openjev.engines.models import converted

    converted.preflight(*sections)


def _sglang_load(*sections: Any) -> LoadedEngine:
    from openjev.engines.http import sglang

    return sglang.load(*sections)


def _sglang_preflight(*sections: Any) -> None:
    from openjev.engines.http import sglang

    sglang.preflight(*sections)


def _vllm_load(*sections: Any) -> LoadedEngine:
    from openjev.engines.http import vllm

    return vllm.load(*sections)


def _vllm_preflight(*sections: Any) -> None:
    from openjev.engines.http import vllm

    vllm.preflight(*sections)


def _llamacpp_load(*sections: Any) -> LoadedEngine:
    from openjev.engines.llamacpp import load

    return load.load(*sections)


def _llamacpp_preflight(*sections: Any) -> None:
    from openjev.engines.llamacpp import load

    load.preflight(*sections)


def _llamacpp_prestart(*sections: Any) -> None:
    from openjev.engines.llamacpp import load

    load.prestart(*sections)


ENGINES: dict[str, EngineEntry] = {
    "transformers": EngineEntry(load=_torch_load, preflight=_torch_preflight, sections=_IN_PROCESS),
    "sglang": EngineEntry(
        load=_sglang_load, preflight=_sglang_preflight, sections=_REMOTE, preflight_sections=("served", "remote")
    ),
    "vllm": EngineEntry(
        load=_vllm_load, preflight=_vllm_preflight, sections=_REMOTE, preflight_sections=("served", "remote")
    ),
    "llamacpp": EngineEntry(
        load=_llamacpp_load,
        preflight=_llamacpp_preflight,
        sections=_IN_PROCESS,
        prestart=_llamacpp_prestart,
        prestart_sections=_IN_PROCESS,
    ),
}


def _entry(settings: Settings) -> EngineEntry:
    entry = ENGINES.get(settings.served.engine)
    if entry is None:
        raise ConfigError(f"unknown engine {settings.served.engine!r}; known: {', '.join(sorted(ENGINES))}")
    return entry


def preflight_engine(settings: Settings) -> None:
    entry = _entry(settings)
    entry.preflight(*(getattr(settings, s) for s in entry.preflight_sections))


def prestart_engine(settings: Settings) -> None:
    """Begin the engine's load in the background where its entry declares a prestart (after
    `preflight_engine` passed); nothing otherwise. `load_engine` takes it over."""
    entry = _entry(settings)
    if entry.prestart is not None:
        entry.prestart(*(getattr(settings, s) for s in entry.prestart_sections))


def load_engine(settings: Settings) -> LoadedEngine:
    """Load the engine named by --engine (blocking: may take seconds)."""
    entry = _entry(settings)
    return entry.load(*(getattr(settings, s) for s in entry.sections))
