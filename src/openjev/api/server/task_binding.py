"""Which task's fit answers which question of a decision request, on every decision route.

A request names its task with `x-openjev-task: <id>`: the task must be the calling key's
(404 otherwise, another key's told apart from none by nothing), fitted (409 while queued,
fitting or failed), fitted for this server's model, prompt version and base temperature and
for the readout the request reads (409, as a calibration file made for other inputs is
refused at start), and the request must ask its question (409 where no question has its
wording). Without the header, each question whose wording a ready task of the key has
takes that task's fit, where it was fitted for this model and readout (else the global fit
answers it, as before tasks).

A named task is read from the store before the request's work, awaited on the store's own
thread (`prefetched`); the rest of the binding is in memory, so a decision never waits on
the store's file on the event loop.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from openjev.api.contract.overrides import TASK_HEADER, TASK_ID_PATTERN
from openjev.api.server.task_store import TaskRecord, TaskStore
from openjev.core.abstain import AbstainRule
from openjev.core.calibration import TypeFit
from openjev.core.readouts import ReadoutSpec, question_type
from openjev.core.task_apply import TaskCalibration, wording_of
from openjev.core.types import DecisionRequest
from openjev.core.wording import PROMPT_VERSION
from openjev.errors import Conflict, InvalidInput, NotFound

_ID = re.compile(TASK_ID_PATTERN)


def checked_id(task_id: str) -> str:
    """`task_id` if it has a task id's form; 422 otherwise (before any lookup)."""
    if not _ID.match(task_id):
        raise InvalidInput(f"{task_id[:40]!r} is not a task id (task_ followed by 24 hex digits)")
    return task_id


def named_task(header: str | None, body: str | None) -> str | None:
    """The task a request names, by header or body field; 422 where the two name different ones."""
    if header is not None and body is not None and header.strip() != body:
        raise InvalidInput(f"{TASK_HEADER} names {header.strip()[:40]!r} but the body's x_task {body!r}: name one task")
    return header if header is not None else body


def binding(fingerprint: str, base_temperature: float, spec: ReadoutSpec, qtype: str, wording: str) -> dict[str, Any]:
    """What a fit is bound to, stored with it."""
    return {
        "fingerprint": fingerprint,
        "prompt_version": PROMPT_VERSION,
        "base_temperature": base_temperature,
        "readout": spec.name,
        "rotations": spec.rotations,
        "type": qtype,
        "wording": wording,
    }


def calibration_of(record: TaskRecord, floors: AbstainRule) -> TaskCalibration:
    """The stored fit as the service applies it: its threshold in place of the server's
    confidence floor, the server's other floors kept."""
    fit = record.fit or {}
    prior = {int(n): tuple(p) for n, p in (fit.get("position_prior") or {}).items()}
    rule = AbstainRule(floors.min_label_mass, floors.min_order_agreement, fit["threshold"]["min_confidence"])
    bound = fit["binding"]
    spec = ReadoutSpec(bound["readout"], bound["rotations"])
    rests_on = fit.get("rests_on") or {"examples": record.examples, "outcomes": 0}  # a fit made before outcomes
    cv_ece = (fit.get("after") or {}).get("ece")
    typed = TypeFit(fit["temperature"], tuple(fit["bias"]), prior)
    return TaskCalibration(record.id, spec, typed, rule, rests_on["examples"], rests_on["outcomes"], cv_ece)


def mismatch(record: TaskRecord, fingerprint: str, base_temperature: float, spec: ReadoutSpec) -> str | None:
    """Why the task's fit does not fit these inputs (None where it does)."""
    bound = (record.fit or {}).get("binding", {})
    if bound.get("fingerprint") != fingerprint:
        return f"it was fitted for weights {bound.get('fingerprint')}, this server's model has {fingerprint}"
    if bound.get("prompt_version") != PROMPT_VERSION:
        return (
            f"it was fitted for prompt version {bound.get('prompt_version')!r}, this server renders {PROMPT_VERSION!r}"
        )
    if not math.isclose(bound.get("base_temperature", math.nan), base_temperature):
        return f"it was fitted at --temperature {bound.get('base_temperature')}, this server uses {base_temperature:g}"
    read = spec.for_type(bound.get("type", ""))
    if (bound.get("readout"), bound.get("rotations")) != (read.name, read.rotations):
        return f"it was fitted under readout {bound.get('readout')}, this request reads {read.describe()}"
    return None


