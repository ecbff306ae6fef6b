"""Engine implementations of the core's Engine port, behind a registry with lazy imports
(so `openjev schema` and the API tests never import torch)."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from openjev.config import Settings
from openjev.core.ports import ChatTokenizer, Engine
from openjev.errors import ConfigError


@dataclass(frozen=True)
class ModelCard:
    """What GET /v1/models says about the served model."""

    name: str
    description: str
    release_date: str  # YYYY-MM-DD
    fingerprint: str = ""  # the weights' identity (hf_model.weights_fingerprint); "" where unknown


@dataclass(frozen=True)
class LoadedEngine:
    engine: Engine
    tokenizer: ChatTokenizer
    card: ModelCard
    load_seconds: float
    # Starts watching what the engine depends on (a child server); calls its argument with
    # the reason if that dies. None where there is nothing to watch.
    supervise: Callable[[Callable[[BaseException], None]], None] | None = None
    # Asks whatever the engine reaches over the network whether it answers now: None if it
    # does, else why not (GET /health reports it). None where the engine is in-process.
    probe: Callable[[], Awaitable[str | None]] | None = None


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
