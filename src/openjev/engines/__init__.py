"""Engine implementations of the core's Engine port, behind a registry with lazy imports
(so `openjev schema` and the API tests never import torch)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from openjev.config import Settings
from openjev.engines.loaded import LoadedEngine, ModelCard
from openjev.errors import ConfigError

__all__ = ["ENGINES", "EngineEntry", "LoadedEngine", "ModelCard", "load_engine", "preflight_engine"]


@dataclass(frozen=True)
class EngineEntry:
    """ "module:function" targets, each called with sections of the settings (attributes of
    Settings, in order), never the whole: `load(*sections) -> LoadedEngine` may take seconds;
    `preflight(*preflight_sections) -> None` is cheap, imports no ML framework, and raises ConfigError
    for settings that cannot work (checked before the server starts listening)."""

    load: str
    preflight: str
    sections: tuple[str, ...]
    preflight_sections: tuple[str, ...] = ("served",)


_IN_PROCESS = ("served", "inprocess")
# The HTTP engines' calls take the engine deadline and Retry-After of the limits.
_REMOTE = ("served", "remote", "limits")


ENGINES: dict[str, EngineEntry] = {
    "transformers": EngineEntry(
        load="openjev.engines.inprocess:load", preflight="openjev.engines.hf_model:preflight", sections=_IN_PROCESS
    ),
    "sglang": EngineEntry(
        load="openjev.engines.sglang:load",
        preflight="openjev.engines.sglang:preflight",
        sections=_REMOTE,
        preflight_sections=("served", "remote"),
    ),
    "vllm": EngineEntry(
        load="openjev.engines.vllm:load",
        preflight="openjev.engines.vllm:preflight",
        sections=_REMOTE,
        preflight_sections=("served", "remote"),
    ),
    "llamacpp": EngineEntry(
        load="openjev.engines.llamacpp:load", preflight="openjev.engines.llamacpp:preflight", sections=_IN_PROCESS
    ),
}


def _call(target: str, sections: tuple[str, ...], settings: Settings):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)(*(getattr(settings, s) for s in sections))


def _entry(settings: Settings) -> EngineEntry:
    entry = ENGINES.get(settings.served.engine)
    if entry is None:
        raise ConfigError(f"unknown engine {settings.served.engine!r}; known: {', '.join(sorted(ENGINES))}")
    return entry


def preflight_engine(settings: Settings) -> None:
    entry = _entry(settings)
    _call(entry.preflight, entry.preflight_sections, settings)


def load_engine(settings: Settings) -> LoadedEngine:
    """Load the engine named by --engine (blocking: may take seconds)."""
    entry = _entry(settings)
    return _call(entry.load, entry.sections, settings)
