"""Shared bench helpers: the machine, ~1,000-token states and question sets, as wire
payloads (so every system under test gets the very same requests)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys

from openjev.api.contract.jev import convert, schemas
from openjev.config import EMBEDDED_MODEL
from openjev.core.types import DecisionRequest

TICKET = (
    "Order #{n}: I ordered a blue rain jacket, size M, three weeks ago and paid with my credit card. "
    "The tracking page has said 'label created' since then and the courier has no record of the parcel. "
    "Yesterday I noticed my card was charged a second time for the same order. I have written to support "
    "twice without an answer. I need the duplicate charge refunded and the jacket shipped or the order cancelled. "
)


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        model = subprocess.run(
            ["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True, text=True
        ).stdout.strip()
        cpu = model or cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def state_text(tag: int, paragraphs: int = 11) -> str:
    """About 1,000 tokens with the embedded tokenizer at 11 paragraphs; `tag` makes states distinct."""
    return " ".join(TICKET.format(n=tag * 100 + i) for i in range(paragraphs))


def questions(n: int, tag: int = 0) -> dict:
    kinds = [
        lambda i: {"type": "noul", "instructions": f"Does the customer ask for a refund (check {i})?"},
        lambda i: {
            "type": "choice",
            "instructions": f"Which team should handle this (routing {i})?",
            "criteria": {
                "billing": "Payments, charges and refunds",
                "shipping": "Delivery and tracking",
                "returns": "Returns and exchanges",
                "other": None,
            },
        },
        lambda i: {
            "type": "score",
            "instructions": f"How frustrated is the customer (scale {i})?",
            "criteria": ["Calm", "Annoyed", "Angry", "Furious"],
        },
    ]
    return {f"q{i}": kinds[i % 3](i + 100 * tag) for i in range(n)}


def payload(n_questions: int, tag: int, qtag: int | None = None, paragraphs: int = 11) -> dict:
    """A wire request. Same `tag`, other `qtag`: the same state with new questions (a warm request)."""
    return {
        "model": "jev-latest",
        "state": state_text(tag, paragraphs),
        "questions": questions(n_questions, tag if qtag is None else qtag),
    }


def core_request(wire: dict) -> DecisionRequest:
    return convert.request_of(schemas.SystemOneRequest.model_validate(wire))


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def group_cpu_s(*pgids: int) -> float:
    """CPU seconds (user + system) used so far by the live processes of these process groups
    (Linux /proc; a server started in a session of its own is one group, its workers
    included). Read before and after a section, the difference is what serving it cost."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) in pgids:  # pgrp; after it, utime and stime are fields 11 and 12
            total += int(fields[11]) + int(fields[12])
    return total / tick


def embedded_serve(port: int, *args: str) -> list[str]:
    """`openjev serve` on the embedded test model at `port` (then `args`): what a bench starts."""
    serve = [sys.executable, "-m", "openjev", "serve", "--engine", "transformers", "--model", EMBEDDED_MODEL]
    return [*serve, "--port", str(port), *args]
