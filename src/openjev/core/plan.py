"""A Plan: the branches of one request as a token-prefix trie.

Engine-agnostic, pure data. Each branch is one prefill (`input_ids`) whose last position
is read for the log-probs of `label_ids`. The trie says what is shared: the root holds
the prefix common to every branch; each deeper node a run shared by the branches under
it. Engines choose how to execute it (compute each node once, or order submissions for
a radix cache); answers must not depend on that choice.

A branch may carry a parallel layout (`parallel`): spans of its input ids that are read
side by side instead of one after the other. Each span sees what precedes the first span
and itself, starting at the first span's position; the tokens after the last span see
every span, at positions continuing from the longest. An engine that can run layouts
says so (`Engine.parallel_layouts`); the others must not be given such a branch. The trie
never shares a token at or past a layout branch's first span, so a layout lies wholly in
its branch's own leaf.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Branch:
    """`parallel`: (start, end) spans of `input_ids`, adjacent and non-empty, read in
    parallel (see the module's docstring); at least one token follows the last."""

    input_ids: tuple[int, ...]
    label_ids: tuple[int, ...]
    parallel: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("a branch has at least one token")
        if not self.label_ids:
            raise ValueError("a branch reads at least one label")
        if self.parallel:
            at = self.parallel[0][0]
            if at < 1:
                raise ValueError("a parallel layout needs at least one token before its spans")
            for start, end in self.parallel:
                if start != at or end <= start:
                    raise ValueError(f"parallel spans must be adjacent and non-empty: {self.parallel}")
                at = end
            if at >= len(self.input_ids):
                raise ValueError("a parallel layout needs at least one token after its spans")

    @property
    def share_limit(self) -> int:
        """Tokens from this index on are never shared with another branch."""
        return self.parallel[0][0] if self.parallel else len(self.input_ids)


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


def _lcp(seqs: Sequence[Sequence[int]], start: int) -> int:
    """Length of the longest common prefix of `seqs`, knowing they agree below `start`."""
    shortest = min(len(s) for s in seqs)
    first = seqs[0]
    n = start
    while n < shortest:
        tok = first[n]
        if any(s[n] != tok for s in seqs):
            break
        n += 1
    return n


def _build(branches: Sequence[Branch], indices: list[int], start: int) -> TrieNode:
    seqs = [branches[i].input_ids for i in indices]
    end = _lcp(seqs, start)
    if len(indices) > 1:  # a parallel layout is never shared: it stays in its branch's own leaf
        end = max(start, min(end, *(branches[i].share_limit for i in indices)))
    ends = tuple(i for i in indices if len(branches[i].input_ids) == end)
    groups: dict[tuple[int, int], list[int]] = {}
    for i in indices:
        ids = branches[i].input_ids
        if len(ids) > end:
            own = branches[i].share_limit <= end  # past its share limit: a leaf of its own
            groups.setdefault((-1, i) if own else (ids[end], 0), []).append(i)
    children = tuple(_build(branches, group, end) for group in groups.values())
    return TrieNode(start=start, tokens=tuple(seqs[0][start:end]), children=children, ends=ends)


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
        return cls(
            branches=branches, root=_build(branches, list(range(len(branches))), 0), cache_namespace=cache_namespace
        )

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
        return sum(len(b.input_ids) for b in self.branches)
