"""The in-process engine: transformers + torch, on CPU (bfloat16 where native, else float32) or CUDA.

Plans run at the prefill floor: every distinct token of a request is computed once (each
trie node on top of its parent's KV, branches under a node batched), prefixes seen in
recent requests come from a byte-bounded cache, and concurrent requests share forwards
(scheduler.py). Only each branch's last position goes through the LM head.

All model work runs on the scheduler's own thread, so the event loop stays free; a
cancelled request's remaining work is dropped at the next round.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Sequence

import torch

from openjev.config import InProcessSettings, ServedSettings
from openjev.core.plan import Plan
from openjev.core.ports import Engine, PlanResult
from openjev.engines.cost_model import CostModel, attended
from openjev.engines.loaded import LoadedEngine, ModelCard
from openjev.engines.models.converted import load_model_and_tokenizer
from openjev.engines.models.source import resolve_source, source_fingerprint
from openjev.engines.models.tokenizer import HFChatTokenizer
from openjev.engines.prefix_cache import PrefixCache, cache_stats
from openjev.engines.torch.dtype import pick_dtype
from openjev.engines.torch.kv import KVChain, Row, ragged_forward
from openjev.engines.torch.scheduler import Scheduler, SchedulerLimits
from openjev.errors import ConfigError, EngineError

log = logging.getLogger(__name__)

# The warm-up forward at load: as long as the scheduler's first slice (its rate is the one
# a request's forwards then see), short enough that attention is a small share of it.
WARMUP_TOKENS = 512
WARMUP_FIRST_ID = 1000  # ordinary tokens, past the special ones most vocabularies open with


class TorchRunner:
    """Forwards and label reads over a loaded causal LM (called on the scheduler thread)."""

    def __init__(self, model, pad_id: int = 0) -> None:
        self.model = model
        self._base = model.get_base_model() if hasattr(model, "get_base_model") else model.base_model
        self._head = model.get_output_embeddings()
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        self._pad_id = pad_id
        # transformers 5.24 renamed the forward's `past_key_values` to `cache`.
        params = inspect.signature(self._base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._bool_mask = model.config._attn_implementation != "eager"

    def forward(self, rows: Sequence[Row]):
        try:
            with torch.inference_mode():
                return ragged_forward(
                    self._base, rows, cache_kw=self._cache_kw, pad_id=self._pad_id, bool_mask=self._bool_mask
                )
        except torch.OutOfMemoryError as e:
            raise EngineError("the engine ran out of memory; retry later", detail=str(e)) from None

    def read(
        self, hidden: torch.Tensor, picks: Sequence[tuple[int, int]], label_ids: Sequence[Sequence[int]]
    ) -> list[tuple[float, ...]]:
        """Log-probs of each pick's labels under the full-vocabulary softmax, in float32.

        In a 16-bit model the labels' own logits are recomputed in float32 from their head
        rows: the head's 16-bit output rounds a logit of 20 to a multiple of 1/8, which would
        quantize a two-label answer to steps of ~0.03 around 0.5. The normalizer (logsumexp
        over the vocabulary) comes from the 16-bit logits: its rounding errors average out,
        and it is common to every label of a read, so the answer does not depend on it."""
        with torch.inference_mode():
            rows = torch.tensor([r for r, _ in picks])
            cols = torch.tensor([c for _, c in picks])
            h = hidden[rows, cols]
            logits = self._cap(self._head(h).float())
            lse = torch.logsumexp(logits, dim=-1)
            if h.dtype == torch.float32:
                return [tuple((logits[i, list(ids)] - lse[i]).tolist()) for i, ids in enumerate(label_ids)]
            # every pick's labels in one float32 product over the union of their head rows
            union = sorted({t for ids in label_ids for t in ids})
            column = {t: j for j, t in enumerate(union)}
            index = torch.tensor(union)
            exact = h.float() @ self._head.weight[index].float().T
            bias = getattr(self._head, "bias", None)
            if bias is not None:
                exact = exact + bias[index].float()
            exact = self._cap(exact) - lse[:, None]
            return [tuple(exact[i, [column[t] for t in ids]].tolist()) for i, ids in enumerate(label_ids)]

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.tanh(logits / self._softcap) * self._softcap if self._softcap else logits


class TransformersEngine(Engine):
    """The Engine port over a loaded causal LM. It runs parallel layouts (packing.py)."""

    parallel_layouts = True

    def __init__(
        self,
        model,
        *,
        attention_budget: int = InProcessSettings.attention_budget,  # the settings' defaults (config/sections.py)
        batch_tokens: int = InProcessSettings.batch_tokens,
        prefix_cache_bytes: int = InProcessSettings.prefix_cache_bytes,
        batch_window_s: float = InProcessSettings.batch_window_ms / 1000,
        pad_id: int = 0,
        slice_s: float = InProcessSettings.slice_ms / 1000,
        fair_quantum: int = InProcessSettings.fair_quantum,
    ) -> None:
        self.runner = TorchRunner(model, pad_id)
        self.cache = PrefixCache(prefix_cache_bytes)
        self.scheduler = Scheduler(
            self.runner,
            self.cache,
            SchedulerLimits(
                batch_tokens=batch_tokens,
                attention_budget=attention_budget,
                window_s=batch_window_s,
                slice_s=slice_s,
                fair_quantum=fair_quantum,
            ),
            CostModel(hidden_size=int(getattr(model.config, "hidden_size", 1024))),
        )

    @property
    def model(self):
        return self.runner.model

    async def run(self, plan: Plan) -> PlanResult:
        return await self.scheduler.run(plan)

    def estimate_s(self, plan: Plan) -> float | None:
        """Seconds `plan` would take alone, at the cost measured on this engine's forwards."""
        prefix = plan.branches[0].input_ids[: plan.shared_prefix_len] if plan.branches else ()
        cached = self.cache.peek(prefix, plan.cache_namespace) if prefix else 0  # its namespace's cache is free
        return self.scheduler.cost.estimate_s(plan, cached)

    def warm_up(self, tokens: int = WARMUP_TOKENS) -> float:
        """One forward of `tokens` tokens from no context, timed into the cost model, so that
        the first request is priced (the load calls it before /health says ready); its seconds.
        A first forward runs slower than later ones (allocations, lazy set-up): it
        over-prices, and the requests' own forwards correct it."""
        vocab = int(getattr(self.model.config, "vocab_size", 0) or 1000)
        ids = [(WARMUP_FIRST_ID + i) % vocab for i in range(tokens)]
        visible = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        row = Row(past=KVChain(), tokens=ids, positions=list(range(tokens)), visible=visible)
        t0 = time.perf_counter()
        self.runner.forward([row])
        seconds = time.perf_counter() - t0
        self.scheduler.cost.observe(tokens, attended(0, tokens), seconds)
        return seconds

    async def close(self) -> None:
        """Stops every request at the scheduler's next forward (each gets EngineError); the
        wait for the thread is off the event loop."""
        await asyncio.to_thread(self.scheduler.stop)

    def stats(self) -> dict[str, float]:
        """For metrics, read without locking (plain numbers written by the worker thread; a
        scrape may see one round's update half done, never a torn number)."""
        return {
            **cache_stats(self.cache),
            "engine_forwards": self.scheduler.forwards,
            **self.scheduler.cost.stats(),
        }


