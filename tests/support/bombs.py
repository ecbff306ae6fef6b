"""The cost bombs of issue 16 (findings 1, 3 and 5), as wire bodies built here so that the
tests and bench/bench_costs.py send the very same requests. Each is under the 2 MiB body
limit and valid by the schema; on the old main each made the server spend seconds of CPU
(and, for the compile bombs, gigabytes) before its 422, the batch and chat ones on the
event loop."""

from __future__ import annotations

import json
from typing import Any


def _options(n: int, tag: str = "") -> dict[str, None]:
    return {f"o{tag}{i}": None for i in range(n)}


def yesno_compile_bomb(state_tokens: int = 97_500) -> dict[str, Any]:
    """Finding 1, first body: 4 choice questions of 255 options under the yesno readout
    (1,020 branches) over a state of about `state_tokens` tokens (digits: one token each
    with the embedded tokenizer). Send with `x-openjev-readout: yesno`."""
    return {
        "model": "jev-latest",
        "state": "7" * state_tokens,
        "questions": {
            f"q{k}": {"type": "choice", "instructions": "Which?", "criteria": _options(255)} for k in range(4)
        },
    }


def letters_compile_bomb(state_chars: int = 400_000) -> dict[str, Any]:
    """Finding 1, second body: no header needed; 64 four-option questions over a 400 KB
    digit state."""
    return {
        "model": "jev-latest",
        "state": "1234567890" * (state_chars // 10),
        "questions": {
            f"q{k}": {"type": "choice", "instructions": f"Which {k}?", "criteria": _options(4)} for k in range(64)
        },
    }


def batch_states_bomb(states: int = 128) -> dict[str, Any]:
    """Finding 3: the batch states form, 64 questions of 255 options over 128 tiny states."""
    return {
        "model": "jev-latest",
        "questions": {
            f"q{k}": {"type": "choice", "instructions": f"Pick {k}.", "criteria": _options(255)} for k in range(64)
        },
        "states": [f"s{i}" for i in range(states)],
    }


def empty_turns_bomb(turns: int = 66_000) -> dict[str, Any]:
    """Finding 5: a chat state of 66,000 empty turns (about 2 MB)."""
    return {
        "model": "jev-latest",
        "state": [{"role": "user", "content": ""}] * turns,
        "questions": {"q": {"type": "noul", "instructions": "Is it empty?"}},
    }


def encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


SMALL = {
    "model": "jev-latest",
    "state": "My card was charged twice.",
    "questions": {"refund": {"type": "noul", "instructions": "Does the customer want a refund?"}},
}
