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
from dataclasses import dataclass, field

from openjev.core.types import NO_KEY, Share


@dataclass(frozen=True, eq=False)
class Branch:
    """`own`: this branch's tokens after `prefix` (the whole branch where `prefix` is empty).
    Equality and hashing are on the whole token sequence, the labels and the layout, however
    split.

    `parallel`: (start, end) spans of the whole sequence (`input_ids`, prefix included),
    adjacent and non-empty, read in parallel (see the module's docstring); at least one token
    follows the last."""

    own: tuple[int, ...]
    label_ids: tuple[int, ...]
    prefix: tuple[int, ...] = ()
    parallel: tuple[tuple[int, int], ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        for name in ("own", "label_ids", "prefix"):
            if not isinstance(getattr(self, name), tuple):  # callers may pass lists
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.parallel:
            object.__setattr__(self, "parallel", tuple((int(a), int(b)) for a, b in self.parallel))
        if not self.own and not self.prefix:
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
            if at >= len(self):
                raise ValueError("a parallel layout needs at least one token after its spans")

    @property
    def share_limit(self) -> int:
        """Tokens from this index on are never shared with another branch."""
        return self.parallel[0][0] if self.parallel else len(self)

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
        return (
            self.label_ids == other.label_ids
            and self.parallel == other.parallel
            and len(self) == len(other)
            and self.input_ids == other.input_ids
        )

    def __hash__(self) -> int:
        return hash((self.input_ids, self.label_ids, self.parallel))


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


def _build(
    seqs: Sequence[tuple[int, ...]], limits: Sequence[int], indices: list[int], start: int, base: int
) -> TrieNode:
    """The node at `start` of `seqs` (the branches' own tokens), placed at `base` + start.
    `limits[i]`: branch i's tokens from this index of `seqs[i]` on are never shared."""
    own = [seqs[i] for i in indices]
    end = _lcp(own, start)
    if len(indices) > 1:  # a parallel layout is never shared: it stays in its branch's own leaf
        end = max(start, min(end, *(limits[i] for i in indices)))
    ends = tuple(i for i in indices if len(seqs[i]) == end)
    groups: dict[tuple[int, int], list[int]] = {}
    for i in indices:
        ids = seqs[i]
        if len(ids) > end:
            alone = limits[i] <= end  # past its share limit: a leaf of its own
            groups.setdefault((-1, i) if alone else (ids[end], 0), []).append(i)
    children = tuple(_build(seqs, limits, group, end, base) for group in groups.values())
    return TrieNode(start=base + start, tokens=own[0][start:end], children=children, ends=ends)


def _root(branches: tuple[Branch, ...]) -> TrieNode:
    prefix = branches[0].prefix
    if all(b.prefix is prefix for b in branches) or all(b.prefix == prefix for b in branches):
        seqs = [b.own for b in branches]  # the shared prefix is compared once, not per branch
    else:
        prefix, seqs = (), [b.input_ids for b in branches]
    base = len(prefix)
    # A layout's spans index the whole sequence; a layout never starts inside the prefix
    # shared here (a branch's own tokens hold it whole), but clamp to 0 to stay a trie.
    limits = [max(0, b.share_limit - base) for b in branches]
    top = _build(seqs, limits, list(range(len(branches))), 0, base)
    if not prefix:
        return top
    return TrieNode(start=0, tokens=prefix + top.tokens, children=top.children, ends=top.ends)


@dataclass(frozen=True)
class Plan:
    """`cache_namespace`: an engine may serve this plan's tokens from a cache only where
    they were computed for a plan of the same namespace (tenants do not see each other's
    states through cache hits). "" is the namespace of a server without keys.
    `share`: whose share of the engine runs it (the caller's key and weight), for engines
    that order work across requests."""

    branches: tuple[Branch, ...]
    root: TrieNode
    cache_namespace: str = ""
    share: Share = NO_KEY

    @classmethod
    def from_branches(cls, branches: Sequence[Branch], *, cache_namespace: str = "", share: Share = NO_KEY) -> Plan:
        if not branches:
            raise ValueError("a plan has at least one branch")
        branches = tuple(branches)
        return cls(branches=branches, root=_root(branches), cache_namespace=cache_namespace, share=share)

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