class ReadyIndex:
    """The ready tasks by (owner, wording), in memory: looked up on every decision without
    touching the file. Built from the store at start; kept by the jobs and the routes."""

    def __init__(self, store: TaskStore) -> None:
        self._lock = threading.Lock()
        self._by_wording: dict[tuple[str, str], TaskRecord] = {}
        for record in store.ready():
            self.put(record)

    def put(self, record: TaskRecord) -> None:
        with self._lock:
            self._by_wording[(record.owner, record.wording)] = record

    def drop(self, owner: str, task_id: str) -> None:
        with self._lock:
            for key, record in list(self._by_wording.items()):
                if key[0] == owner and record.id == task_id:
                    del self._by_wording[key]

    def get(self, owner: str, wording: str) -> TaskRecord | None:
        with self._lock:
            return self._by_wording.get((owner, wording))


async def prefetched(
    lookup: tuple[TaskStore, ReadyIndex] | None, tenant: str, names: Iterable[object]
) -> dict[str, TaskRecord | None]:
    """`tenant`'s tasks that a request names (its header, its body's fields), by id
    (None: the key has no such task), read on the store's thread. A name without a task id's
    form is left out: `task_fits` refuses it (422)."""
    if lookup is None:
        return {}
    store, who = lookup[0], tenant
    ids = sorted({n.strip() for n in names if isinstance(n, str) and _ID.match(n.strip())})
    return {task_id: await store.call(store.get, who, task_id) for task_id in ids}


def task_fits(
    tenant: str,
    header: str | None,
    request: DecisionRequest,
    records: Mapping[str, TaskRecord | None],
    spec: ReadoutSpec,
    index: ReadyIndex,
    model: tuple[str, float, AbstainRule],
) -> Mapping[str, TaskCalibration]:
    """By question id, the task fit of `tenant` (the caller's, core/caller.py) that answers
    it (module doc). `records`: `prefetched` for the request's names; `spec`: the readout as
    the service resolves it; `model`: (weights
    fingerprint, base temperature, the server's abstain floors)."""
    fingerprint, temperature, floors = model
    who = tenant
    if header is None:
        out = {}
        for qid, question in request.questions:
            record = index.get(who, wording_of(question))
            if record is not None and mismatch(record, fingerprint, temperature, spec) is None:
                out[qid] = calibration_of(record, floors)
        return out
    found = records.get(checked_id(header.strip()))
    if found is None:
        raise NotFound(f"this key has no task {header.strip()!r}")
    if found.status != "ready" or found.fit is None:
        raise Conflict(f"task {found.id} is {found.status}, not fitted: nothing to apply yet")
    why = mismatch(found, fingerprint, temperature, spec)
    if why is not None:
        raise Conflict(f"task {found.id} does not fit this request: {why}; refit it (add examples) or drop the header")
    named = {
        qid: calibration_of(found, floors)
        for qid, question in request.questions
        if wording_of(question) == found.wording and question_type(question) == found.fit["binding"]["type"]
    }
    if not named:
        raise Conflict(f"task {found.id} is for another question: none of this request's has its wording and options")
    return named


def fits_of(
    lookup: tuple[TaskStore, ReadyIndex] | None,
    tenant: str,
    header: str | None,
    request: DecisionRequest,
    records: Mapping[str, TaskRecord | None],
    spec: ReadoutSpec,
    model: tuple[str, float, AbstainRule],
) -> Mapping[str, TaskCalibration]:
    """`task_fits` where the server keeps tasks (`lookup`: its store and index); without
    them, a request naming a task gets a 404 and any other none."""
    if lookup is None:
        if header is not None:
            raise NotFound("this server keeps no tasks (--tasks-db off)")
        return {}
    return task_fits(tenant, header, request, records, spec, lookup[1], model)
