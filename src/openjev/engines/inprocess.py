"""The in-process engine: transformers + torch, on CPU (float32) or CUDA.

Execution of a Plan: the root of the trie (the prefix every branch shares) is prefilled
once, in chunks that bound attention memory; then the branches' own tokens run batched on
top of that KV, which is shared read-only (expanded, never copied per branch). Branches
are right-padded: with causal attention a real token never sees the padding after it, so
no mask is needed and results equal independent prefills up to float noise. Only the last
real position of each branch goes through the LM head.

All model work runs on one dedicated thread, so the event loop stays free; a cancelled
run stops at the next forward boundary.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from openjev.config import Settings
from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, PlanResult
from openjev.engines import LoadedEngine, ModelCard
from openjev.engines.hf_model import load_model_and_tokenizer, resolve_source
from openjev.engines.hf_tokenizer import HFChatTokenizer
from openjev.errors import ConfigError, EngineError

log = logging.getLogger(__name__)


class _Cancelled(Exception):
    pass


class _SharedPrefixLayer(DynamicLayer):
    """One layer's prefix KV (batch 1), shared by a batch of continuations.

    `update` returns prefix + new states for the batch without storing anything, so the
    prefix is never copied per branch and nothing outlives the forward.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values
        self.device, self.dtype = keys.device, keys.dtype
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        b = key_states.shape[0]
        keys = torch.cat([self.keys.expand(b, -1, -1, -1), key_states], dim=-2)
        values = torch.cat([self.values.expand(b, -1, -1, -1), value_states], dim=-2)
        return keys, values


