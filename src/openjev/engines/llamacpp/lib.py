"""The seam to llama.cpp: a model and one context over llama-cpp-python's low-level (ctypes) API.

Only what the engine needs: batches whose tokens carry their sequence ids, positions and
output flags; the log-probs of chosen ids at the flagged tokens; per-sequence KV operations.
The engine talks to `Backend`; unit tests put a named fake there (tests/engines/
test_llamacpp_engine.py). Imported only when the llama.cpp engine loads.

The context's KV cache is unified (kv_unified): one pool of `n_ctx` cells shared by every
sequence, so a cell of the shared state belongs to every branch's sequence at once, and
seq_cp only adds a sequence to cells (no copy). A sequence's cells are saved as bytes and
restored into another context state (llama_state_seq_get/set_data) for the prefix cache. Flash attention is off: without it a suffix
over cached cells computes what a full prefill computes (measured bitwise equal).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from openjev.engines.llamacpp.cache import SavedState
from openjev.engines.llamacpp.layout import Item
from openjev.errors import EngineError

log = logging.getLogger(__name__)


class Backend(Protocol):
    n_ctx: int  # KV cells, all sequences together
    n_ctx_train: int  # the longest sequence the model was trained for
    n_seq_max: int
    n_batch: int  # tokens per decode call
    n_vocab: int
    n_embd: int  # the hidden size (the cost model's prior for attention)
    bytes_per_cell: int  # KV bytes of one token position

    def decode(self, items: Sequence[Item], label_ids: Sequence[Sequence[int]]) -> list[tuple[float, ...]]:
        """Compute `items` (at most n_batch) into the KV cache; for each read of each item,
        in order, the log-probs of that read's `label_ids` under the full-vocabulary softmax.
        Raises EngineError where llama.cpp fails (the caller clears the sequences it used)."""
        ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def seq_rm(self, seq: int, p0: int = 0) -> None:
        """Remove `seq` from its cells at positions `p0` and after (cells no other sequence
        holds become free)."""
        ...

    def seq_save(self, seq: int) -> SavedState:
        """The KV of `seq`'s cells as bytes (llama_state_seq_get_data)."""
        ...

    def seq_restore(self, state: SavedState, seq: int) -> bool:
        """Put a saved state's cells into the empty sequence `seq`, at their positions;
        False where llama.cpp refuses it (no room, another model's state)."""
        ...

    def save_all(self) -> SavedState:
        """Every cell in use with the sequences it belongs to, as bytes (llama_state_seq_get_data
        of sequence -1): a request's context, set aside while another runs."""
        ...

    def restore_all(self, state: SavedState) -> bool:
        """The context emptied and a `save_all` state put back, each cell in its sequences at
        its position; False where llama.cpp refuses it."""
        ...

    def clear(self) -> None:
        """Every cell of every sequence freed."""
        ...

    def close(self) -> None: ...


def log_probs(logits: np.ndarray, ids: Sequence[int]) -> tuple[float, ...]:
    """Log-softmax over the whole vocabulary (float64), at `ids`."""
    row = logits.astype(np.float64)
    top = row.max()
    lse = top + np.log(np.exp(row - top).sum())
    return tuple(float(row[i] - lse) for i in ids)


_LOG_CALLBACK = None  # kept alive: llama.cpp holds the pointer


def _quiet(lc) -> None:
    """Route llama.cpp's log (hundreds of lines per load) to our debug log."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:

        def forward(_level, text, _data):
            if log.isEnabledFor(logging.DEBUG):
                log.debug("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

        _LOG_CALLBACK = lc.llama_log_callback(forward)
        lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


def cpu_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def forward_threads(setting: int) -> int:
    """Threads of a forward: `setting` where it is positive, else one fewer than the CPUs this
    process may use (at least one), which keeps a core for the API's own work."""
    return setting if setting > 0 else max(1, cpu_threads() - 1)


