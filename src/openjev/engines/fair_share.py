"""Per-key fair order: whose work an engine serves next when several keys have work waiting.

Each waiting item (a request's next slice, a request, an HTTP call) comes with its key's
`Share` (core/types.py: the key's name and weight) and its cost in tokens. Two forms, for
the two ways engines run work:

- `FairRounds`, for engines that run rounds of many requests' work in shared forwards (the
  in-process scheduler): deficit round robin by tokens. Each round every key with work
  waiting is credited `quantum x weight` tokens; its items go in, in their queue order,
  while its credit covers them; what is left carries over while the key still has work
  waiting and is dropped when it has none (an idle key banks nothing). A key with one small
  request waiting is thus in the next round whatever another key has queued, a round is
  about one quantum per waiting key (short enough for a light key's answer not to wait for
  a heavy key's whole queue; a key that had work in the last round counts as waiting for
  this), and over rounds in which several keys wait each gets tokens in proportion to its
  weight.
- `FairTurns`, for engines that start one item at a time (llama.cpp's one request at a
  time, the HTTP engines' calls waiting for a slot): the waiting key served least so far
  (tokens / weight) goes next; a key that comes back after waiting for nothing starts level
  with the least served waiting key, and among equals the key with fewer items waiting goes
  first.

With a single key waiting (or none: a server without keys, every item's tenant "") both
keep today's order: queue order, and a round takes every item while its token budget lasts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from openjev.config import InProcessSettings
from openjev.core.types import Share

# Tokens a weight-1 key is credited per round when several keys wait (--fair-quantum's
# default): a round is then about this many tokens per waiting key, which keeps forwards large
# enough to batch well while a light key's request waits for one such round, not for a heavy
# key's whole queue.
QUANTUM = InProcessSettings.fair_quantum

# A key served in the last LINGER_ROUNDS rounds still sizes the round as if it waited: a
# client that sends its next request on its last answer arrives during the round after it,
# which would otherwise be another key's whole queue.
LINGER_ROUNDS = 1


@dataclass(frozen=True)
class Want:
    """One waiting item: whose share it is served from and what it costs (tokens)."""

    share: Share
    tokens: int


def in_order(wants: Sequence[Want], budget: int) -> list[int]:
    """Today's round: items in queue order while `budget` tokens last; an item that would
    not fit whole is left for the next round, unless it is the first (cut to the budget by
    the caller)."""
    picked: list[int] = []
    tokens = 0
    for i, want in enumerate(wants):
        if tokens >= budget:
            break
        if picked and want.tokens > budget - tokens:
            continue
        picked.append(i)
        tokens += min(want.tokens, budget - tokens)
    return picked


class FairRounds:
    """Deficit round robin across keys, one call to `pick` per round (see the module)."""

    def __init__(self, quantum: int = QUANTUM) -> None:
        if quantum < 1:
            raise ValueError("the quantum is at least one token")
        self.quantum = quantum
        self._credit: dict[str, float] = {}
        self._rounds = 0
        self._last: dict[str, int] = {}  # the last round in which each recent key had work waiting

    def pick(self, wants: Sequence[Want], budget: int) -> list[int]:
        """Indices of `wants` that go in this round, in the order served (each key's in its
        queue order), their tokens together within `budget` (the first may be larger: the
        caller cuts it)."""
        queues: dict[str, list[int]] = {}
        for i, want in enumerate(wants):
            queues.setdefault(want.share.tenant, []).append(i)
        self._rounds += 1
        self._last.update(dict.fromkeys(queues, self._rounds))
        self._last = {k: r for k, r in self._last.items() if self._rounds - r <= LINGER_ROUNDS}
        if len(self._last) <= 1:
            self._credit.clear()
            return in_order(wants, budget)
        self._credit = {k: self._credit.get(k, 0.0) for k in queues}  # a key with nothing waiting banks nothing
        self._grant(wants, queues)
        keys = list(queues)
        start = self._rounds % len(keys)  # where the budget binds, no key is always first
        picked: list[int] = []
        total = 0
        for key in keys[start:] + keys[:start]:
            taken = 0
            for i in queues[key]:
                cost = wants[i].tokens
                if cost > self._credit[key] or (picked and total + cost > budget):
                    break
                picked.append(i)
                self._credit[key] -= cost
                total += cost
                taken += 1
            if taken == len(queues[key]):
                self._credit[key] = 0.0  # its queue emptied: leftover credit is not kept
        return picked

    def _grant(self, wants: Sequence[Want], queues: dict[str, list[int]]) -> None:
        """Credit each waiting key its quantum x weight, as many rounds' worth as it takes
        for some key's first item to fit (rounds in which none would are skipped)."""
        rounds = 1
        if all(wants[q[0]].tokens > self._credit[k] for k, q in queues.items()):
            rounds = min(
                math.ceil((wants[q[0]].tokens - self._credit[k]) / (self.quantum * _weight(wants[q[0]].share)))
                for k, q in queues.items()
            )
        for k, q in queues.items():
            self._credit[k] += rounds * self.quantum * _weight(wants[q[0]].share)


class FairTurns:
    """One item at a time: the least served waiting key goes next (see the module)."""

    def __init__(self) -> None:
        self._served: dict[str, float] = {}  # tokens / weight, per key with items waiting

    def choose(self, waiting: Sequence[Want]) -> int:
        """The index in `waiting` (queue order) of the item to start now; charges its key."""
        if not waiting:
            raise ValueError("nothing is waiting")
        counts: dict[str, int] = {}
        for want in waiting:
            counts[want.share.tenant] = counts.get(want.share.tenant, 0) + 1
        if len(counts) == 1:
            self._served.clear()
            return 0
        known = [self._served[k] for k in counts if k in self._served]
        floor = min(known) if known else 0.0
        self._served = {k: max(self._served.get(k, floor), floor) for k in counts}
        best = min(range(len(waiting)), key=lambda i: self._rank(waiting[i], counts, i))
        chosen = waiting[best]
        self._served[chosen.share.tenant] += chosen.tokens / _weight(chosen.share)
        return best

    def _rank(self, want: Want, counts: dict[str, int], index: int) -> tuple[float, int, int]:
        return self._served[want.share.tenant], counts[want.share.tenant], index


def _weight(share: Share) -> int:
    return max(1, share.weight)