def context_length(config) -> int | None:
    """The positions the model's config declares (`max_position_embeddings`): where the config
    sets RoPE scaling, transformers applies it and this is the scaled length; openjev never
    adds scaling of its own, so nothing is read past what the config says the model serves."""
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _pick_device(setting: str) -> str:
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {setting}: CUDA is not available here")
    return setting


def load(served: ServedSettings, tuning: InProcessSettings) -> LoadedEngine:
    """Load the model `served` names (blocking) and wrap it as an engine tuned by `tuning`."""
    t0 = time.perf_counter()
    source = resolve_source(served.model, served.cache_dir)
    device = _pick_device(served.device)
    choice = pick_dtype(served.dtype, device)
    log.info("dtype %s", choice.reason)
    dtype = choice.dtype
    model, hf_tokenizer, from_cache = load_model_and_tokenizer(
        source, cache_dir=served.cache_dir, dtype=dtype, device=device
    )
    pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
    engine = TransformersEngine(
        model,
        attention_budget=tuning.attention_budget,
        batch_tokens=tuning.batch_tokens,
        prefix_cache_bytes=tuning.prefix_cache_bytes,
        batch_window_s=tuning.batch_window_ms / 1000,
        pad_id=pad_id,
        slice_s=tuning.slice_ms / 1000,
        fair_quantum=tuning.fair_quantum,
    )
    warm = engine.warm_up()
    seconds = time.perf_counter() - t0
    log.info("warm-up forward of %d tokens: %.2f s (requests are priced from it)", WARMUP_TOKENS, warm)
    log.info(
        "loaded %s on %s/%s in %.1f s (%s)",
        source.name,
        device,
        str(dtype).removeprefix("torch."),
        seconds,
        "converted weights from cache" if from_cache else "from source",
    )
    card = ModelCard(
        name=served.served_name or source.name,
        description=source.description,
        release_date=source.release_date,
        fingerprint=source_fingerprint(source),
        context_length=context_length(model.config),
    )
    return LoadedEngine(engine=engine, tokenizer=HFChatTokenizer(hf_tokenizer), card=card, load_seconds=seconds)
