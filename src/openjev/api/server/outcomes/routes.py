"""`POST /v1/outcomes`: the true answers of a key's past decisions, and the hook every
decision route calls once it answered (`decided`).

A call is all or nothing: every outcome is checked (the decision is the key's and still
kept, 404; the question is one it asked, 404; the answer is one of its options, 422) before
any is stored, then all are stored in one transaction. Posting an outcome again with the
same answer changes nothing; with another answer the latest wins. Each outcome then feeds
its question's task (api/server/outcomes/refits.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request

from openjev.api.contract import documented, paths
from openjev.api.contract.outcome_schemas import OutcomeItem, OutcomePost, OutcomesAccepted
from openjev.api.identity.auth import require_key
from openjev.api.identity.caller import caller_of, entry_of
from openjev.api.operations.middleware import request_id_of
from openjev.api.server.outcomes.recorder import Decided, Recorder
from openjev.api.server.outcomes.refits import Refits
from openjev.api.server.outcomes.store import Asked
from openjev.api.server.outcomes.tenant import tenant
from openjev.api.server.task_jobs import gold_of, question_of
from openjev.core.readouts import ReadoutSpec
from openjev.core.types import DecisionRequest, DecisionResult
from openjev.errors import NotFound

_ERRORS: documented.Responses = {
    **documented.BODY_ERRORS,
    404: documented._error("this key has no such decision (unknown, another key's, or past its retention) or question"),
}


@dataclass(frozen=True)
class Outcomes:
    """What the outcome routes and hook use: the recorder (None where recording is off) and the refits."""

    recorder: Recorder | None
    refits: Refits | None


def decided(
    request: Request,
    decision: DecisionRequest,
    result: DecisionResult,
    readout: ReadoutSpec | None,
    body: Any = None,
    item: int | None = None,
) -> None:
    """The decision path's one call once a decision is answered: queue it for recording
    (api/server/outcomes/recorder.py; never blocks). `body`: the request's parsed body, for
    the names of a format whose questions are a list (OpenAI's `name`); `item`: a batch
    item's index, whose id is the batch's request id, ":" and the index."""
    outcomes: Outcomes | None = getattr(request.app.state, "outcomes", None)
    rid = request_id_of(request.scope)
    if outcomes is None or outcomes.recorder is None or rid is None:
        return
    handle = rid if item is None else f"{rid}:{item}"
    questions = decision.questions
    listed = getattr(body, "questions", None)
    if isinstance(listed, list) and len(listed) == len(questions):  # named where the caller named them
        questions = tuple(
            (getattr(q, "name", None) or qid, question) for q, (qid, question) in zip(listed, questions, strict=True)
        )
    outcomes.recorder.decided(Decided(tenant(request), handle, time.time(), questions, result, readout))


def _checked(refits: Refits, owner: str, items: list[OutcomeItem]) -> list[tuple[Asked, int]]:
    """Every outcome's question and gold index (404, 422 at the first bad one; nothing stored)."""
    out = []
    for i, item in enumerate(items):
        asked = refits.outcomes.asked(owner, item.decision_id, item.question)
        if asked is None:
            raise NotFound(
                f"outcomes[{i}]: this key has no decision {item.decision_id!r} with a question {item.question!r}"
                " (unknown, or past its retention)"
            )
        out.append((asked, gold_of(question_of(asked.question), item.answer, f"outcomes[{i}]")))
    return out


def _store(refits: Refits, owner: str, checked: list[tuple[Asked, int]]) -> list[dict[str, Any]]:
    """The outcomes stored in one transaction, each joined to its question's task."""
    statuses = refits.outcomes.answer(owner, [(a.decision, a.n, gold) for a, gold in checked], time.time())
    tasks: dict[str, str] = {}
    out = []
    for (asked, _), status in zip(checked, statuses, strict=True):
        if asked.wording not in tasks:
            tasks[asked.wording] = refits.task_of(owner, asked).id
        out.append(
            {"decision_id": asked.decision, "question": asked.name, "status": status, "task": tasks[asked.wording]}
        )
    return out


def install(app: FastAPI, outcomes: Outcomes) -> None:
    """The route of /v1/outcomes."""

    @app.post(
        paths.OUTCOMES,
        response_model=OutcomesAccepted,
        summary="Post the true answers of past decisions (they refit the questions' tasks)",
        dependencies=[Depends(require_key)],
        responses=_ERRORS,
    )
    async def post(body: OutcomePost, request: Request) -> dict[str, Any]:
        entry = entry_of(caller_of(request))
        if entry is not None:  # one of its requests/min, as a task call is
            await request.app.state.ops.key_limits.admit(entry)
        refits = outcomes.refits
        if refits is None:
            raise NotFound("this server keeps no decisions (--outcome-retention 0 or --tasks-db off)")
        if outcomes.recorder is not None:  # a decision answered a moment ago is written first
            await asyncio.to_thread(outcomes.recorder.flush)
        owner = tenant(request)
        checked = await asyncio.to_thread(_checked, refits, owner, body.outcomes)
        accepted = await asyncio.to_thread(_store, refits, owner, checked)
        for task in dict.fromkeys(a["task"] for a in accepted):
            await refits.poke(owner, task)
        return {"accepted": len(accepted), "outcomes": accepted}
