"""What a decision reads in OpenAI's Decisions API (`POST /v1/decisions`): the input items
(messages, function and custom tool calls and their outputs) and their content parts, as
the official `openai` 3.57 SDK types them (`openai/types/decision_create_params.py`).
Unknown fields are refused (OpenAI answers an unknown parameter with a 400)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheBreakpoint(Strict):
    """Accepted and validated; the prefix cache finds shared prefixes on its own."""

    mode: Literal["explicit"]


class InputText(Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputImage(Strict):
    """Refused with a 400 while the served model reads text only (as Jev's image assets)."""

    type: Literal["input_image"]
    image_url: str
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputJSON(Strict):
    """A JSON object or an array of objects, shown to the model as compact JSON."""

    type: Literal["input_json"]
    data: dict[str, Any] | list[dict[str, Any]]


class OutputText(Strict):
    type: Literal["output_text"]
    text: str


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


UserPart = Annotated[InputText | InputImage | InputJSON, Field(discriminator="type")]
QuestionPart = Annotated[InputText | InputImage | InputJSON, Field(discriminator="type")]
AssistantPart = Annotated[OutputText | RefusalPart, Field(discriminator="type")]
ToolOutputPart = Annotated[InputText | InputImage, Field(discriminator="type")]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class UserMessage(Strict):
    role: Literal["user"]
    content: str | list[UserPart]
    type: Literal["message"] = "message"


class DeveloperMessage(Strict):
    role: Literal["developer"]
    content: str | list[InputText]
    type: Literal["message"] = "message"


class SystemMessage(Strict):
    role: Literal["system"]
    content: str | list[InputText]
    type: Literal["message"] = "message"


class AssistantMessage(Strict):
    role: Literal["assistant"]
    content: str | list[AssistantPart]
    phase: Literal["commentary", "final_answer"] | None = None
    type: Literal["message"] = "message"


class FunctionCall(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    namespace: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutput(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ToolOutputPart]
    id: str | None = None
    status: ItemStatus | None = None


class CustomToolCall(Strict):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    namespace: str | None = None
    status: ItemStatus | None = None


class CustomToolCallOutput(Strict):
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
