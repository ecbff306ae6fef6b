"""Wire schemas of OpenAI's Decisions API (`POST /v1/decisions`), as the official `openai`
3.57 SDK types it (`openai/types/decision_create_params.py`, `openai/types/decision.py`).
Pydantic lives only here; api/contract/openai_convert.py maps these to the core's types.

Request objects refuse unknown fields (OpenAI answers an unknown parameter with a 400);
configurable limits (questions per request, token budgets) are checked after parsing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    StrictBool,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)

from openjev.config import MAX_CHOICE_OPTIONS, MIN_CHOICE_OPTIONS

MAX_QUESTIONS = 400  # the contract's own bound; the server's --max-questions applies too
MAX_SCORE_LEVELS = 255  # levels are labelled options like choices (the contract sets no bound)

JEV_FIELDS = ("state", "document")  # a Jev /v1/systemone body: refused with a pointer there


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheBreakpoint(_Strict):
    """Accepted and validated; the prefix cache finds shared prefixes on its own."""

    mode: Literal["explicit"]


class InputText(_Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputImage(_Strict):
    """Refused with a 400 while the served model reads text only (as Jev's image assets)."""

    type: Literal["input_image"]
    image_url: str
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputJSON(_Strict):
    """A JSON object or an array of objects, shown to the model as compact JSON."""

    type: Literal["input_json"]
    data: dict[str, Any] | list[dict[str, Any]]


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[InputText | InputImage | InputJSON, Field(discriminator="type")]
QuestionPart = Annotated[InputText | InputImage | InputJSON, Field(discriminator="type")]
AssistantPart = Annotated[OutputText | RefusalPart, Field(discriminator="type")]
ToolOutputPart = Annotated[InputText | InputImage, Field(discriminator="type")]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class UserMessage(_Strict):
    role: Literal["user"]
    content: str | list[UserPart]
    type: Literal["message"] = "message"


class DeveloperMessage(_Strict):
    role: Literal["developer"]
    content: str | list[InputText]
    type: Literal["message"] = "message"


class SystemMessage(_Strict):
    role: Literal["system"]
    content: str | list[InputText]
    type: Literal["message"] = "message"


class AssistantMessage(_Strict):
    role: Literal["assistant"]
    content: str | list[AssistantPart]
    phase: Literal["commentary", "final_answer"] | None = None
    type: Literal["message"] = "message"


class FunctionCall(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    namespace: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutput(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ToolOutputPart]
    id: str | None = None
    status: ItemStatus | None = None


class CustomToolCall(_Strict):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    namespace: str | None = None
    status: ItemStatus | None = None


class CustomToolCallOutput(_Strict):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[ToolOutputPart]
    id: str | None = None
    status: ItemStatus | None = None


ITEM_TAGS = (
    "user",
    "developer",
    "system",
    "assistant",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
)


def _item_tag(value: Any) -> str | None:
    """Messages are told apart by `role` (their `type` "message" is optional), the others by `type`."""
    get = value.get if isinstance(value, dict) else lambda k, d=None: getattr(value, k, d)
    kind = get("type", None)
    tag = get("role", None) if kind in (None, "message") else kind
    return tag if isinstance(tag, str) and tag in ITEM_TAGS else None


InputItem = Annotated[
    Annotated[UserMessage, Tag("user")]
    | Annotated[DeveloperMessage, Tag("developer")]
    | Annotated[SystemMessage, Tag("system")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[CustomToolCall, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutput, Tag("custom_tool_call_output")],
    Discriminator(
        _item_tag,
        custom_error_type="invalid_input_item",
        custom_error_message="an input item is a message (role user, developer, system or assistant) or has type "
        "function_call, function_call_output, custom_tool_call or custom_tool_call_output",
    ),
]

Instructions = str | list[QuestionPart]


class Choice(_Strict):
    value: StrictStr | StrictBool = Field(
        ..., description='typed: the string "true" and the boolean true are different choices'
    )
    description: str | None = None


class Level(_Strict):
    label: str
    description: str | None = None

    @field_validator("label")
    @classmethod
    def _readable(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a level's label must contain a non-space character (the model reads it)")
        return v


class QuestionPredicate(_Strict):
    """The answer is the probability that the statement in `instructions` is true."""

    type: Literal["predicate"]
    instructions: Instructions
    name: str | None = None


class QuestionChoice(_Strict):
    type: Literal["choice"]
    instructions: Instructions
    choices: list[Choice] = Field(..., min_length=MIN_CHOICE_OPTIONS, max_length=MAX_CHOICE_OPTIONS)
    name: str | None = None

    @model_validator(mode="after")
    def _unique(self) -> QuestionChoice:
        seen: set[tuple[type, str | bool]] = set()
        shown: dict[str, int] = {}  # what the model reads of each choice -> its position
        for i, choice in enumerate(self.choices):
            key = (type(choice.value), choice.value)
            if key in seen:
                raise ValueError(
                    f"choice {choice.value!r} appears more than once; each choice must be unique "
                    '(the string "true" and the boolean true are different choices)'
                )
            seen.add(key)
            text = shown_text(choice).strip()
            if not text:
                raise ValueError(f"choice {i} shows the model nothing (an empty or blank value and no description)")
            if text in shown:
                raise ValueError(
                    f"choices {shown[text]} and {i} read the same to the model ({text[:40]!r}); the pick would go "
                    "by their position: give them different descriptions, or remove one"
                )
            shown[text] = i
        return self


def shown_text(choice: Choice) -> str:
    """What the model reads of a choice: its description, else its value (`true` for the boolean)."""
    if choice.description is not None:
        return choice.description
    return ("true" if choice.value else "false") if isinstance(choice.value, bool) else choice.value


class QuestionScore(_Strict):
    type: Literal["score"]
    instructions: Instructions
    levels: list[Level] = Field(..., min_length=2, max_length=MAX_SCORE_LEVELS, description="lowest first")
    name: str | None = None


Question = Annotated[QuestionPredicate | QuestionChoice | QuestionScore, Field(discriminator="type")]


class PromptCacheOptions(_Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] = "30m"


EXAMPLE: dict[str, Any] = {
    "model": "jev-latest",
    "input": "Hi, I was charged twice for order #1234 and I want my money back today.",
    "questions": [
        {"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."},
        {
            "type": "choice",
            "name": "department",
            "instructions": "Which team should handle this?",
            "choices": [
                {"value": "billing", "description": "Payments, charges and refunds"},
                {"value": "technical", "description": "Bugs in the app"},
            ],
        },
        {
            "type": "score",
            "name": "urgency",
            "instructions": "How urgent is this?",
            "levels": [{"label": "Routine"}, {"label": "Urgent"}, {"label": "Emergency"}],
        },
    ],
}


class DecisionCreate(_Strict):
    """POST /v1/decisions. A body with Jev's `state` (or `document`) is refused with a 400
    that points to /v1/systemone, whatever else it holds."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [cast(JsonValue, EXAMPLE)]})

    model: str = Field(..., description="the served model's name, or a jev-* alias such as jev-latest")
    input: str | list[InputItem] = Field(
        ...,
        description="text, or ordered messages, function calls and outputs, custom tool calls and outputs "
        "(each output names an earlier call by call_id)",
    )
    questions: list[Question] = Field(
        ...,
        min_length=1,
        max_length=MAX_QUESTIONS,
        description="1 to 400 questions (and at most the server's --max-questions), answered in order",
    )
    prompt_cache_key: str | None = Field(
        None, description="partitions prefix-cache reuse within the caller's own cache namespace"
    )
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = Field(None, description="logged only as a hash")

    @model_validator(mode="before")
    @classmethod
    def _not_jev(cls, data: Any) -> Any:
        if isinstance(data, dict) and (any(k in data for k in JEV_FIELDS) or isinstance(data.get("questions"), dict)):
            raise ValueError(
                "this is a Jev SystemOne body (`state`, or `questions` as an object): send it to "
                "POST /v1/systemone; /v1/decisions speaks OpenAI's Decisions format "
                "(`input` and a `questions` array)"
            )
        return data


# ---- responses (documented in OpenAPI; the route builds plain dicts of this shape)


class ChoiceProbability(BaseModel):
    value: StrictStr | StrictBool
    probability: float


class LevelProbability(BaseModel):
    label: str
    probability: float
    value: int = Field(..., description="the level's index, lowest 0")


class AnswerPredicate(BaseModel):
    type: Literal["predicate"]
    name: str | None
    probability: float = Field(..., ge=0, le=1)


class AnswerChoice(BaseModel):
    type: Literal["choice"]
    name: str | None
    choice: StrictStr | StrictBool
    confidence: float
    probabilities: list[ChoiceProbability] = Field(..., description="in the order the choices were given")


class AnswerScore(BaseModel):
    type: Literal["score"]
    name: str | None
    score: float = Field(..., description="sum(i * p_i) over levels 0..n-1")
    confidence: float
    probabilities: list[LevelProbability]


class AnswerRefusal(BaseModel):
    """The abstain rule declined this question (see /v1/limits `abstain`); others are answered."""

    type: Literal["refusal"]
    name: str | None


class DecisionInputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int


class DecisionOutputTokensDetails(BaseModel):
    reasoning_tokens: int


class DecisionUsage(BaseModel):
    input_tokens: int = Field(..., description="distinct tokens read: the input once plus each question's own part")
    input_tokens_details: DecisionInputTokensDetails
    output_tokens: int = Field(..., description="always 0: nothing is generated")
    output_tokens_details: DecisionOutputTokensDetails
    total_tokens: int


class Decision(BaseModel):
    model: str
    answers: list[Annotated[AnswerPredicate | AnswerChoice | AnswerScore | AnswerRefusal, Field(discriminator="type")]]
    usage: DecisionUsage


class DecisionError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class DecisionErrorBody(BaseModel):
    error: DecisionError
