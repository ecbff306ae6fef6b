"""Loading the llama.cpp engine: the checks before the server listens (`preflight`) and the
GGUF with its tokenizer (`load`), for the registry."""

from __future__ import annotations

import logging
import time

from openjev.config import InProcessSettings, ServedSettings
from openjev.engines.llamacpp.engine import LlamaCppEngine

log = logging.getLogger(__name__)


# Sequences per context: a plan's leaves (one per branch end below the root) run in one
# group up to this less one (the root's own).
N_SEQ_MAX = 64
# KV cells: one request's distinct tokens, cached positions included (the model's trained
# context where it is shorter); a larger request is refused before any work (422).
WORK_CELLS = 8192
N_BATCH = 512  # tokens per decode call: a cancellation boundary (about 1 s on 2 cores, 1.5B model)


def preflight(served: ServedSettings) -> None:
    """Cheap checks, llama.cpp not imported: the binding is installed, the model is a GGUF."""
    import importlib.util

    from openjev.engines.models.source import resolve_source
    from openjev.errors import ConfigError

    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(
            "--engine llamacpp needs llama-cpp-python: run scripts/setup_llamacpp.sh (or `make test-llamacpp`)"
        )
    if served.device not in ("auto", "cpu"):
        raise ConfigError(f"--engine llamacpp runs on the CPU; --device {served.device} is not served")
    source = resolve_source(served.model, served.cache_dir)
    if source.gguf_file is None:
        raise ConfigError("--engine llamacpp serves GGUF files: --model must be a .gguf file or a named model")


def load(served: ServedSettings, tuning: InProcessSettings):
    """Load the GGUF with llama.cpp and its Hugging Face tokenizer side by side (blocking)."""
    import concurrent.futures

    from openjev.engines.llamacpp.lib import LlamaCppBackend, cpu_threads
    from openjev.engines.loaded import LoadedEngine, ModelCard
    from openjev.engines.models.source import resolve_source, source_fingerprint
    from openjev.engines.models.tokenizer import HFChatTokenizer

    t0 = time.perf_counter()
    source = resolve_source(served.model, served.cache_dir)
    path = str(source.folder / (source.gguf_file or ""))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="openjev-llamacpp-load") as pool:
        # llama.cpp releases the GIL while it loads: the tokenizer (transformers' import
        # included) loads beside it
        backend_f = pool.submit(
            LlamaCppBackend,
            path,
            work_cells=WORK_CELLS,
            n_seq_max=N_SEQ_MAX,
            n_batch=N_BATCH,
            n_threads=cpu_threads(),
        )
        tokenizer = _hf_tokenizer(source, served.cache_dir)
        backend = backend_f.result()
    engine = LlamaCppEngine(backend, prefix_cache_bytes=tuning.prefix_cache_bytes)
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
    )
    return LoadedEngine(engine=engine, tokenizer=HFChatTokenizer(tokenizer), card=card, load_seconds=seconds)


def _hf_tokenizer(source, cache_dir: str):
    """The tokenizer the in-process engine uses for this GGUF: its converted copy where
    `openjev model install` (or a transformers run) made one, else read from the GGUF by
    the same transformers code that made that copy."""
    from openjev.engines.models.converted import COMPLETE, sizes_problem
    from openjev.engines.models.source import gguf_cache_folder

    cached = gguf_cache_folder(source, cache_dir)
    # sizes only: the hashes would read the float32 weights, which this engine never loads
    if (cached / COMPLETE).exists() and sizes_problem(cached) is None:
        return _named_tokenizer(cached)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file, local_files_only=True)


def _named_tokenizer(folder):
    """The tokenizer class the folder's tokenizer_config.json names, loaded as AutoTokenizer
    would load it, without AutoTokenizer's detour through the model's configuration classes,
    which import torch (4 s and about 220 MiB of this engine's start, measured on the 1.5B
    model's folder; this engine never runs torch). AutoTokenizer where no class is named."""
    import json

    import transformers

    try:
        name = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        name = None
    cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if cls is None or not issubclass(cls, transformers.PreTrainedTokenizerBase):
        return transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return cls.from_pretrained(folder, local_files_only=True)
