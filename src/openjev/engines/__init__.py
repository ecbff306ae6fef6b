"""Engine implementations of the core's Engine port, behind a registry with lazy imports
(so `openjev schema` and the API tests never import torch)."""

from __future__ import annotations

import importlib
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


@dataclass(frozen=True)
class LoadedEngine:
    engine: Engine
    tokenizer: ChatTokenizer
    card: ModelCard
    load_seconds: float


# name -> "module:function"; the function takes Settings and returns a LoadedEngine.
ENGINES: dict[str, str] = {
    "transformers": "openjev.engines.inprocess:load",
}


def load_engine(settings: Settings) -> LoadedEngine:
    """Load the engine named by settings.engine (blocking: may take seconds)."""
    target = ENGINES.get(settings.engine)
    if target is None:
        raise ConfigError(f"unknown engine {settings.engine!r}; known: {', '.join(sorted(ENGINES))}")
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)(settings)
