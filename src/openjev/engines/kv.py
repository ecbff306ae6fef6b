"""KV chains and ragged batched forwards for the in-process engine.

A KVChain is the key/value cache of one token sequence as a list of chunks (per layer,
tensors of shape (1, heads, length, head_dim)). Chains share chunks: a trie node's chain is
its parent's chunks plus its own, so nothing is copied to extend a prefix, and slicing
(`prefix`) makes views. Causal attention makes the KV of positions [0, m) a function of
those m tokens only, so any prefix of a chain is valid for any sequence that starts with
the same m tokens.

`ragged_forward` runs rows with different pasts and different new lengths in one forward:
pasts are left-aligned and padded, new tokens right-padded, and a 4D mask lets each query
see exactly its own past and its own earlier tokens. Equal to running each row alone, up
to float noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer


@dataclass(frozen=True)
class KVChain:
    chunks: tuple[tuple[tuple[torch.Tensor, torch.Tensor], ...], ...] = ()  # chunk -> layer -> (k, v)
    length: int = 0

    def extend(self, chunk: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> "KVChain":
        n = chunk[0][0].shape[-2]
        return KVChain(self.chunks + (chunk,), self.length + n) if n else self

    def prefix(self, m: int) -> "KVChain":
        """The chain of the first m positions (views, no copies)."""
        assert 0 <= m <= self.length
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

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys and values of layer i, (1, H, length, D), or None for an empty chain."""
        if not self.chunks:
            return None
        if len(self.chunks) == 1:
            return self.chunks[0][i]
        return (torch.cat([c[i][0] for c in self.chunks], dim=-2), torch.cat([c[i][1] for c in self.chunks], dim=-2))

    def contiguous(self) -> "KVChain":
        """One chunk per layer, owning its memory (for long-lived cache entries)."""
        if not self.chunks:
            return self
        n_layers = len(self.chunks[0])
        layers = []
        for i in range(n_layers):
            k, v = self.layer(i)
            layers.append((k.contiguous().clone(), v.contiguous().clone()))
        return KVChain((tuple(layers),), self.length)

    @property
    def nbytes(self) -> int:
        return sum(t.nelement() * t.element_size() for chunk in self.chunks for kv in chunk for t in kv)


@dataclass
class Row:
    """One sequence of a ragged forward: `tokens` continue `past`."""

    past: KVChain
    tokens: Sequence[int]
    keep_kv: bool = False


class _RaggedLayer(DynamicLayer):
    """One layer's padded past for a batch; `update` returns past + new without storing the
    past again, and remembers the new states when asked (to extend chains afterwards)."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, keep: bool) -> None:
        super().__init__()
        self.past_keys, self.past_values, self.keep = keys, values, keep
        self.new = None
        self.is_initialized = True
        if keys is not None:
            self.device, self.dtype = keys.device, keys.dtype

    def update(self, key_states, value_states, *args, **kwargs):
        if self.keep:
            self.new = (key_states, value_states)
        if self.past_keys is None:
            return key_states, value_states
        b = key_states.shape[0]
        keys = torch.cat([self.past_keys.expand(b, -1, -1, -1), key_states], dim=-2)
        values = torch.cat([self.past_values.expand(b, -1, -1, -1), value_states], dim=-2)
        return keys, values

    def get_seq_length(self) -> int:
        return 0 if self.past_keys is None else self.past_keys.shape[-2]


@dataclass
class RaggedResult:
    last_hidden: torch.Tensor  # (B, hidden) at each row's last new token
    new_chunks: list[tuple[tuple[torch.Tensor, torch.Tensor], ...] | None] = field(default_factory=list)


def padded_cost(rows: Sequence[Row]) -> int:
    """Query x key positions of the padded batch: what bounds attention memory."""
    if not rows:
        return 0
    s = max(len(r.tokens) for r in rows)
    p = max(r.past.length for r in rows)
    if len({id(r.past) for r in rows}) == 1:
        p = rows[0].past.length
    return len(rows) * s * (p + s)


def ragged_forward(base_model, rows: Sequence[Row], *, cache_kw: str, pad_id: int, bool_mask: bool) -> RaggedResult:
    """Run `rows` in one forward of the base (headless) model."""
    device = next(base_model.parameters()).device
    b = len(rows)
    s_max = max(len(r.tokens) for r in rows)
    shared = len({id(r.past) for r in rows}) == 1  # one past for all rows: expand, never copy
    p_max = max(r.past.length for r in rows)
    keep = any(r.keep_kv for r in rows)

    ids = torch.full((b, s_max), pad_id, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        ids[i, : len(r.tokens)] = torch.as_tensor(list(r.tokens), dtype=torch.long, device=device)
    past_len = torch.tensor([r.past.length for r in rows], device=device)
    positions = past_len[:, None] + torch.arange(s_max, device=device)[None, :]

    # mask[b, 0, q, k]: k < p_max -> a past slot, valid below the row's own past length;
    # k >= p_max -> new token k - p_max, visible when not after q (causal).
    k_idx = torch.arange(p_max + s_max, device=device)
    q_idx = torch.arange(s_max, device=device)
    past_ok = k_idx[None, None, :] < past_len[:, None, None]
    new_ok = (k_idx[None, :] >= p_max) & (k_idx[None, :] - p_max <= q_idx[:, None])
    mask = (past_ok & (k_idx[None, None, :] < p_max)) | new_ok[None, :, :]
    mask = mask[:, None, :, :]

    n_layers = base_model.config.num_hidden_layers
    layers = []
    for li in range(n_layers):
        if p_max == 0:
            layers.append(_RaggedLayer(None, None, keep))
        elif shared:
            k, v = rows[0].past.layer(li)
            layers.append(_RaggedLayer(k, v, keep))
        else:
            k0, v0 = next(r.past.layer(li) for r in rows if r.past.length)
            keys = k0.new_zeros((b, k0.shape[1], p_max, k0.shape[3]))
            values = v0.new_zeros((b, v0.shape[1], p_max, v0.shape[3]))
            for i, r in enumerate(rows):
                if r.past.length:
                    k, v = r.past.layer(li)
                    keys[i, :, : r.past.length] = k[0]
                    values[i, :, : r.past.length] = v[0]
            layers.append(_RaggedLayer(keys, values, keep))
    cache = Cache(layers=layers)

    dtype = next(base_model.parameters()).dtype
    attn_mask = mask if bool_mask else torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(
        ~mask, torch.finfo(dtype).min)
    out = base_model(input_ids=ids, position_ids=positions, attention_mask=attn_mask, use_cache=True,
                     **{cache_kw: cache})
    last = torch.tensor([len(r.tokens) - 1 for r in rows], device=device)
    hidden = out.last_hidden_state[torch.arange(b, device=device), last]

    chunks: list = []
    for i, r in enumerate(rows):
        if not r.keep_kv:
            chunks.append(None)
            continue
        n = len(r.tokens)
        chunks.append(tuple((layer.new[0][i : i + 1, :, :n].clone(), layer.new[1][i : i + 1, :, :n].clone())
                            for layer in layers))
    return RaggedResult(last_hidden=hidden, new_chunks=chunks)
