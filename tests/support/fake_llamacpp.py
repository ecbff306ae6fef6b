"""SimulatedLlamaCpp: a named fake of the llama.cpp seam (engines/llamacpp/lib.Backend).

It keeps llama.cpp's unified KV cache as cells (position, token, set of sequences) and
enforces what llama.cpp enforces: a token attends to the cells of its FIRST sequence at
positions up to its own (the same batch's cells included), a sequence's positions in a
batch continue from what its cells hold (no gaps, no repeats), at most `n_seq_max`
sequences, at most `n_ctx` cells, at most `n_batch` tokens per decode. Its "model": the
log-prob of label l after a visible token sequence is a fixed function of (sequence, l),
so a branch computed with the wrong visibility (a missing, extra or misplaced token) gets
another value than `expected(input_ids, labels)`, its independent prefill.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass


def expected(input_ids: Sequence[int], labels: Sequence[int]) -> tuple[float, ...]:
    """The fake model's log-probs of `labels` after `input_ids`."""
    out = []
    for label in labels:
        digest = hashlib.blake2b(repr((tuple(input_ids), label)).encode(), digest_size=4).digest()
        out.append(-int.from_bytes(digest, "big") / 2**32 * 10)
    return tuple(out)


@dataclass
class Cell:
    pos: int
    token: int
    seqs: set[int]


@dataclass(frozen=True)
class SavedCells:
    cells: tuple[tuple[int, int], ...]
    bytes_per_cell: int

    def __len__(self) -> int:
        return len(self.cells) * self.bytes_per_cell


@dataclass(frozen=True)
class SavedContext:
    """save_all's state: every cell with its sequences."""

    cells: tuple[tuple[int, int, frozenset[int]], ...]
    bytes_per_cell: int

    def __len__(self) -> int:
        return max(1, len(self.cells)) * self.bytes_per_cell


class SimulatedLlamaCpp:
    def __init__(self, *, n_ctx=4096, n_ctx_train=2048, n_seq_max=8, n_batch=64, bytes_per_cell=10) -> None:
        self.n_ctx, self.n_ctx_train, self.n_seq_max = n_ctx, n_ctx_train, n_seq_max
        self.n_batch, self.n_vocab, self.bytes_per_cell = n_batch, 1000, bytes_per_cell
        self.n_embd = 1024  # a small model's hidden size (the cost model's attention prior)
        self.saves = 0  # save_all calls (a request set aside)
        self.decode_s = 0.0  # seconds each decode sleeps (a model's cost, for the pricing tests)
        self.cells: list[Cell] = []
        self.decoded_tokens = 0
        self.decodes = 0
        self.closed = False
        self.gate: threading.Event | None = None  # when set: each decode waits for it
        self.entered = threading.Event()  # set when a decode starts
        self.restores = 0
        self.refuse_restore = False  # when True: seq_restore fails, as llama.cpp's may

    def _visible(self, seq: int, pos: int) -> list[Cell]:
        return sorted((c for c in self.cells if seq in c.seqs and c.pos <= pos), key=lambda c: c.pos)

    def decode(self, items, label_ids):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        assert 0 < len(items) <= self.n_batch, len(items)
        nxt: dict[int, int] = {}
        for it in items:
            assert it.seqs and len(set(it.seqs)) == len(it.seqs), it
            for s in it.seqs:
                assert 0 <= s < self.n_seq_max, s
                if s not in nxt:
                    held = [c.pos for c in self.cells if s in c.seqs]
                    nxt[s] = max(held) + 1 if held else 0
                assert it.pos == nxt[s], f"seq {s}: position {it.pos}, expected {nxt[s]}"
                nxt[s] += 1
        assert len(self.cells) + len(items) <= self.n_ctx, "no KV slot"
        new = [Cell(it.pos, it.token, set(it.seqs)) for it in items]
        self.cells.extend(new)
        out, k = [], 0
        for it in items:
            if not it.reads:
                continue
            seen = self._visible(it.seqs[0], it.pos)
            positions = [c.pos for c in seen]
            assert positions == list(range(it.pos + 1)), f"token at {it.pos} sees positions {positions}"
            for _ in it.reads:
                out.append(expected([c.token for c in seen], label_ids[k]))
                k += 1
        self.decoded_tokens += len(items)
        self.decodes += 1
        if self.decode_s:
            time.sleep(self.decode_s)
        return out

    def seq_cp(self, src, dst, p0, p1):
        for c in self.cells:
            if src in c.seqs and p0 <= c.pos < p1:
                c.seqs.add(dst)

    def seq_rm(self, seq, p0=0):
        for c in self.cells:
            if c.pos >= p0:
                c.seqs.discard(seq)
        self.cells = [c for c in self.cells if c.seqs]

    def seq_save(self, seq):
        """A saved state: the sequence's (position, token) cells, as bytes of their size."""
        return SavedCells(tuple(sorted((c.pos, c.token) for c in self.cells if seq in c.seqs)), self.bytes_per_cell)

    def seq_restore(self, state, seq):
        assert not any(seq in c.seqs for c in self.cells), "restored into a sequence that holds cells"
        if self.refuse_restore or len(self.cells) + len(state.cells) > self.n_ctx:
            return False
        self.cells.extend(Cell(pos, token, {seq}) for pos, token in state.cells)
        self.restores += 1
        return True

    def save_all(self):
        self.saves += 1
        return SavedContext(tuple((c.pos, c.token, frozenset(c.seqs)) for c in self.cells), self.bytes_per_cell)

    def restore_all(self, state):
        if self.refuse_restore:
            return False
        self.cells = [Cell(pos, token, set(seqs)) for pos, token, seqs in state.cells]
        return True

    def clear(self):
        self.cells = []

    def close(self):
        self.closed = True
