"""A Plan's trie packed into one token sequence, read with a tree attention mask.

Nodes are laid out in preorder, so every node follows its ancestors. Computing the packed
sequence once, with each token attending only to its ancestors' tokens and to the earlier
tokens of its own node, at its true position, gives every branch exactly the hidden states
of its own independent prefill, while each distinct token is computed once, and the whole
plan fits in as few forwards as its length allows (one, for most requests).

A branch with a parallel layout (core/plan.py) has its leaf packed as sub-nodes: the part
before the spans, one sub-node per span (each a child of that part, all starting at the
same position), and the tail, whose ancestors are every span: the same mask then makes
the spans invisible to one another and all of them visible to the tail. The nodes form a
DAG instead of a tree; visibility only asks "is b an ancestor of a".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from openjev.core.plan import Branch, Plan, TrieNode


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


def _ancestors(parents: list[tuple[int, ...]]) -> torch.Tensor:
    """ancestor[a, b]: node b is node a or one of its ancestors (`parents`: each node's, in
    an order where parents come before their children)."""
    n = len(parents)
    ancestor = torch.zeros((n, n), dtype=torch.bool)
    for a in range(n):  # parents come before their children: their rows are complete
        ancestor[a, a] = True
        for p in parents[a]:
            ancestor[a] |= ancestor[p]
    return ancestor


def pack(plan: Plan) -> PackedPlan:
    tokens: list[int] = []
    positions: list[int] = []
    node_of: list[int] = []
    reads: list[tuple[int, int]] = []
    parents: list[tuple[int, ...]] = []

    def add(ids: Sequence[int], first_position: int, of: tuple[int, ...]) -> int:
        index = len(parents)
        parents.append(of)
        tokens.extend(ids)
        positions.extend(range(first_position, first_position + len(ids)))
        node_of.extend([index] * len(ids))
        return index

    def add_layout(node: TrieNode, branch: Branch, parent: tuple[int, ...]) -> None:
        ids, spans = branch.input_ids, branch.parallel
        at = spans[0][0]
        if node.start > at or node.children or len(node.ends) != 1:
            raise ValueError("a parallel layout must lie wholly in its branch's own leaf")
        anchor = (add(ids[node.start : at], node.start, parent),) if at > node.start else parent
        span_nodes = tuple(add(ids[s:e], at, anchor) for s, e in spans)
        tail_start = at + max(e - s for s, e in spans)
        add(ids[spans[-1][1] :], tail_start, (*anchor, *span_nodes))
        reads.append((node.ends[0], len(tokens) - 1))

    def visit(node: TrieNode, parent: tuple[int, ...]) -> None:
        layout = [b for b in node.ends if plan.branches[b].parallel]
        if layout:
            add_layout(node, plan.branches[layout[0]], parent)
            return
        index = add(node.tokens, node.start, parent)
        reads.extend((b, len(tokens) - 1) for b in node.ends)
        for child in node.children:
            visit(child, (index,))

    visit(plan.root, ())
    ancestor = _ancestors(parents)
    return PackedPlan(
        tokens=tuple(tokens),
        positions=tuple(positions),
        node_of=torch.tensor(node_of, dtype=torch.long),
        ancestor=ancestor,
        reads=tuple(sorted(reads, key=lambda r: r[1])),
        # the prefix every branch shares, as packed (a layout root keeps only its part before the spans)
        root_len=node_of.count(0),
    )
