"""`openjev ask`: one decision request from a terminal, printed as a table with bars.

    openjev ask --state "I was charged twice" --noul "Is it urgent?" \\
        --choice "Which team?" billing technical --score "How angry?" calm annoyed furious

Questions keep the order of their flags; ids are q1, q2, ... unless given as `id=text`.
`--json` prints the server's response body as it came (for scripts). Exit status: 0 answered,
1 the server refused or failed (its message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

BAR_WIDTH = 24
KEY_ENV = "OPENJEV_API_KEY"
URL_ENV = "OPENJEV_URL"


class _Question(argparse.Action):
    """Appends (type, words) to one shared list, so questions keep the order of the flags."""

    def __call__(self, parser, namespace, values, option_string=None):
        kind = option_string.lstrip("-")
        values = list(values) if isinstance(values, list) else [values]
        minimum = {"noul": 1, "choice": 3, "score": 3}[kind]
        if len(values) < minimum:
            parser.error(
                f"{option_string} needs the question text" + ("" if kind == "noul" else " and at least two options")
            )
        namespace.questions = [*(namespace.questions or []), (kind, values)]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ask",
        help="ask a running server one decision request and print the answers",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, "http://127.0.0.1:8000"),
        help=f"server root [env {URL_ENV}; default http://127.0.0.1:8000]",
    )
    p.add_argument("--key", default=os.environ.get(KEY_ENV), help=f"API key [env {KEY_ENV}]")
    p.add_argument("--model", default="jev-latest", help="model to ask (default jev-latest)")
    p.add_argument("--state", required=True, help="what the questions are about; '-' reads stdin, @FILE reads a file")
    p.add_argument(
        "--noul", action=_Question, nargs=1, metavar="TEXT", dest="questions", help="a yes/no question (repeatable)"
    )
    p.add_argument(
        "--choice",
        action=_Question,
        nargs="+",
        metavar=("TEXT", "OPTION"),
        dest="questions",
        help="a question and its options, OPTION or OPTION=description (repeatable)",
    )
    p.add_argument(
        "--score",
        action=_Question,
        nargs="+",
        metavar=("TEXT", "LEVEL"),
        dest="questions",
        help="a question and its levels, lowest first (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print the response body as JSON")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the answer (default 120)")


def _state(value: str) -> str:
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        with open(value[1:], encoding="utf-8") as f:
            return f.read()
    return value


def _split_id(text: str, n: int) -> tuple[str, str]:
    head, sep, rest = text.partition("=")
    if sep and head and " " not in head and rest:
        return head, rest
    return f"q{n}", text


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    questions: dict[str, Any] = {}
    for n, (kind, words) in enumerate(args.questions or [], start=1):
        qid, text = _split_id(words[0], n)
        if qid in questions:
            raise ValueError(f"question id {qid!r} is used twice")
        q: dict[str, Any] = {"type": kind, "instructions": text}
        if kind == "choice":
            q["criteria"] = {}
            for option in words[1:]:
                name, sep, description = option.partition("=")
                q["criteria"][name] = description if sep else None
        elif kind == "score":
            q["criteria"] = words[1:]
        questions[qid] = q
    if not questions:
        raise ValueError("ask at least one question: --noul, --choice or --score")
    return {"model": args.model, "state": _state(args.state), "questions": questions}


def bar(p: float, width: int = BAR_WIDTH) -> str:
    """A bar of `width` cells, in eighths of a cell."""
    eighths = max(0, min(width * 8, round(p * width * 8)))
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width, "·")


def render(request: dict[str, Any], response: dict[str, Any], timing: str | None) -> str:
    out = []
    for qid, answer in response["answers"].items():
        text = request["questions"].get(qid, {}).get("instructions", qid)
        mass = f"label mass {answer['x_label_mass']:.2f}"
        if answer["type"] == "noul":
            p = answer["noul"]
            head = f"{'yes' if p >= 0.5 else 'no'}  (P(yes) {p:.3f}, {mass})"
            options = [("yes", p, p >= 0.5), ("no", 1 - p, p < 0.5)]
        elif answer["type"] == "choice":
            head = f"{answer['choice']}  (confidence {answer['confidence']:.2f}, {mass})"
            options = [(name, p, name == answer["choice"]) for name, p in answer["probabilities"].items()]
        else:
            probs = answer["probabilities"]
            best = max(probs, key=probs.get)
            head = f"{answer['score']:.2f} of 0..{len(probs) - 1}  (confidence {answer['confidence']:.2f}, {mass})"
            options = [(f"{i} {answer['legend'][i]}", p, i == best) for i, p in probs.items()]
        out.append(f"{qid}: {text}  ->  {head}")
        width = max(len(name) for name, _, _ in options)
        for name, p, chosen in options:
            out.append(f"  {'>' if chosen else ' '} {name.ljust(width)}  {bar(p)}  {p:6.1%}")
        out.append("")
    usage = response.get("usage", {})
    out.append(f"{response.get('model')}: " + ", ".join(f"{k} {v}" for k, v in usage.items()))
    if timing:
        out.append("server timing: " + timing)
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        body = build_request(args)
    except (ValueError, OSError) as e:
        print(f"openjev ask: {e}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    try:
        r = httpx.post(args.url.rstrip("/") + "/v1/systemone", json=body, headers=headers, timeout=args.timeout)
    except httpx.HTTPError as e:
        print(f"openjev ask: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        print(f"openjev ask: {r.status_code} {_error_message(r)}", file=sys.stderr)
        return 1
    data = r.json()
    if args.json:
        json.dump(data, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(body, data, r.headers.get("server-timing")))
    return 0


def _error_message(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return r.text[:500]
    if isinstance(detail, dict):
        return f"{detail.get('error_type')}: {detail.get('message')}"
    if isinstance(detail, list):  # validation: where, then what
        return "; ".join(f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    return r.text[:500]