def _shared_cache(kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Cache:
    return Cache(layers=[_SharedPrefixLayer(k, v) for k, v in kv])


class TransformersEngine:
    """Engine port over a loaded causal LM. Thread-confined: all forwards on one worker."""

    def __init__(self, model, *, attention_budget: int, pad_id: int = 0) -> None:
        self._model = model
        self._device = next(model.parameters()).device
        self._budget = attention_budget
        self._pad_id = pad_id
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openjev-engine")
        self._base = model.get_base_model() if hasattr(model, "get_base_model") else model.base_model
        self._head = model.get_output_embeddings()
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        # transformers 5.24 renamed the forward's `past_key_values` to `cache`.
        params = inspect.signature(self._base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    async def run(self, plan: Plan) -> PlanResult:
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._run_sync, plan, cancel)
        try:
            return await future
        except asyncio.CancelledError:
            cancel.set()
            raise
        except _Cancelled:  # only reachable if cancel was set by someone else
            raise asyncio.CancelledError() from None
        except torch.OutOfMemoryError as e:
            raise EngineError(f"the engine ran out of memory: {e}") from None

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- worker thread

    def _run_sync(self, plan: Plan, cancel: threading.Event) -> PlanResult:
        with torch.inference_mode():
            t0 = time.perf_counter()
            root = plan.root
            kv, last_hidden = self._prefill(root.tokens, cancel)
            t1 = time.perf_counter()
            logprobs: list[tuple[float, ...] | None] = [None] * len(plan.branches)
            # Branches that are exactly the shared prefix are read from the prefill itself.
            for i in root.ends:
                logprobs[i] = self._read(last_hidden, [plan.branches[i].label_ids])[0]
            rest = [i for i in range(len(plan.branches)) if logprobs[i] is None]
            start = len(root.tokens)
            computed = start
            for batch in self._batches(plan, rest, start):
                if cancel.is_set():
                    raise _Cancelled()
                suffixes = [plan.branches[i].input_ids[start:] for i in batch]
                if len(batch) == 1 and len(suffixes[0]) * (start + len(suffixes[0])) > self._budget:
                    # One branch too long for a single forward: chunked, like the prefix.
                    _, hidden = self._prefill(suffixes[0], cancel, past=kv)
                else:
                    hidden = self._forward_batch(kv, start, suffixes)
                for i, row in zip(batch, self._read(hidden, [plan.branches[i].label_ids for i in batch])):
                    logprobs[i] = row
                computed += sum(len(s) for s in suffixes)
            t2 = time.perf_counter()
        return PlanResult(
            branches=tuple(BranchResult(lp) for lp in logprobs),  # type: ignore[arg-type]
            computed_tokens=computed,
            cached_tokens=0,
            timings_ms={"prefill": (t1 - t0) * 1000, "branches": (t2 - t1) * 1000},
        )

    def _prefill(self, tokens: Sequence[int], cancel: threading.Event, past=()):
        """KV of `past` + `tokens` (per layer, batch 1) and the last position's hidden state (1, H).

        Chunked so that one chunk's query x key positions stay within the attention budget.
        `past` tensors are read, never modified (the cache grows by concatenation).
        """
        if not tokens:
            return list(past), None
        cache = DynamicCache()
        for layer, (k, v) in enumerate(past):
            cache.update(k, v, layer)
        offset = past[0][0].shape[-2] if past else 0
        ids = torch.tensor([list(tokens)], device=self._device)
        done, hidden = 0, None
        while done < len(tokens):
            if cancel.is_set():
                raise _Cancelled()
            # chunk * (keys so far + chunk) <= budget, at least 1 token.
            chunk = max(1, min(len(tokens) - done, self._chunk_len(offset + done)))
            out = self._base(input_ids=ids[:, done : done + chunk], use_cache=True, **{self._cache_kw: cache})
            hidden = out.last_hidden_state[:, -1, :]
            done += chunk
        kv = [(layer.keys, layer.values) for layer in cache.layers]
        return kv, hidden

    def _chunk_len(self, done: int) -> int:
        # largest c with c * (done + c) <= budget
        c = int((-(done) + (done * done + 4 * self._budget) ** 0.5) / 2)
        return max(1, c)

    def _batches(self, plan: Plan, indices: list[int], start: int) -> list[list[int]]:
        """Group branches (sorted by length, to limit padding) so that each batch's
        rows x padded length x key length stays within the attention budget."""
        order = sorted(indices, key=lambda i: len(plan.branches[i].input_ids))
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            width = len(plan.branches[i].input_ids)  # longest so far, as sorted
            rows = len(current) + 1
            if current and rows * (width - start) * width > self._budget:
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def _forward_batch(self, kv, start: int, suffixes: list[tuple[int, ...]]) -> torch.Tensor:
        """Hidden state at each suffix's last real position, (B, H)."""
        width = max(len(s) for s in suffixes)
        ids = torch.full((len(suffixes), width), self._pad_id, dtype=torch.long, device=self._device)
        for row, s in enumerate(suffixes):
            ids[row, : len(s)] = torch.tensor(s, device=self._device)
        cache = _shared_cache(kv) if kv else None
        out = self._base(input_ids=ids, use_cache=cache is not None, **{self._cache_kw: cache})
        last = torch.tensor([len(s) - 1 for s in suffixes], device=self._device)
        return out.last_hidden_state[torch.arange(len(suffixes), device=self._device), last]

    def _read(self, hidden: torch.Tensor, label_ids: list[tuple[int, ...]]) -> list[tuple[float, ...]]:
        """Log-probs of each row's labels under the full-vocabulary softmax (float32)."""
        logits = self._head(hidden).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        logp = torch.log_softmax(logits, dim=-1)
        return [tuple(logp[row, list(ids)].tolist()) for row, ids in enumerate(label_ids)]


def _pick_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {setting}: CUDA is not available here")
    return setting


def _pick_dtype(setting: str, device: str) -> torch.dtype:
    if setting == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[setting]
    except KeyError:
        raise ConfigError(f"--dtype {setting!r}: expected auto, float32, bfloat16 or float16") from None


def load(settings: Settings) -> LoadedEngine:
    """Load the model named by settings (blocking) and wrap it as an engine."""
    t0 = time.perf_counter()
    source = resolve_source(settings.model)
    device = _pick_device(settings.device)
    dtype = _pick_dtype(settings.dtype, device)
    model, hf_tokenizer, from_cache = load_model_and_tokenizer(
        source, cache_dir=settings.cache_dir, dtype=dtype, device=device
    )
    pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
    engine = TransformersEngine(model, attention_budget=settings.attention_budget, pad_id=pad_id)
    seconds = time.perf_counter() - t0
    log.info("loaded %s on %s/%s in %.1f s (%s)", source.name, device, str(dtype).removeprefix("torch."),
             seconds, "converted weights from cache" if from_cache else "from source")
    card = ModelCard(name=settings.served_name or source.name, description=source.description,
                     release_date=source.release_date)
    return LoadedEngine(engine=engine, tokenizer=HFChatTokenizer(hf_tokenizer), card=card, load_seconds=seconds)
