"""The `/v1/tasks` wire shapes (pydantic): a task is one Jev question with labelled
examples; what a task shows once created, while it fits, and once its fit is ready."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from openjev.api.contract.jev.schemas import Description, Question, _refuse_bad_chat


class TaskExample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: Description = Field(..., description="what the question refers to, as in /v1/systemone")
    answer: bool | str | int = Field(
        ...,
        description="the gold answer: noul true or false; choice the option's name; score the level's index "
        "(0 = the lowest)",
    )

    @field_validator("state")
    @classmethod
    def _chat(cls, v: Any) -> Any:
        return _refuse_bad_chat(v)


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Question = Field(..., description="the decision, as a Jev question object")
    examples: list[TaskExample] = Field(..., description="labelled examples (at least 10; --max-task-examples)")
    target_precision: float | None = Field(
        None, gt=0.0, le=1.0, description="the precision its abstain threshold is chosen for (--task-target-precision)"
    )
    caller_id: str | None = Field(None, max_length=128, description="a stable name of your own for this task")


class TaskExamples(BaseModel):
    model_config = ConfigDict(extra="forbid")

    examples: list[TaskExample] = Field(..., min_length=1, description="more labelled examples: the task is refitted")


Status = Literal["collecting", "queued", "fitting", "ready", "failed"]  # collecting: fed by outcomes, too few yet


class TaskCreated(BaseModel):
    id: str
    status: Status


class TaskProgress(BaseModel):
    done: int = Field(..., description="examples read")
    total: int = Field(..., description="examples to read (0 until the job starts)")
    eta_s: float | None = Field(None, description="seconds left at the pace so far (null before a first reading)")


class TaskView(BaseModel):
    id: str
    status: Status
    question: dict[str, Any]
    caller_id: str | None
    examples: int
    outcomes: int = Field(0, description="outcomes posted for decisions that asked its question (/v1/outcomes)")
    target_precision: float
    progress: TaskProgress
    fit: dict[str, Any] | None = Field(
        None,
        description="once ready: what it was fitted for (model fingerprint, prompt version, readout), the fit "
        "(temperature, bias, form, shrinkage) and its cross-validated figures before and after (ECE, Brier, "
        "accuracy) with the abstain threshold and what it covers",
    )
    error: str | None = None


class TaskList(BaseModel):
    tasks: list[TaskView] = Field(..., description="a page of this key's tasks, oldest first")
    next: str | None = Field(
        None, description="pass as `after` for the next page; null on the last page (nothing follows)"
    )
