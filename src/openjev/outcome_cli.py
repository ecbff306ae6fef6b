"""`openjev outcome`: a client of a running server's /v1/outcomes, like `openjev task`.

    openjev outcome post --decision req_... --question refund --answer true
    openjev outcome post --file outcomes.jsonl

`--answer` is read as JSON where it is JSON (true, false, a level's index), else as an
option's name; `--question` as an index where it is digits, else as a name. The file is JSON
Lines, one `{"decision_id", "question", "answer"}` per line, sent in calls of at most 1000.
Output is the server's JSON. Exit status: 0 accepted, 1 the server refused (its message on
stderr; a refused call keeps nothing of itself), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from openjev.ask import KEY_ENV, URL_ENV, _error_message

PER_CALL = 1000  # the server's bound on one call


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("outcome", help="post the true answers of past decisions (/v1/outcomes) to a running server")
    p.add_argument("action", choices=("post",))
    p.add_argument(
        "--url", default=os.environ.get(URL_ENV, "http://127.0.0.1:8000"), help=f"server root [env {URL_ENV}]"
    )
    p.add_argument("--key", default=os.environ.get(KEY_ENV), help=f"API key [env {KEY_ENV}]")
    p.add_argument("--decision", help="the decision's id (its response's request id)")
    p.add_argument("--question", help="the question's name, or its index")
    p.add_argument("--answer", help="true/false, the option's name, or the level's index")
    p.add_argument("--file", help="JSON Lines of {decision_id, question, answer}")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per HTTP call (default 60)")


def _answer(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, bool | int) else text


def _outcomes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The outcomes to post; ValueError for a missing or doubled argument."""
    one = (args.decision, args.question, args.answer)
    if args.file:
        if any(v is not None for v in one):
            raise ValueError("outcome post takes --file or --decision/--question/--answer, not both")
        return [json.loads(line) for line in Path(args.file).read_text().splitlines() if line.strip()]
    if any(v is None for v in one):
        raise ValueError("outcome post needs --decision, --question and --answer (or --file)")
    question: str | int = int(args.question) if args.question.isdigit() else args.question
    return [{"decision_id": args.decision, "question": question, "answer": _answer(args.answer)}]


def run(args: argparse.Namespace) -> int:
    try:
        outcomes = _outcomes(args)
    except (ValueError, OSError) as e:
        print(f"openjev outcome: {e}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    root = args.url.rstrip("/")
    accepted: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=root, headers=headers, timeout=args.timeout) as client:
            for start in range(0, len(outcomes), PER_CALL):
                r = client.post("/v1/outcomes", json={"outcomes": outcomes[start : start + PER_CALL]})
                if r.status_code >= 400:
                    print(f"openjev outcome: {r.status_code} {_error_message(r)}", file=sys.stderr)
                    print(f"openjev outcome: {len(accepted)} accepted before this call", file=sys.stderr)
                    return 1
                accepted += r.json()["outcomes"]
    except httpx.HTTPError as e:
        print(f"openjev outcome: cannot reach {root}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"accepted": len(accepted), "outcomes": accepted}, indent=2))
    return 0
