"""A Plan's trie laid out as llama.cpp batch items: each token once, in every sequence below it.

llama.cpp's batch lets one token belong to several KV sequences, and a token attends to the
cells of its first sequence at positions up to its own. So the trie is one batch: every
leaf of the trie gets a sequence of its own, and a node's tokens belong to the sequences
of every leaf below it (the root's, to all of them). A token then sees exactly its
ancestors' tokens and the earlier tokens of its own node, at its true position: each
branch gets the hidden states of its own independent prefill, and every distinct token is
computed once. Logits are asked for only where a branch ends.

A plan with more leaves than the sequences a context has goes in groups of leaves (in
preorder, so a group keeps its subtrees together). The root is computed in the first group,
in the root sequence as well, and the later groups copy it from there (`RootCopy`): it is
never computed twice. A node below the root whose leaves fall in two groups is computed
once in each; `Layout.computed` counts it as often as it is computed.

Nodes are laid out in preorder, so a node's tokens follow its ancestors' (llama.cpp splits a
batch into micro-batches in order). Pure data: no binding is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from openjev.core.plan import Plan, TrieNode


@dataclass(frozen=True)
class Item:
    """One batch token: id, true position, the sequences it belongs to (its first decides
    what it attends to) and the branches read at it (logits asked for where not empty)."""

    token: int
    pos: int
    seqs: tuple[int, ...]
    reads: tuple[int, ...] = ()


@dataclass(frozen=True)
class Group:
    """One group of leaves: the sequences it uses (`leaf_seqs`), the positions [0, copy_len)
    copied from sequence `copy_from` into each of `copy_into` before its items run (the
    cached root positions for the first group, the whole root for later ones), and its
    items in preorder."""

    leaf_seqs: tuple[int, ...]
    copy_from: int | None
    copy_len: int
    copy_into: tuple[int, ...]
    items: tuple[Item, ...]


@dataclass(frozen=True)
class Layout:
    groups: tuple[Group, ...]
    computed: int  # batch tokens over all groups (the root's once)


def leaves(root: TrieNode) -> list[TrieNode]:
    """The trie's leaves in preorder."""
    return [node for node in root.walk() if not node.children]


def _subtree_items(node: TrieNode, seq_of: dict[int, int], skip: int) -> list[Item] | None:
    """Items of `node` (from its `skip`-th token) and its descendants that lead to a leaf in
    `seq_of` (leaf id -> sequence); None when no leaf below it is in the group."""
    below = [seq_of[id(leaf)] for leaf in leaves(node) if id(leaf) in seq_of]
    if not below:
        return None
    seqs = tuple(below)
    items = [Item(tok, node.start + i, seqs) for i, tok in enumerate(node.tokens) if i >= skip]
    if node.ends and items:
        last = items[-1]
        items[-1] = Item(last.token, last.pos, last.seqs, tuple(node.ends))
    for child in node.children:
        sub = _subtree_items(child, seq_of, 0)
        if sub:
            items.extend(sub)
    return items


def layout(plan: Plan, *, cached: int, root_seq: int, cache_seq: int | None, free_seqs: list[int]) -> Layout:
    """The batch items of `plan`, whose first `cached` root tokens are in `cache_seq` (which
    may be `root_seq` itself: the engine restores a cached state there).

    `root_seq`: a sequence for the root (saved for the prefix cache afterwards); `free_seqs`:
    sequences the leaves may use (at least one). The caller guarantees that `cached` is
    below every branch's last position (a read position is always computed) and at most
    the root's length."""
    if not free_seqs:
        raise ValueError("a layout needs at least one free sequence")
    root = plan.root
    if not 0 <= cached <= len(root.tokens):
        raise ValueError(f"cached {cached} is outside the root's {len(root.tokens)} tokens")
    all_leaves = leaves(root)
    width = len(free_seqs)
    groups: list[Group] = []
    computed = 0
    for g in range(0, len(all_leaves), width):
        chunk = all_leaves[g : g + width]
        seq_of = {id(leaf): free_seqs[i] for i, leaf in enumerate(chunk)}
        first = g == 0
        items = _group_items(root, seq_of, cached if first else len(root.tokens), root_seq if first else None)
        if not first:  # later groups read no branch already read (a node computed again)
            items = _drop_read(items, groups)
        leaf_seqs = tuple(seq_of[id(leaf)] for leaf in chunk)
        copy_from, copy_len = (cache_seq, cached) if first else (root_seq, len(root.tokens))
        into = (root_seq, *leaf_seqs) if first else leaf_seqs
        into = tuple(s for s in into if s != copy_from)  # the cached positions restored into the root
        if copy_len == 0 or copy_from is None:
            copy_from, copy_len, into = None, 0, ()
        groups.append(Group(leaf_seqs, copy_from, copy_len, into, tuple(items)))
        computed += len(items)
    return Layout(tuple(groups), computed)


def _group_items(root: TrieNode, seq_of: dict[int, int], skip: int, root_seq: int | None) -> list[Item]:
    items = _subtree_items(root, seq_of, skip) or []
    if root_seq is None:
        return items
    # the root's own tokens also belong to the root sequence (listed first: root tokens
    # attend to the root sequence, which holds the cached positions too)
    n_root = len(root.tokens) - skip
    return [Item(it.token, it.pos, (root_seq, *it.seqs), it.reads) if i < n_root else it for i, it in enumerate(items)]


def _drop_read(items: list[Item], earlier: list[Group]) -> list[Item]:
    done = {b for group in earlier for it in group.items for b in it.reads}
    return [Item(it.token, it.pos, it.seqs, tuple(b for b in it.reads if b not in done)) for it in items]
