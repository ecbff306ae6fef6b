"""Shared bench helpers: the machine, a ~1,000-token state and question sets."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess

from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion, Option, ScoreQuestion, State, Turn

TICKET = (
    "Order #{n}: I ordered a blue rain jacket, size M, three weeks ago and paid with my credit card. "
    "The tracking page has said 'label created' since then and the courier has no record of the parcel. "
    "Yesterday I noticed my card was charged a second time for the same order. I have written to support "
    "twice without an answer. I need the duplicate charge refunded and the jacket shipped or the order cancelled. "
)


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        model = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"],
                               capture_output=True, text=True).stdout.strip()
        cpu = model or cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def state(tag: int, paragraphs: int = 11) -> State:
    """About 1,000 tokens with the embedded tokenizer; `tag` makes states distinct."""
    return State((Turn("user", " ".join(TICKET.format(n=tag * 100 + i) for i in range(paragraphs))),))


def questions(n: int, tag: int = 0) -> tuple:
    kinds = [
        lambda i: NoulQuestion(f"Does the customer ask for a refund (check {i})?"),
        lambda i: ChoiceQuestion(f"Which team should handle this (routing {i})?", (
            Option("billing", "Payments, charges and refunds"), Option("shipping", "Delivery and tracking"),
            Option("returns", "Returns and exchanges"), Option("other", None))),
        lambda i: ScoreQuestion(f"How frustrated is the customer (scale {i})?", ("Calm", "Annoyed", "Angry", "Furious")),
    ]
    return tuple((f"q{i}", kinds[i % 3](i + 100 * tag)) for i in range(n))


def request(n_questions: int, tag: int) -> DecisionRequest:
    return DecisionRequest(state(tag), questions(n_questions, tag))


def p50(xs: list[float]) -> float:
    return statistics.median(xs)
