"""KV chains and ragged batched forwards for the in-process engine.

A KVChain is the key/value cache of a run of tokens as a list of chunks (per layer,
tensors of shape (1, heads, length, head_dim)); extending shares the earlier chunks and
slicing (`prefix`) makes views, so nothing is copied to grow or reuse a prefix.

`ragged_forward` runs rows with different pasts and lengths in one forward. Each row
brings its own visibility mask over its past and its new tokens (a plain causal mask, or
a token-tree mask: each token sees only its ancestors), and its own absolute positions.
Pasts are left-aligned and padded, new tokens right-padded; padding is never visible to a
real token, so each row's result equals running it alone, up to float noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

Chunk = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # layer -> (keys, values)


@dataclass(frozen=True)
class KVChain:
    chunks: tuple[Chunk, ...] = ()
    length: int = 0

    def extend(self, chunk: Chunk) -> KVChain:
        n = chunk[0][0].shape[-2]
        return KVChain((*self.chunks, chunk), self.length + n) if n else self

    def prefix(self, m: int) -> KVChain:
        """The chain of the first m positions (views, no copies)."""
        if not 0 <= m <= self.length:
            raise ValueError(f"prefix of {m} positions asked of a chain of {self.length}")
        if m == self.length:
            return self
        out, total = [], 0
        for chunk in self.chunks:
            n = chunk[0][0].shape[-2]
            if total + n <= m:
                out.append(chunk)
                total += n
            else:
                take = m - total
                if take:
                    out.append(tuple((k[:, :, :take], v[:, :, :take]) for k, v in chunk))
                break
        return KVChain(tuple(out), m)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer i, (1, H, length, D). The chain must not be empty."""
        if len(self.chunks) == 1:
            return self.chunks[0][i]
        return (torch.cat([c[i][0] for c in self.chunks], dim=-2), torch.cat([c[i][1] for c in self.chunks], dim=-2))

    def contiguous(self) -> KVChain:
        """One chunk owning its memory (for long-lived cache entries)."""
        if not self.chunks:
            return self
        if len(self.chunks) > 1:  # layer() concatenates: new tensors of their own already
            layers = tuple(self.layer(i) for i in range(len(self.chunks[0])))
        else:  # a view may pin a larger tensor (the rest of a forward's output): copy it out
            layers = tuple((k.clone(), v.clone()) for k, v in self.chunks[0])
        return KVChain((layers,), self.length)

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for chunk in self.chunks for kv in chunk for t in kv)


@dataclass
class Row:
    """New `tokens` at absolute `positions`, continuing `past`. `visible[q, k]`: may new token q
    attend to column k, where columns are the past's positions then the new tokens."""

    past: KVChain
    tokens: Sequence[int]
    positions: Sequence[int]
    visible: torch.Tensor  # bool, (len(tokens), past.length + len(tokens))


class _RaggedLayer(DynamicLayer):
    """One layer's padded past for the batch; `update` returns past + new and remembers the
    new states (the caller extends its chains with them)."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None) -> None:
        super().__init__()
        self.past_keys, self.past_values = keys, values
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.new = (key_states, value_states)
        if self.past_keys is None or self.past_values is None:
            return key_states, value_states
        return (torch.cat([self.past_keys, key_states], dim=-2), torch.cat([self.past_values, value_states], dim=-2))

    def new_states(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.new is None:
            raise RuntimeError("the model did not update this layer's cache")
        return self.new

    def get_seq_length(self) -> int:
        return 0 if self.past_keys is None else self.past_keys.shape[-2]


def padded_cost(rows: Sequence[Row]) -> int:
    """Query x key positions of the padded batch: what bounds attention memory."""
    if not rows:
        return 0
    s = max(len(r.tokens) for r in rows)
    p = max(r.past.length for r in rows)
    return len(rows) * s * (p + s)


def ragged_forward(
    base_model, rows: Sequence[Row], *, cache_kw: str, pad_id: int, bool_mask: bool
) -> tuple[torch.Tensor, list[Chunk]]:
    """(hidden states (B, S, H) of the new tokens, each row's new KV chunk)."""
    device = next(base_model.parameters()).device
    ids, positions, mask = _ragged_inputs(rows, pad_id)
    layers = _past_layers(base_model.config.num_hidden_layers, rows)
    dtype = next(base_model.parameters()).dtype
    mask = mask.to(device)
    attn_mask = (
        mask
        if bool_mask
        else torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
    )
    out = base_model(
        input_ids=ids.to(device),
        position_ids=positions.to(device),
        attention_mask=attn_mask,
        use_cache=True,
        **{cache_kw: Cache(layers=list[Any](layers))},
    )
    chunks = [
        tuple(
            (k[i : i + 1, :, : len(r.tokens)].clone(), v[i : i + 1, :, : len(r.tokens)].clone())
            for k, v in (layer.new_states() for layer in layers)
        )
        for i, r in enumerate(rows)
    ]
    return out.last_hidden_state, chunks


def _ragged_inputs(rows: Sequence[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (B, S), positions (B, S), boolean mask (B, 1, S, P + S)) of the rows, padded to
    the longest row's new tokens S and the longest past P."""
    b = len(rows)
    s_max = max(len(r.tokens) for r in rows)
    p_max = max(r.past.length for r in rows)
    ids = torch.full((b, s_max), pad_id, dtype=torch.long)
    positions = torch.zeros((b, s_max), dtype=torch.long)
    mask = torch.zeros((b, 1, s_max, p_max + s_max), dtype=torch.bool)
    # Padding queries see themselves, so no attention row is empty (an empty row gives NaN
    # values that would reach real tokens through 0 * NaN).
    diag = torch.arange(s_max)
    mask[:, 0, diag, p_max + diag] = True
    for i, r in enumerate(rows):
        n, p = len(r.tokens), r.past.length
        ids[i, :n] = torch.as_tensor(list(r.tokens), dtype=torch.long)
        positions[i, :n] = torch.as_tensor(list(r.positions), dtype=torch.long)
        positions[i, n:] = positions[i, n - 1] + 1 + torch.arange(s_max - n)
        mask[i, 0, :n, :p] = r.visible[:, :p]
        mask[i, 0, :n, p_max : p_max + n] = r.visible[:, p:]
    return ids, positions, mask


def _past_layers(num_layers: int, rows: Sequence[Row]) -> list[_RaggedLayer]:
    """Each layer's past keys and values of the rows, padded to the longest past."""
    b = len(rows)
    p_max = max(r.past.length for r in rows)
    layers = []
    for li in range(num_layers):
        if p_max == 0:
            layers.append(_RaggedLayer(None, None))
        elif b == 1:
            k, v = rows[0].past.layer(li)
            layers.append(_RaggedLayer(k, v))
        else:
            k0, v0 = next(r.past.layer(li) for r in rows if r.past.length)
            keys = k0.new_zeros((b, k0.shape[1], p_max, k0.shape[3]))
            values = v0.new_zeros((b, v0.shape[1], p_max, v0.shape[3]))
            for i, r in enumerate(rows):
                if r.past.length:
                    k, v = r.past.layer(li)
                    keys[i, :, : r.past.length] = k[0]
                    values[i, :, : r.past.length] = v[0]
            layers.append(_RaggedLayer(keys, values))
    return layers