class LlamaCppBackend:
    """A GGUF loaded by llama.cpp and one context over it (owned by one thread)."""

    def __init__(
        self, path: str, *, work_cells: int, n_seq_max: int, n_batch: int, n_ubatch: int, n_threads: int
    ) -> None:
        """The context holds `work_cells` KV cells, one request's (at most the trained
        context); llama.cpp allocates (and clears, so the pages are resident) all of it here.
        The prefix cache lives outside it (cache.py). A decode call takes up to `n_batch`
        tokens and computes them `n_ubatch` at a time (the compute buffer is sized for one
        ubatch)."""
        import llama_cpp as lc

        self._lc = lc
        _quiet(lc)
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        # No repacked copies of the weights (llama.cpp's CPU_REPACK buffers, for Q4_0, Q4_K and
        # kin): on a 2-core CPU they cost memory beside the mapped file, load time and prefill
        # speed (bench/bench_llamacpp.py).
        mparams.use_extra_bufts = False
        self._model = lc.llama_model_load_from_file(path.encode(), mparams)
        if not self._model:
            raise EngineError("llama.cpp could not load the model", detail=path)
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self._model)
        n_layer = lc.llama_model_n_layer(self._model)
        n_embd, n_head = lc.llama_model_n_embd(self._model), lc.llama_model_n_head(self._model)
        self.n_embd = n_embd
        n_head_kv = lc.llama_model_n_head_kv(self._model)
        # K and V in float16 (the default cache types), one head_dim per KV head per layer
        self.bytes_per_cell = n_layer * 2 * n_head_kv * (n_embd // max(1, n_head)) * 2
        cells = min(work_cells, self.n_ctx_train)
        n_ctx = -(-cells // 256) * 256
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_ubatch, n_batch)
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.kv_unified = True
        cparams.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise EngineError("llama.cpp could not create a context", detail=f"n_ctx={n_ctx} n_seq_max={n_seq_max}")
        self.n_ctx = lc.llama_n_ctx(self._ctx)
        self.n_seq_max = lc.llama_n_seq_max(self._ctx)
        self.n_batch = n_batch
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(n_batch, 0, n_seq_max)

    def decode(self, items: Sequence[Item], label_ids: Sequence[Sequence[int]]) -> list[tuple[float, ...]]:
        if len(items) > self.n_batch:
            raise ValueError(f"{len(items)} items exceed n_batch {self.n_batch}")
        b = self._batch
        out: list[int] = []  # the batch index of each read
        b.n_tokens = len(items)
        for i, it in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = it.token, it.pos, len(it.seqs)
            row = b.seq_id[i]
            for j, s in enumerate(it.seqs):
                row[j] = s
            b.logits[i] = 1 if it.reads else 0
            out.extend(i for _ in it.reads)
        rc = self._lc.llama_decode(self._ctx, b)
        if rc == 1:
            raise EngineError("the engine ran out of KV cache; retry later", detail="llama_decode found no KV slot")
        if rc != 0:
            raise EngineError("the engine failed", detail=f"llama_decode returned {rc}")
        results = []
        for k, i in enumerate(out):
            ptr = self._lc.llama_get_logits_ith(self._ctx, i)
            logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            results.append(log_probs(logits, label_ids[k]))
        return results

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self._lc.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_rm(self, seq: int, p0: int = 0) -> None:
        self._lc.llama_memory_seq_rm(self._mem, seq, p0, -1)

    def seq_save(self, seq: int) -> SavedState:
        # seq -1: every cell, with the ids of the sequences each belongs to (save_all)
        size = self._lc.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        written = self._lc.llama_state_seq_get_data(self._ctx, buf, size, seq)
        if written != size:
            raise EngineError("the engine failed", detail=f"llama_state_seq_get_data wrote {written} of {size} bytes")
        return buf  # a ctypes array: len() is its bytes, and it is handed back as it is

    def seq_restore(self, state: SavedState, seq: int) -> bool:
        return bool(self._lc.llama_state_seq_set_data(self._ctx, state, len(state), seq))

    def save_all(self) -> SavedState:
        return self.seq_save(-1)

    def restore_all(self, state: SavedState) -> bool:
        # sequence -1: llama.cpp empties the cache, then puts every saved cell back
        return bool(self._lc.llama_state_seq_set_data(self._ctx, state, len(state), -1))

    def clear(self) -> None:
        self._lc.llama_memory_clear(self._mem, False)  # metadata only: the cells' bytes are rewritten

    def close(self) -> None:
        if self._ctx:
            self._lc.llama_batch_free(self._batch)
            self._lc.llama_free(self._ctx)
            self._lc.llama_model_free(self._model)
            self._ctx = self._model = None
