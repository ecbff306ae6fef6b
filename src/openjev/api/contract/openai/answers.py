"""The answer of OpenAI's Decisions API (`openai/types/decision.py` of the official `openai`
3.57 SDK), documented in OpenAPI; the route builds plain dicts of this shape
(api/contract/openai/convert.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictStr


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
