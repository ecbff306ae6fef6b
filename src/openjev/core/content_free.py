"""Content-free calibration (Zhao et al. 2021): a question read once on a state that says
nothing ("N/A"), its answer divided out of every answer to that question, so that what the
model prefers before it reads the state (one option's wording, one letter) does not pass
for evidence. A calibration file turns it on per question type (`"content_free": true` in
a type's fit; core/calibration.py), fitted on answers divided the same way.

The reading is engine work like any other: it is compiled and priced as a request of its
own, charged to the caller, and read with the request's readout. It is cached per
(cache namespace, readout, question): traffic repeats its questions, so a question costs
its content-free reading once; a namespace never reads another's (whose questions were
asked is theirs to know)."""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from openjev.core.readouts import Combined, ReadoutSpec
from openjev.core.types import DecisionRequest, Question, State, Turn

STATE = State(turns=(Turn("user", "N/A"),))
_FLOOR = 1e-12


def request_of(request: DecisionRequest, questions: Sequence[tuple[str, Question]]) -> DecisionRequest:
    """The content-free twin of `request` for `questions`: the same caller and namespace, the
    state emptied of content."""
    return DecisionRequest(STATE, tuple(questions), request.cache_namespace, request.share)


def divide(probs: Sequence[float], free: Sequence[float]) -> tuple[float, ...]:
    """`probs` divided option by option by the content-free answer `free`, renormalised."""
    if len(free) != len(probs):
        raise ValueError(f"content-free answer has {len(free)} options, the question {len(probs)}")
    w = [p / max(f, _FLOOR) for p, f in zip(probs, free, strict=True)]
    total = math.fsum(w)
    return tuple(v / total for v in w)


class ContentFreeCache:
    """The content-free answers read so far, least recently used evicted past `size` entries
    (each a few hundred bytes, whatever the question's length)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._answers: OrderedDict[Hashable, tuple[float, ...]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(namespace: str, spec: ReadoutSpec, question: Question) -> Hashable:
        """A digest of the question, not the question: an entry's size never grows with its text."""
        return (namespace, spec, hashlib.sha256(repr(question).encode()).digest())

    def get(self, key: Hashable) -> tuple[float, ...] | None:
        found = self._answers.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._answers.move_to_end(key)
        return found

    def peek(self, key: Hashable) -> tuple[float, ...] | None:
        """`get` without counting a hit or a miss."""
        return self._answers.get(key)

    def put(self, key: Hashable, probs: tuple[float, ...]) -> None:
        self._answers[key] = probs
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answers)


class ContentFreeReadings:
    """The service's content-free answers: which of a request's questions still need one
    read (`missing`, as the twin request to read), what was read (`store`), and each
    question's answer (`answers`)."""

    def __init__(self, cache: ContentFreeCache | None = None) -> None:
        self.cache = cache if cache is not None else ContentFreeCache()

    def missing(
        self, request: DecisionRequest, spec: ReadoutSpec, wanted: Sequence[tuple[str, Question]]
    ) -> DecisionRequest | None:
        """The twin request reading each of `wanted` not cached yet (a question asked twice,
        once); None when every one is cached."""
        seen: dict[Hashable, tuple[str, Question]] = {}
        for qid, q in wanted:
            key = self.cache.key(request.cache_namespace, spec, q)
            if key not in seen and self.cache.get(key) is None:
                seen[key] = (qid, q)
        return request_of(request, list(seen.values())) if seen else None

    def store(
        self,
        request: DecisionRequest,
        spec: ReadoutSpec,
        questions: Sequence[tuple[str, Question]],
        combined: Sequence[Combined],
    ) -> None:
        for (_, q), c in zip(questions, combined, strict=True):
            self.cache.put(self.cache.key(request.cache_namespace, spec, q), c.probs)

    def stats(self) -> dict[str, float]:
        """The cache's entries and, since start, the questions found in it and those read."""
        return {
            "content_free_entries": len(self.cache),
            "content_free_hits": self.cache.hits,
            "content_free_misses": self.cache.misses,
        }

    def answers(
        self, request: DecisionRequest, spec: ReadoutSpec, wanted: Sequence[tuple[str, Question]]
    ) -> dict[str, tuple[float, ...]]:
        """Per question id of `wanted`, its content-free answer (read by now)."""
        out = {}
        for qid, q in wanted:
            found = self.cache.peek(self.cache.key(request.cache_namespace, spec, q))
            if found is not None:
                out[qid] = found
        return out
