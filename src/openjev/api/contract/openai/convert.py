"""OpenAI's Decisions wire <-> the core's types: the request is converted once into a
`DecisionRequest` and answered by the same DecisionService as /v1/systemone.

What the model reads:
- `input` text is one user turn; messages keep their role (developer becomes a system turn,
  the role chat templates know); parts are joined by blank lines, `input_json` shown as
  compact JSON, an assistant's refusal part as its text.
- tool calls and their outputs become readable turns: a call is an assistant turn
  `[tool call ...]`, its output a user turn `[tool output ...]` naming the call's tool
  (each output must name an earlier call by `call_id`).
- a predicate is a yes/no question whose instructions are the statement; a choice's
  options show each choice's description, or its value where it has none (`true` for the
  boolean); a score's levels show `label: description`, or the label alone.

Choice values are typed: each choice gets an internal option name by its position (`#0`,
`#1`, ...) and answers map back by position, so the string "true" and the boolean true stay
two choices and come back with their JSON type.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from fastapi.exceptions import RequestValidationError

from openjev.api.contract.common import text_of
from openjev.api.contract.openai import items as oi
from openjev.api.contract.openai import schemas as oa
from openjev.core import scoring
from openjev.core import types as core

Loc = tuple[str | int, ...]


def invalid(loc: Loc, msg: str, kind: str = "value_error") -> RequestValidationError:
    """A 400 on this format (api/contract/openai/format.py), `param` naming `loc`."""
    return RequestValidationError([{"loc": ("body", *loc), "msg": msg, "type": kind}])


def _no_image(loc: Loc) -> RequestValidationError:
    return invalid(
        loc,
        "input_image is not supported: the served model reads text only; send the content as input_text",
        "unsupported",
    )


def _parts_text(parts: str | list[Any], loc: Loc) -> str:
    """Text, input_text, input_json, output_text and refusal parts as one text."""
    if isinstance(parts, str):
        return parts
    texts = []
    for i, part in enumerate(parts):
        if isinstance(part, oi.InputImage):
            raise _no_image((*loc, i))
        if isinstance(part, oi.InputJSON):
            texts.append(text_of(part.data))
        elif isinstance(part, oi.RefusalPart):
            texts.append(part.refusal)
        else:
            texts.append(part.text)
    return "\n\n".join(texts)


def _tool(namespace: str | None, name: str) -> str:
    return f"{namespace}.{name}" if namespace else name


def state_of(value: str | list[Any]) -> core.State:
    """The chat turns the model reads before each question."""
    if isinstance(value, str):
        return core.State(turns=(core.Turn("user", value),))
    if not value:
        raise invalid(("input",), "input needs at least one item (or send a string)", "too_short")
    turns: list[core.Turn] = []
    calls: dict[str, str] = {}  # call_id -> the tool it called, for its output's turn
    for i, item in enumerate(value):
        loc: Loc = ("input", i)
        if isinstance(item, oi.FunctionCall | oi.CustomToolCall):
            tool = _tool(item.namespace, item.name)
            calls[item.call_id] = tool
            given = f"arguments: {item.arguments}" if isinstance(item, oi.FunctionCall) else f"input: {item.input}"
            turns.append(core.Turn("assistant", f"[tool call {item.call_id}: {tool}, {given}]"))
        elif isinstance(item, oi.FunctionCallOutput | oi.CustomToolCallOutput):
            tool_name = calls.get(item.call_id)
            if tool_name is None:
                raise invalid(
                    (*loc, "call_id"),
                    f"{item.type} names call_id {item.call_id[:80]!r}, which no earlier function_call or "
                    "custom_tool_call in input has; each output follows its call",
                )
            output = _parts_text(item.output, (*loc, "output"))
            turns.append(core.Turn("user", f"[tool output {item.call_id} from {tool_name}]\n{output}"))
        else:
            role = "system" if item.role == "developer" else item.role
            turns.append(core.Turn(role, _parts_text(item.content, (*loc, "content"))))
    return core.State(turns=tuple(turns))


def _instructions(value: oi.Instructions, loc: Loc) -> str:
    return _parts_text(value, (*loc, "instructions"))


def question_of(q: oa.QuestionPredicate | oa.QuestionChoice | oa.QuestionScore, loc: Loc) -> core.Question:
    instructions = _instructions(q.instructions, loc)
    if isinstance(q, oa.QuestionPredicate):
        return core.NoulQuestion(instructions=instructions)
    if isinstance(q, oa.QuestionChoice):
        options = tuple(core.Option(f"#{i}", oa.shown_text(c)) for i, c in enumerate(q.choices))
        return core.ChoiceQuestion(instructions=instructions, options=options)
    levels = tuple(lv.label if lv.description is None else f"{lv.label}: {lv.description}" for lv in q.levels)
    return core.ScoreQuestion(instructions=instructions, levels=levels)


def request_of(body: oa.DecisionCreate, max_questions: int) -> core.DecisionRequest:
    """The core request; question ids are `questions[i]` (what the core's messages quote,
    e.g. a token budget exceeded, so that they name the caller's own field)."""
    if len(body.questions) > max_questions:
        raise invalid(
            ("questions",),
            f"this server answers at most {max_questions} questions per request (--max-questions), "
            f"got {len(body.questions)}",
            "too_long",
        )
    questions = tuple((f"questions[{i}]", question_of(q, ("questions", i))) for i, q in enumerate(body.questions))
    return core.DecisionRequest(state=state_of(body.input), questions=questions)


def cache_partition(key: str | None) -> str:
    """The partition a `prompt_cache_key` selects inside the caller's namespace ("" for none)."""
    if key is None:
        return ""
    return hashlib.sha256(b"openjev prompt_cache_key\0" + key.encode("utf-8", "surrogatepass")).hexdigest()


# The key of `pseudonym`: this process's own, never written anywhere, so a log line's
# pseudonym cannot be reversed by hashing guesses (e-mails, user ids) as a plain digest can.
_PSEUDONYM_KEY = secrets.token_bytes(32)


def pseudonym(value: str) -> str:
    """What a log keeps of an end-user identifier (`safety_identifier`): 16 hex digits of
    its HMAC-SHA256 under this process's secret key. Equal values match within one run of
    the server (to follow one user's requests); no dictionary reverses them."""
    return hmac.new(_PSEUDONYM_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]


# ---- answers


def answer_to_wire(
    question: oa.QuestionPredicate | oa.QuestionChoice | oa.QuestionScore, answer: core.Answer
) -> dict[str, Any]:
    name = question.name
    if answer.abstain:
        return {"type": "refusal", "name": name}
    if isinstance(answer, core.NoulAnswer):
        return {"type": "predicate", "name": name, "probability": answer.p_true}
    if isinstance(answer, core.ChoiceAnswer) and isinstance(question, oa.QuestionChoice):
        probs = [p for _, p in answer.probabilities]
        return {
            "type": "choice",
            "name": name,
            "choice": question.choices[scoring.argmax(probs)].value,  # the core's pick, by position
            "confidence": answer.confidence,
            "probabilities": [
                {"value": c.value, "probability": p} for c, p in zip(question.choices, probs, strict=True)
            ],
        }
    if isinstance(answer, core.ScoreAnswer) and isinstance(question, oa.QuestionScore):
        return {
            "type": "score",
            "name": name,
            "score": answer.score,
            "confidence": answer.confidence,
            "probabilities": [
                {"label": lv.label, "probability": p, "value": i}
                for i, (lv, p) in enumerate(zip(question.levels, answer.probabilities, strict=True))
            ],
        }
    raise TypeError(f"a {type(answer).__name__} cannot answer a {question.type} question")


def usage_to_wire(result: core.DecisionResult) -> dict[str, Any]:
    """`cached_tokens`: read from the prefix cache; `cache_write_tokens`: the shared prefix's
    tokens this request computed, which the prefix cache keeps for the next request with the
    same input (0 when the engine cannot tell)."""
    usage = result.usage
    cached = int(usage.cached_tokens or 0)
    written = max(0, result.prefix_tokens - cached) if usage.computed_tokens else 0
    return {
        "input_tokens": int(usage.input_tokens),
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": int(usage.output_tokens),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(usage.input_tokens + usage.output_tokens),
    }


def result_to_wire(body: oa.DecisionCreate, result: core.DecisionResult, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "answers": [answer_to_wire(q, a) for q, (_, a) in zip(body.questions, result.answers, strict=True)],
        "usage": usage_to_wire(result),
    }
