"""Start-up wiring shared by the engines that reach a server over HTTP (sglang.py, vllm.py):
settings -> a started or connected server, checked, and a ready engine. Blocking; runs
before the server listens (preflight) or off the event loop (load).

What differs per server is a `ServerKind` (names, the child's command line) and two
hooks: `check(url, tokenizer) -> info` (refuse a server that cannot serve us, learn what
the engine needs) and `make(url, info) -> engine`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from openjev.config import DEFAULT_MODEL, LimitSettings, RemoteSettings, ServedSettings
from openjev.core.ports import ChatTokenizer
from openjev.core.types import Turn
from openjev.errors import ConfigError, ModelUnsuitable

if TYPE_CHECKING:
    from openjev.engines.http.engine import HTTPEngine
    from openjev.engines.http.server_process import ServerProcess
    from openjev.engines.loaded import LoadedEngine, ModelCard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerKind:
    """One kind of engine server, as its settings name it."""

    engine: str  # the --engine value, for messages ("sglang")
    name: str  # the server, for messages ("SGLang")
    python: str | None  # the interpreter to start a child with (--sglang-python), or None to --connect
    python_flag: str  # the setting that names it, for messages
    port: int  # the child's port
    module: str  # the child's `python -m` module
    model_flag: str  # the child's flag for the model folder
    child_args: tuple[str, ...]  # the child's further flags
    namespaces: str  # how API keys' cache namespaces reach the server, for the log


def preflight(served: ServedSettings, http: RemoteSettings, kind: ServerKind) -> None:
    """What every HTTP engine refuses before the server listens."""
    from openjev.engines.http.submission import STRATEGIES

    if http.strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {http.strategy!r}: expected one of {', '.join(STRATEGIES)}")
    if bool(http.connect) == bool(kind.python):
        raise ConfigError(f"--engine {kind.engine} needs exactly one of --connect URL or {kind.python_flag} PATH")
    if kind.python and served.model in (None, DEFAULT_MODEL):  # the default names a GGUF a child cannot load
        raise ConfigError(f"{kind.python_flag} needs --model (the model the child server loads)")
    tokenizer_folder(served, kind)


def tokenizer_folder(served: ServedSettings, kind: ServerKind) -> str:
    folder = served.tokenizer or served.model
    if not folder or not Path(folder).is_dir():
        raise ConfigError(
            f"the {kind.engine} engine tokenizes here: pass --model (or --tokenizer) as a local model folder "
            "with the same tokenizer as the server's model"
        )
    return folder


# A real rendered prompt with what tokenizers disagree on (accents, digits, dashes, tabs,
# newlines, an emoji).
PROBE_TEXT = "Prüfe: naïve café, 12,345.67 — tabs\tand\nnewlines 🙂 ok?"


def verify_tokenizer(tokenizer: ChatTokenizer, server_ids: Callable[[str], Sequence[int]]) -> bool:
    """Refuse a server whose tokenizer differs from ours: it would read other tokens than we
    planned. `server_ids(text)` asks the server for its token ids of `text`.

    True if the ids were compared and agree; False (with a warning) if the server could not
    tell (e.g. started with --skip-tokenizer-init); ModelUnsuitable if they differ.
    """
    probe = tokenizer.render([Turn("user", PROBE_TEXT)], add_generation_prompt=True) + "Answer:"
    ours = tokenizer.encode(probe)
    try:
        theirs = [int(t) for t in server_ids(probe)]
    except (httpx.HTTPError, KeyError, TypeError, ValueError, IndexError) as e:
        log.warning(
            "could not verify that the engine's tokenizer equals ours (%s); "
            "a server started with --skip-tokenizer-init cannot be checked",
            e,
        )
        return False
    if theirs[-len(ours) :] == ours and len(theirs) - len(ours) <= 1:  # the server may prepend a BOS
        log.info("the engine's tokenizer equals ours (%d probe tokens compared)", len(ours))
        return True
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    raise ModelUnsuitable(
        f"the engine's tokenizer differs from ours (first difference at token {at} of the probe: "
        f"ours {ours[at : at + 3]}, the engine's {theirs[at : at + 3]}); serve the same model on both sides"
    )


def load(
    served: ServedSettings,
    http: RemoteSettings,
    kind: ServerKind,
    *,
    check: Callable[[str, ChatTokenizer], dict[str, Any]],
    make: Callable[[str, dict[str, Any]], HTTPEngine],
) -> LoadedEngine:
    """Start (or reach) the server, wait for its /health, `check` it, and return the engine
    `make` builds, with the model card and, for a child, its supervision. A child is
    stopped if anything here fails. `info["model"]` (if the check learned it) names the
    served model."""
    from transformers import AutoTokenizer

    from openjev.engines.http.server_process import wait_healthy
    from openjev.engines.loaded import LoadedEngine
    from openjev.engines.models.tokenizer import HFChatTokenizer

    t0 = time.perf_counter()
    folder = tokenizer_folder(served, kind)
    tokenizer = HFChatTokenizer(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    url, process = _reach(served, http, kind)
    try:
        wait_healthy(url, http.startup_timeout_s, process.process if process else None, name=kind.name)
        info = check(url, tokenizer)
    except BaseException:
        if process is not None:
            process.stop()
        raise
    engine = make(url, info)
    engine.process = process
    model_path = str(info.get("model") or served.model)
    log.info("%s at %s serves %s; %s", kind.name, url, model_path, kind.namespaces)
    return LoadedEngine(
        engine=engine,
        tokenizer=tokenizer,
        card=_card(served, kind, model_path),
        load_seconds=time.perf_counter() - t0,
        supervise=process.watch if process is not None else None,
        probe=engine.probe,
    )


def _reach(served: ServedSettings, http: RemoteSettings, kind: ServerKind) -> tuple[str, ServerProcess | None]:
    """(the server's URL, the child started for it or None where --connect names one)."""
    from openjev.engines.http.server_process import ServerProcess

    if not kind.python:
        return str(http.connect).rstrip("/"), None  # set: preflight wants --connect without a child
    process = ServerProcess(
        python=kind.python,
        model=str(served.model),  # set: preflight refuses a child without --model
        port=kind.port,
        module=kind.module,
        model_flag=kind.model_flag,
        name=kind.name,
        python_flag=kind.python_flag,
        extra_args=kind.child_args,
    )
    process.start()
    return process.url, process


def _card(served: ServedSettings, kind: ServerKind, model_path: str) -> ModelCard:
    from openjev.engines.loaded import ModelCard
    from openjev.engines.models.source import file_date, weights_fingerprint

    local = Path(served.model) if served.model and Path(served.model).exists() else None
    return ModelCard(
        name=served.served_name or Path(model_path.rstrip("/")).name.lower(),
        description=f"{Path(model_path.rstrip('/')).name} served by {kind.name}",  # no paths, no URL
        release_date=file_date(local) if local else time.strftime("%Y-%m-%d"),
        fingerprint=weights_fingerprint(local) if local else "",
    )


def engine_options(http: RemoteSettings, limits: LimitSettings) -> dict[str, Any]:
    """The engine's settings every HTTP engine takes (keyword arguments of HTTPEngine)."""
    return {
        "strategy": http.strategy,
        "max_calls": http.max_engine_calls,
        "call_timeout_s": limits.engine_timeout_s,
        "warmup_min_tokens": http.warmup_min_tokens,
        "coalesce_calls": http.coalesce_calls,
        "retry_after_s": limits.retry_after_s,
    }
