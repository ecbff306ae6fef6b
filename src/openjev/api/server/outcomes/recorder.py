"""Recording decisions for outcomes, off the event loop: the decision path only puts what it
answered on a bounded queue (`decided`, never blocking: a full queue drops the decision and
counts it in /metrics); one writer thread turns each into what a refit reads
(core/outcomes/readings.py) and writes them in batches, one transaction each, then holds
the retention (a count per key, an age). The state text never reaches the queue."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from openjev.api.contract.jev.convert import question_to_wire
from openjev.api.server.assembly import Runtime
from openjev.api.server.outcomes.store import DecisionRecord, OutcomeStore, QuestionReading, binding_text
from openjev.api.server.task_binding import binding
from openjev.api.server.task_jobs import base_fit
from openjev.core.outcomes.readings import fit_logs
from openjev.core.readouts import ReadoutSpec, question_type
from openjev.core.task_apply import wording_of
from openjev.core.types import DecisionResult, Question

log = logging.getLogger(__name__)

QUEUE_SIZE = 10_000  # decisions waiting for the writer; beyond it they are dropped (counted)
BATCH = 512  # decisions per transaction at most
AGE_PRUNE_EVERY_S = 60.0


@dataclass(frozen=True)
class Retention:
    """Decisions kept per key (the oldest go first) and for how long."""

    per_key: int
    max_age_s: float


@dataclass(frozen=True)
class Decided:
    """What the decision path hands the writer: whose decision, its id, when, its questions
    (never the state), the result, and the readout the request asked for (None: the default)."""

    owner: str
    id: str
    created: float
    questions: tuple[tuple[str, Question], ...]
    result: DecisionResult
    readout: ReadoutSpec | None


class Recorder:
    """The queue and its writer thread (`start`, `close`); `flush` waits until what was
    queued before it is written (an outcome may name a decision answered a moment ago)."""

    def __init__(
        self,
        store: OutcomeStore,
        retention: Retention,
        runtime: Runtime,
        base_temperature: float,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.store = store
        self.retention = retention
        self._runtime = runtime
        self._temperature = base_temperature
        self._clock = clock
        self._queue: queue.Queue[Decided | threading.Event | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        self._counts: dict[str, int] = {}
        self._pruned_at = 0.0
        self.recorded = Counter("openjev_outcome_decisions_recorded", "decisions kept for outcomes", registry=registry)
        self.dropped = Counter(
            "openjev_outcome_decisions_dropped", "decisions not kept: the recorder's queue was full", registry=registry
        )
        self.failures = Counter(
            "openjev_outcome_write_failures", "batches of decisions the store failed to write", registry=registry
        )

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._write_loop, name="openjev-outcomes", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """What is queued written, then the thread stopped."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)

    def decided(self, item: Decided) -> None:
        """Queue a decision (from the event loop: never blocks; dropped and counted when full)."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped.inc()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (in a worker thread) until everything queued before this call is written."""
        if self._thread is None:
            return True
        marker = threading.Event()
        try:
            self._queue.put(marker, timeout=timeout_s)
        except queue.Full:
            return False
        return marker.wait(timeout_s)

    def _write_loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write([b for b in batch if isinstance(b, Decided)])
            for marker in batch:
                if isinstance(marker, threading.Event):
                    marker.set()
            if any(b is None for b in batch):
                return

    def _write(self, decided: list[Decided]) -> None:
        try:
            records = [r for r in (self.record_of(d) for d in decided) if r is not None]
            if records:
                self.store.write(records)
                self.recorded.inc(len(records))
            self._prune(records)
        except Exception:  # the store's fault (disk full, locked): counted and logged, never the decisions'
            self.failures.inc()
            log.exception("outcomes: %d decisions could not be written", len(decided))

    def record_of(self, item: Decided) -> DecisionRecord | None:
        """What is stored of a decision: per question its reading, binding and fit (None where
        the result carries no readings, or the model is not loaded)."""
        service, loaded = self._runtime.service, self._runtime.loaded
        result = item.result
        if service is None or loaded is None or len(result.readings) != len(item.questions):
            return None
        spec = service.resolve(item.readout or service.default_readout)
        out = []
        for n, ((qid, question), combined) in enumerate(zip(item.questions, result.readings, strict=True)):
            qtype = question_type(question)
            typed = spec.for_type(qtype)
            wording = wording_of(question)
            bound = binding(loaded.card.fingerprint, self._temperature, typed, qtype, wording)
            fit = result.fits[n].name if n < len(result.fits) else None
            logs = fit_logs(combined, base_fit(service, typed, qtype))
            question_json = json.dumps(question_to_wire(question), ensure_ascii=False, separators=(",", ":"))
            out.append(QuestionReading(n, qid, wording, question_json, binding_text(bound), logs, fit))
        return DecisionRecord(item.owner, item.id, item.created, tuple(out))

    def _prune(self, records: list[DecisionRecord]) -> None:
        """The retention: each key's count after this batch, and once a minute the age."""
        now = self._clock()
        for r in records:
            if r.owner not in self._counts:
                self._counts[r.owner] = self.store.count(r.owner)
            else:
                self._counts[r.owner] += 1
        over = [o for o in dict.fromkeys(r.owner for r in records) if self._counts[o] > self.retention.per_key]
        if over:
            self.store.prune(over, self.retention.per_key, now - self.retention.max_age_s)
            for o in over:
                self._counts[o] = self.retention.per_key
        if now - self._pruned_at >= AGE_PRUNE_EVERY_S:
            self._pruned_at = now
            if self.store.prune((), self.retention.per_key, now - self.retention.max_age_s):
                self._counts.clear()  # ages took some: counted again as keys come back
