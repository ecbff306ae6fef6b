"""A Plan's trie packed into one token sequence, read with a tree attention mask.

Nodes are laid out in preorder, so every node follows its ancestors. Computing the packed
sequence once, with each token attending only to its ancestors' tokens and to the earlier
tokens of its own node, at its true position, gives every branch exactly the hidden states
of its own independent prefill, while each distinct token is computed once, and the whole
plan fits in as few forwards as its length allows (one, for most requests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openjev.core.plan import Plan, TrieNode


@dataclass(frozen=True)
class PackedPlan:
    tokens: tuple[int, ...]
    positions: tuple[int, ...]  # absolute position of each packed token in its branches
    node_of: torch.Tensor  # (n,) node index of each packed token; node 0 is the root
    ancestor: torch.Tensor  # (nodes, nodes) bool: ancestor[a, b] = b is a or an ancestor of a
    reads: tuple[tuple[int, int], ...]  # (branch index, packed index of its last token), by packed index
    root_len: int

    def __len__(self) -> int:
        return len(self.tokens)

    def visibility(self, start: int, end: int) -> torch.Tensor:
        """(end - start, end) bool: which packed tokens [0, end) each of [start, end) may attend to."""
        nq = self.node_of[start:end, None]
        nk = self.node_of[None, :end]
        causal = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        return self.ancestor[nq, nk] & ((nq != nk) | causal)


def pack(plan: Plan) -> PackedPlan:
    tokens: list[int] = []
    positions: list[int] = []
    node_of: list[int] = []
    parents: list[int] = []
    reads: list[tuple[int, int]] = []

    def visit(node: TrieNode, parent: int) -> None:
        index = len(parents)
        parents.append(parent)
        tokens.extend(node.tokens)
        positions.extend(range(node.start, node.end))
        node_of.extend([index] * len(node.tokens))
        reads.extend((b, len(tokens) - 1) for b in node.ends)
        for child in node.children:
            visit(child, index)

    visit(plan.root, -1)
    n = len(parents)
    ancestor = torch.zeros((n, n), dtype=torch.bool)
    for a in range(n):
        b = a
        while b >= 0:
            ancestor[a, b] = True
            b = parents[b]
    return PackedPlan(
        tokens=tuple(tokens),
        positions=tuple(positions),
        node_of=torch.tensor(node_of, dtype=torch.long),
        ancestor=ancestor,
        reads=tuple(sorted(reads, key=lambda r: r[1])),
        root_len=len(plan.root.tokens),
    )
