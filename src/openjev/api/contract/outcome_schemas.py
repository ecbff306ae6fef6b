"""The `/v1/outcomes` wire shapes (pydantic): the true answers of past decisions' questions,
posted by the caller, and what the server accepted of them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

MAX_OUTCOMES = 1000  # outcomes in one call; beyond: 422
MAX_QUESTION_INDEX = 4095  # --max-questions is at most 4096
DECISION_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class Basis(BaseModel):
    kind: Literal["task", "global", "none"] = Field(
        ...,
        description="task: a task's fit, checked on your own labelled text; global: the model's shipped fit, not "
        "checked on your text; none: the raw reading",
    )
    fit: str | None = Field(None, description="the fit's name: task:<id>, or the calibration's id")
    examples: int | None = Field(None, description="task: the labelled examples its fit rests on")
    outcomes: int | None = Field(None, description="task: the outcomes (/v1/outcomes) its fit rests on")
    cv_ece: float | None = Field(None, description="task: its fit's cross-validated ECE")


class OutcomeItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision_id: str = Field(
        ...,
        pattern=DECISION_ID_PATTERN,
        description="the decision's handle: the response's request id (`x-request-id`, `request-id`); a batch "
        "item's is the batch's request id, `:` and the item's index",
    )
    question: (
        Annotated[StrictStr, Field(min_length=1, max_length=256)]
        | Annotated[StrictInt, Field(ge=0, le=MAX_QUESTION_INDEX)]
    ) = Field(..., description="the question's name (Jev: its key in `questions`), or its index where it has none")
    answer: StrictBool | StrictStr | StrictInt = Field(
        ...,
        description="the true answer, as a task example's: noul true or false; choice the option's name; score the "
        "level's index (0 = the lowest)",
    )


class OutcomePost(BaseModel):
    model_config = ConfigDict(extra="forbid")

    outcomes: list[OutcomeItem] = Field(
        ...,
        min_length=1,
        max_length=MAX_OUTCOMES,
        description=f"1 to {MAX_OUTCOMES} outcomes; one that is refused refuses the whole call, nothing kept",
    )


class OutcomeAccepted(BaseModel):
    decision_id: str
    question: str = Field(..., description="the question's name")
    status: Literal["new", "same", "changed"] = Field(
        ..., description="new; same: posted before with this answer, nothing changed; changed: the latest answer wins"
    )
    task: str = Field(..., description="the task of the question's wording this outcome feeds (created if none)")


class OutcomesAccepted(BaseModel):
    accepted: int = Field(..., description="outcomes accepted (every one posted)")
    outcomes: list[OutcomeAccepted]
