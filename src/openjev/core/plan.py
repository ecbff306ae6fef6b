"""A Plan: the branches of one request as a token-prefix trie.

Engine-agnostic, pure data. Each branch is one prefill (`input_ids`) whose last position
is read for the log-probs of `label_ids`. The trie says what is shared: the root holds
the prefix common to every branch; each deeper node a run shared by the branches under
it. Engines choose how to execute it (compute each node once, or order submissions for
a radix cache); answers must not depend on that choice.

A branch is held as a shared `prefix` (one tuple object, typically the request's state,
referenced by every branch) plus its `own` tokens, so a request of N branches over an
S-token state holds S + sum(own) token ids, not N * S. Building the trie compares
sequences with C-level tuple comparisons (the longest common prefix of a set is that of
its lexicographic least and greatest), never a shared prefix position by position in
Python per branch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class Branch:
    """`own`: this branch's tokens after `prefix` (the whole branch where `prefix` is empty).
    Equality and hashing are on the whole token sequence and the labels, however split."""

    own: tuple[int, ...]
    label_ids: tuple[int, ...]
    prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("own", "label_ids", "prefix"):
            if not isinstance(getattr(self, name), tuple):  # callers may pass lists
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.own and not self.prefix:
            raise ValueError("a branch has at least one token")
        if not self.label_ids:
            raise ValueError("a branch reads at least one label")

    @property
    def input_ids(self) -> tuple[int, ...]:
        """The whole branch (a new tuple where it has a prefix: engines that need it whole
        build it per branch, when they send it)."""
        return self.prefix + self.own if self.prefix else self.own

    def __len__(self) -> int:
        return len(self.prefix) + len(self.own)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Branch):
            return NotImplemented
        return self.label_ids == other.label_ids and len(self) == len(other) and self.input_ids == other.input_ids

    def __hash__(self) -> int:
        return hash((self.input_ids, self.label_ids))


@dataclass(frozen=True)
class TrieNode:
    """A run of tokens shared by every branch below this node.

    `start` is the position of the run's first token; `ends` the indices of branches whose
    last token is the run's last token (identical branches end at the same node).
    """

    start: int
    tokens: tuple[int, ...]
    children: tuple[TrieNode, ...]
    ends: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def walk(self) -> Iterator[TrieNode]:
        yield self
        for child in self.children:
            yield from child.walk()

    def branch_indices(self) -> list[int]:
        """Every branch at or below this node, in ascending order."""
        return sorted(i for node in self.walk() for i in node.ends)


def _lcp(seqs: Sequence[tuple[int, ...]], start: int) -> int:
    """Length of the longest common prefix of `seqs`, knowing they agree below `start`.

    The common prefix of a set equals that of its lexicographic least and greatest members
    (C-level comparisons); only those two are then compared, by halving on slices."""
    lo, hi = min(seqs), max(seqs)
    low, high = start, min(len(lo), len(hi))
    while low < high:  # invariant: lo[:low] == hi[:low]; the answer is <= high
        mid = (low + high + 1) // 2
        if lo[low:mid] == hi[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _build(seqs: Sequence[tuple[int, ...]], indices: list[int], start: int, base: int) -> TrieNode:
    """The node at `start` of `seqs` (the branches' own tokens), placed at `base` + start."""
    own = [seqs[i] for i in indices]
    end = _lcp(own, start)
    ends = tuple(i for i in indices if len(seqs[i]) == end)
    groups: dict[int, list[int]] = {}
    for i in indices:
        ids = seqs[i]
        if len(ids) > end:
            groups.setdefault(ids[end], []).append(i)
    children = tuple(_build(seqs, group, end, base) for group in groups.values())
    return TrieNode(start=base + start, tokens=own[0][start:end], children=children, ends=ends)


def _root(branches: tuple[Branch, ...]) -> TrieNode:
    prefix = branches[0].prefix
    if all(b.prefix is prefix for b in branches) or all(b.prefix == prefix for b in branches):
        seqs = [b.own for b in branches]  # the shared prefix is compared once, not per branch
    else:
        prefix, seqs = (), [b.input_ids for b in branches]
    top = _build(seqs, list(range(len(branches))), 0, len(prefix))
    if not prefix:
        return top
    return TrieNode(start=0, tokens=prefix + top.tokens, children=top.children, ends=top.ends)


@dataclass(frozen=True)
class Plan:
    """`cache_namespace`: an engine may serve this plan's tokens from a cache only where
    they were computed for a plan of the same namespace (tenants do not see each other's
    states through cache hits). "" is the namespace of a server without keys."""

    branches: tuple[Branch, ...]
    root: TrieNode
    cache_namespace: str = ""

    @classmethod
    def from_branches(cls, branches: Sequence[Branch], *, cache_namespace: str = "") -> Plan:
        if not branches:
            raise ValueError("a plan has at least one branch")
        branches = tuple(branches)
        return cls(branches=branches, root=_root(branches), cache_namespace=cache_namespace)

    @property
    def shared_prefix_len(self) -> int:
        """Tokens every branch starts with."""
        return len(self.root.tokens)

    @property
    def unique_tokens(self) -> int:
        """Distinct tokens: each trie node's run counted once (the prefill floor)."""
        return sum(len(node.tokens) for node in self.root.walk())

    @property
    def prompt_tokens(self) -> int:
        """Tokens of all branches as independent prefills would compute them."""
        return sum(len(b) for b in self.branches)
