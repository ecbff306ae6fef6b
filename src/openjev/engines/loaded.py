"""What an engine's `load` returns: the engine with its tokenizer and model card. Apart from
the registry (engines/__init__.py), which the engines' modules therefore never import back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from openjev.core.ports import ChatTokenizer, Engine


@dataclass(frozen=True)
class ModelCard:
    """What GET /v1/models says about the served model."""

    name: str
    description: str
    release_date: str  # YYYY-MM-DD
    fingerprint: str = ""  # the weights' identity (models.source.weights_fingerprint); "" where unknown
    # The model's positions: the longest branch it is read over (a longer one is refused
    # before any work); None where the engine does not know it (the engine server checks).
    context_length: int | None = None


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
