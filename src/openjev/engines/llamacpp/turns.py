"""Which request the llama.cpp worker serves next, chosen again before every decode call.

The candidates are the request in the context, the requests set aside (started, their
context saved as bytes), and the waiting ones; the keys' fair order picks among them
(engines/fair_share.py `FairTurns`, each candidate's next step in tokens), so a key with a
small request waiting goes next after the running step, whatever another key's request has
left. With one key waiting the running request keeps the context (arrival order). Three
bounds keep switching cheap and memory bounded: a key's later requests wait for its started
one (one started request per key); at most MAX_SAVED requests are set aside at once (each
holds its context's KV as bytes), beyond which the running one is not interrupted; and a
request that took the context keeps it HOLD_STEPS steps before one set aside may take it
back (two long requests alternate every few steps, not every step). Pure: no binding.
"""

from __future__ import annotations

from collections.abc import Sequence

from openjev.engines.fair_share import FairTurns
from openjev.engines.llamacpp.steps import Job

MAX_SAVED = 2
HOLD_STEPS = 4


class Turns:
    def __init__(self) -> None:
        self._fair = FairTurns()
        self.held = 0  # steps the request in the context has run since it took it

    def next(self, current: Job | None, saved: Sequence[Job], waiting: Sequence[Job], step_tokens: int) -> Job | None:
        """The request to run the next step of (`current` to go on), charging its key; None
        where nothing may run (nothing is there)."""
        started = [current] if current is not None else []
        keys = {j.plan.share.tenant for j in [*started, *saved]}
        candidates = list(started)
        if current is None or self.held >= HOLD_STEPS:
            candidates += saved
        if current is None or len(saved) < MAX_SAVED:
            candidates += [j for j in waiting if j.plan.share.tenant not in keys]
        if not candidates:
            return None
        choice = candidates[self._fair.choose([j.want(step_tokens) for j in candidates])]
        self.held = self.held + 1 if choice is current else 1
        return choice
