"""Wire schemas of OpenAI's Decisions API (`POST /v1/decisions`), as the official `openai`
3.57 SDK types it (`openai/types/decision_create_params.py`).
The request's questions and body are here, the conversation it reads in items.py, the
answer's shape in answers.py; api/contract/openai/convert.py maps them to the core's types.

Request objects refuse unknown fields (OpenAI answers an unknown parameter with a 400);
configurable limits (questions per request, token budgets) are checked after parsing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import (
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)

from openjev.api.contract.openai.items import InputItem, Instructions, Strict
from openjev.config import MAX_CHOICE_OPTIONS, MIN_CHOICE_OPTIONS
from openjev.core.distinct import first_repeat, reading

MAX_QUESTIONS = 400  # the contract's own bound; the server's --max-questions applies too
MAX_SCORE_LEVELS = 255  # levels are labelled options like choices (the contract sets no bound)

JEV_FIELDS = ("state", "document")  # a Jev /v1/systemone body: refused with a pointer there


class Choice(Strict):
    value: StrictStr | StrictBool = Field(
        ..., description='typed: the string "true" and the boolean true are different choices'
    )
    description: str | None = None


class Level(Strict):
    label: str
    description: str | None = None

    @field_validator("label")
    @classmethod
    def _readable(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a level's label must contain a non-space character (the model reads it)")
        return v


class QuestionPredicate(Strict):
    """The answer is the probability that the statement in `instructions` is true."""

    type: Literal["predicate"]
    instructions: Instructions
    name: str | None = None


class QuestionChoice(Strict):
    type: Literal["choice"]
    instructions: Instructions
    choices: list[Choice] = Field(..., min_length=MIN_CHOICE_OPTIONS, max_length=MAX_CHOICE_OPTIONS)
    name: str | None = None

    @model_validator(mode="after")
    def _unique(self) -> QuestionChoice:
        seen: set[tuple[type, str | bool]] = set()
        shown: dict[str, int] = {}  # what the model reads of each choice -> its position
        for i, choice in enumerate(self.choices):
            # compared as the core's one rule reads them (core/distinct.py): Unicode forms and
            # invisible characters aside
            key = (type(choice.value), reading(choice.value) if isinstance(choice.value, str) else choice.value)
            if key in seen:
                raise ValueError(
                    f"choice {choice.value!r} appears more than once (invisible characters and Unicode forms "
                    'aside); each choice must be unique (the string "true" and the boolean true are different choices)'
                )
            seen.add(key)
            text = reading(shown_text(choice))
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


class QuestionScore(Strict):
    type: Literal["score"]
    instructions: Instructions
    levels: list[Level] = Field(..., min_length=2, max_length=MAX_SCORE_LEVELS, description="lowest first")
    name: str | None = None


Question = Annotated[QuestionPredicate | QuestionChoice | QuestionScore, Field(discriminator="type")]


class PromptCacheOptions(Strict):
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


class DecisionCreate(Strict):
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

    @model_validator(mode="after")
    def _names_unique(self) -> DecisionCreate:
        names = [q.name for q in self.questions if q.name is not None]
        twice = first_repeat(names)
        if twice is not None:
            raise ValueError(
                f"questions named {names[twice[0]]!r} and {names[twice[1]]!r}: the same name twice (invisible "
                "characters and Unicode forms aside); an answer is found by its name, so each needs its own"
            )
        return self
