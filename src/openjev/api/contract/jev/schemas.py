"""Wire schemas of the Jev SystemOne API (docs/api-jev.md). Pydantic lives only here.

Request models validate shape and the contract's fixed ranges; configurable limits
(questions per request, token budgets) are checked after parsing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator

from openjev.api.contract.outcome_schemas import Basis
from openjev.api.contract.overrides import TASK_ID_PATTERN
from openjev.config import MAX_CHOICE_OPTIONS, MAX_SCORE_LEVELS, MIN_CHOICE_OPTIONS, MIN_SCORE_LEVELS

# Instructions, descriptions and the state may be text or structured JSON.
Description = str | dict[str, Any] | list[Any]

CHAT_ROLES = ("system", "user", "assistant")


def chat_items(value: Any) -> list[dict[str, Any]] | None:
    """The turns of a chat-shaped state, else None. Chat-shaped: a non-empty array (alone or
    as `{"messages": [...]}`) whose every item is an object with exactly the keys `role` and
    `content`. Whether those turns are valid is `chat_problem`'s question."""
    if isinstance(value, dict) and set(value) == {"messages"}:
        value = value["messages"]
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(item, dict) and set(item) == {"role", "content"} for item in value):
        return value
    return None


def chat_problem(value: Any) -> str | None:
    """What is wrong with a chat-shaped state (None if nothing, or if it is not chat-shaped):
    every role one of CHAT_ROLES, every content non-null."""
    items = chat_items(value)
    where = "state.messages" if isinstance(value, dict) else "state"
    for i, item in enumerate(items or ()):
        role = item["role"]
        if not isinstance(role, str) or role not in CHAT_ROLES:
            shown = repr(role[:40]) if isinstance(role, str) else f"a JSON {type(role).__name__}"
            return (
                f"{where}[{i}].role is {shown}: a chat-shaped state's roles are {', '.join(CHAT_ROLES)}; "
                'to send other turns as data, wrap the list in an object (e.g. {"transcript": [...]})'
            )
        if item["content"] is None:
            return f"{where}[{i}].content is null: every chat turn needs content (text or JSON)"
    return None


def _refuse_bad_chat(v: Any) -> Any:
    """The `state` validator of every body that carries one: chat-shaped states with a
    problem (chat_problem) are refused with its reason."""
    problem = chat_problem(v)
    if problem:
        raise ValueError(problem)
    return v


def _blank(value: Any) -> bool:
    return (isinstance(value, str) and not value.strip()) or (isinstance(value, dict | list) and not value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoulCriteria(_Strict):
    true: Description | None = Field(None, description="what makes the answer true")
    false: Description | None = Field(None, description="what makes the answer false")


class NoulQuestion(_Strict):
    type: Literal["noul"]
    instructions: Description | None = None
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _says_something(self) -> NoulQuestion:
        sides = self.criteria is not None and (self.criteria.true is not None or self.criteria.false is not None)
        if self.instructions is None and not sides:
            raise ValueError("a noul question needs instructions or at least one non-null criteria side")
        return self


class ChoiceQuestion(_Strict):
    type: Literal["choice"]
    instructions: Description | None = None
    criteria: dict[str, Description | None] = Field(
        ...,
        min_length=MIN_CHOICE_OPTIONS,
        max_length=MAX_CHOICE_OPTIONS,
        description="option name -> description (null: the name alone speaks); names are returned byte for byte. "
        "Names must contain a non-space character and differ by more than surrounding spaces.",
        json_schema_extra={"propertyNames": {"minLength": 1, "pattern": "\\S"}},
    )

    @field_validator("criteria")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        if any(not name.strip() for name in v):
            raise ValueError("option names must contain a non-space character")
        seen: dict[str, str] = {}
        for name in v:
            other = seen.setdefault(name.strip(), name)
            if other != name:
                raise ValueError(
                    f"options {other[:40]!r} and {name[:40]!r} differ only in surrounding spaces; "
                    "the model cannot tell them apart: remove one or rename it"
                )
        return v


class ScoreQuestion(_Strict):
    type: Literal["score"]
    instructions: Description | None = None
    criteria: list[Description] = Field(
        ...,
        min_length=MIN_SCORE_LEVELS,
        max_length=MAX_SCORE_LEVELS,
        description="level descriptions, lowest first (the map form {'0': ...} is not accepted); "
        "no level may be empty (an empty string, object or array)",
    )

    @field_validator("criteria")
    @classmethod
    def _levels(cls, v: list[Any]) -> list[Any]:
        empty = [i for i, level in enumerate(v) if _blank(level)]
        if empty:
            raise ValueError(f"score level {empty[0]} is empty; every level needs a description the model can read")
        return v


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown top-level fields are ignored (jevcompat SHOULD)

    model: str = Field("jev-latest", description="jev-latest, any jev-* alias, or the served model's name")
    state: Description = Field(
        ...,
        validation_alias=AliasChoices("state", "document"),
        description="what every question refers to: text, a JSON object or array, or chat turns "
        "([{role, content}] or {messages: [...]}). An array whose every item is exactly {role, content} is "
        "chat: each role must be system, user or assistant and each content non-null (else 422).",
    )
    questions: dict[str, Question] = Field(
        ...,
        min_length=1,
        description="caller id (any non-empty string, unique) -> question",
        json_schema_extra={"propertyNames": {"minLength": 1}},
    )
    assets: dict[str, Any] | None = Field(None, description="images (Jev 1.14); not served by text models")
    x_task: str | None = Field(
        None,
        pattern=TASK_ID_PATTERN,
        description="openjev: a task of this key (/v1/tasks) whose fit answers its question here, as the "
        "x-openjev-task header does (the two must agree)",
    )

    @field_validator("questions")
    @classmethod
    def _ids(cls, v: dict[str, Any]) -> dict[str, Any]:
        if any(qid == "" for qid in v):
            raise ValueError("question ids must be non-empty strings")
        return v

    @field_validator("state")
    @classmethod
    def _chat(cls, v: Any) -> Any:
        return _refuse_bad_chat(v)


class StateItem(BaseModel):
    """One item of a batch's states form: the state alone (its questions are the batch's,
    validated and converted once)."""

    state: Description

    @field_validator("state")
    @classmethod
    def _chat(cls, v: Any) -> Any:
        return _refuse_bad_chat(v)


# ---- responses (documented in OpenAPI; the route builds plain dicts of this shape)


class NoulAnswer(BaseModel):
    type: Literal["noul"]
    noul: float = Field(..., ge=0, le=1, description="P(true)")
    x_label_mass: float = Field(..., description="probability the model put on the answer labels at all")
    x_basis: Basis | None = Field(None, description="which fit answered and on what basis")


class ChoiceAnswer(BaseModel):
    type: Literal["choice"]
    choice: str
    probabilities: dict[str, float]
    confidence: float
    x_label_mass: float
    x_basis: Basis | None = Field(None, description="which fit answered and on what basis")


class ScoreAnswer(BaseModel):
    type: Literal["score"]
    score: float = Field(..., description="sum(i * p_i) over levels 0..n-1")
    confidence: float
    legend: dict[str, str]
    probabilities: dict[str, float]
    x_label_mass: float
    x_basis: Basis | None = Field(None, description="which fit answered and on what basis")


class Usage(BaseModel):
    input_tokens: int = Field(..., description="distinct tokens read: the state once plus each question's own part")
    output_tokens: int = Field(..., description="always 0: nothing is generated")
    x_prompt_tokens: int = Field(..., description="tokens of all branches as independent prefills would read them")
    x_computed_tokens: int | None = Field(None, description="tokens the engine actually computed (when known)")
    x_cached_tokens: int | None = Field(None, description="tokens served from the prefix cache (when known)")


class SystemOneResponse(BaseModel):
    model: str
    answers: dict[str, Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]]
    usage: Usage


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ErrorBody(BaseModel):
    detail: ErrorDetail


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="where: body, then keys and indexes (long parts truncated), or header")
    msg: str = Field(description="what is wrong and what to fix")
    type: str
    input: Any = Field(None, description="a bounded preview of the value refused (may be absent)")
    ctx: dict[str, Any] | None = None


class ValidationErrorBody(BaseModel):
    detail: list[ValidationIssue]


class UnprocessableBody(RootModel[ValidationErrorBody | ErrorBody]):
    """422: validation errors (detail[]) or a budget/feature refusal (detail{error_type, message})."""


class HealthBody(BaseModel):
    status: str = Field(description="ok, loading, failed, draining or engine_unavailable")
    model: str | None = None
    load_seconds: float | None = None
    in_flight: int | None = None
    error: str | None = Field(None, description="why loading failed, or why the engine server does not answer")


class CalibrationInfo(BaseModel):
    id: str
    readouts: list[str] = Field(description="readouts the calibration has fits for, e.g. letters;rotations=4")
    applies_to_default: bool = Field(description="whether it has a fit for the server's default readout")


class ModelInfo(BaseModel):
    name: str
    description: str
    release_date: str
    x_fingerprint: str = Field("", description="the weights' fingerprint calibration files are bound to")
    x_context_length: int | None = Field(
        None, description="the model's positions: a longer branch is refused (422/400) before any work; null: unknown"
    )
    x_prompt_version: str = Field("", description="the prompt wording's version calibration files are bound to")
    x_temperature: float = Field(1.0, description="the base softmax temperature (--temperature)")
    x_readout: str = Field("letters", description="the default readout (override: x-openjev-readout header)")
    x_readouts: dict[str, str] = Field(
        default_factory=dict,
        description="each readout a request may ask for (x-openjev-readout) and what this server reads for it "
        "(at the default rotations; parallel reads letters on an engine without parallel layouts)",
    )
    x_calibration: CalibrationInfo | None = Field(None, description="the calibration applied by default, if any")
    x_abstain: dict[str, float] = Field(
        default_factory=dict,
        description="the abstain rule in force (its floors: min_label_mass, min_order_agreement, min_confidence); "
        "the served model's calibration file may set it where the operator did not",
    )


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    data: list[dict[str, Any]] = Field(default_factory=list, description="the same models, OpenAI-style")
