"""The example outputs on the README, the quickstart and the two API pages, made by one
run of the default model (what `make serve` and `openjev serve` with no flags serve) and checked
against a fresh run, so that no page shows a stale recording.

    python scripts/doc_examples.py --write   # rewrite every block from a fresh run
    python scripts/doc_examples.py --check   # exit 1 where a page's block differs from a fresh run
                                             # (`make docs-examples`)

A block is the text between `<!-- doc-example NAME -->` and `<!-- /doc-example -->` on a page
(after a blank line, so that Markdown starts its code block):
the command (a curl call, or `openjev ask`) and what it printed. One server is started with no
flags but its port and a task store of its own (the default model; nothing taken from OPENJEV_*
variables) on a free loopback port, and
the examples run against it in the order below: the first is the first request after the
server started, and each later one finds what the earlier ones left in the prefix cache.

What --check holds a page to, and what it lets move: the status line, the header names, and
each header's value except request ids and the Server-Timing durations; the body's keys, its
strings (model name, answer types, chosen options, labels) and integers (token counts) exactly,
and its floats (probabilities, scores) within 0.05, since the llama.cpp build and the CPU's
vector instructions change the last digits. For `openjev ask`, its text with every number and
bar taken out. A block that differs is printed with the fresh one; rerun --write to take it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
STATE = "Hi, I was charged twice for order #1234 and I want my money back today."
JEV = {
    "model": "jev-latest",
    "state": STATE,
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "department": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "Payments, charges and refunds", "technical": "Bugs in the app"},
        },
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["Routine", "Urgent", "Emergency"],
        },
    },
}
OPENAI = {
    "model": "jev-latest",
    "input": STATE,
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
ABSTAIN = {
    "model": "jev-latest",
    "input": "My parcel never arrived and the app crashes when I try to track it.",
    "questions": [
        {
            "type": "choice",
            "name": "team",
            "instructions": "Which team should handle this?",
            "choices": [{"value": "billing"}, {"value": "technical"}, {"value": "shipping"}, {"value": "account"}],
        },
        {
            "type": "choice",
            "name": "happy",
            "instructions": "Is the customer happy?",
            "choices": [{"value": True}, {"value": False}, {"value": "unclear"}],
        },
    ],
}
ASK = [
    "--state",
    STATE,
    "--noul",
    "refund=Does the customer ask for a refund?",
    "--choice",
    "department=Which team should handle this?",
    "billing=Payments, charges and refunds",
    "technical=Bugs in the app",
    "--score",
    "urgency=How urgent is this?",
    "Routine",
    "Urgent",
    "Emergency",
]
SHOWN = (
    "x-openjev-prefix-tokens",
    "x-openjev-readout",
    "x-openjev-calibration",
    "x-openjev-cached-tokens",
    "x-openjev-computed-tokens",
    "server-timing",
    "x-request-id",
    "x-typesafe-request-id",
)
FLOAT_TOLERANCE = 0.05


@dataclass(frozen=True)
class Example:
    name: str
    path: str  # a route, or "ask" for `openjev ask`
    body: Any


# In the order they run: the first request after the server started comes first.
EXAMPLES = (
    Example("jev", "/v1/systemone", JEV),
    Example("openai", "/v1/decisions", OPENAI),
    Example("abstain", "/v1/decisions", ABSTAIN),
    Example("ask", "ask", ASK),
)
PAGES = ("README.md", "docs/quickstart.md", "docs/api-jev.md", "docs/api-openai-decisions.md")
BLOCK = re.compile(r"(<!-- doc-example (\w+) -->\n)(.*?)(<!-- /doc-example -->)", re.S)


def curl(path: str, body: Any) -> str:
    """The curl command as the pages print it: the body indented, one question a line."""
    inner = (
        ",\n".join(f"    {json.dumps(q)}" for q in body["questions"]) if isinstance(body["questions"], list) else None
    )
    if inner is None:
        inner = ",\n".join(f"    {json.dumps(k)}: {json.dumps(q)}" for k, q in body["questions"].items())
        questions = '  "questions": {\n' + inner + "\n  }"
    else:
        questions = '  "questions": [\n' + inner + "\n  ]"
    text = "state" if "state" in body else "input"
    lines = [f'  "model": {json.dumps(body["model"])},', f'  "{text}": {json.dumps(body[text])},', questions]
    head = f"curl -s -i http://127.0.0.1:8000{path} -H 'content-type: application/json' -d '{{\n"
    return head + "\n".join(lines).replace("'", "'\\''") + "\n}'"


def rendered(data: Any) -> str:
    """A body as the pages print it: compact JSON, each answer on a line of its own."""
    compact = lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False)  # noqa: E731
    answers = data["answers"]
    if isinstance(answers, dict):
        inner = ",\n".join(f"  {compact(k)}:{compact(v)}" for k, v in answers.items())
        shown = "{\n" + inner + "}"
    else:
        shown = "[\n" + ",\n".join(f"  {compact(a)}" for a in answers) + "]"
    rest = "".join(f",\n {compact(k)}:{compact(v)}" for k, v in data.items() if k not in ("model", "answers"))
    return f'{{"model":{compact(data["model"])},"answers":{shown}{rest}}}'


def http_block(example: Example, response: httpx.Response) -> str:
    headers = "\n".join(f"{name}: {response.headers[name]}" for name in SHOWN if name in response.headers)
    out = f"HTTP/1.1 {response.status_code} {response.reason_phrase}\n{headers}\n\n{rendered(response.json())}"
    return f"```sh\n{curl(example.path, example.body)}\n```\n\n```\n{out}\n```\n"


def ask_block(url: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100"}
    run = subprocess.run(
        [sys.executable, "-m", "openjev", "ask", "--url", url, *ASK],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        raise SystemExit(f"openjev ask failed ({run.returncode}): {run.stderr[-2000:]}")
    args = " \\\n  ".join(_ask_lines())
    return f"```sh\nopenjev ask \\\n  {args}\n```\n\n```\n{run.stdout.rstrip()}\n```\n"


def _ask_lines() -> list[str]:
    lines, current = [], []
    for arg in ASK:
        if arg.startswith("--") and current:
            lines.append(" ".join(current))
            current = []
        current.append(arg if arg.startswith("--") or arg.isalnum() else json.dumps(arg))
    return [*lines, " ".join(current)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_blocks() -> dict[str, str]:
    """Every example's block, from one `openjev serve` with no flags started for the purpose."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENJEV_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    # a task store of its own: no task of the user's store can answer these questions by wording
    store = tempfile.mkdtemp(prefix="doc-examples-")
    server = subprocess.Popen(
        [sys.executable, "-m", "openjev", "serve", "--port", str(port), "--tasks-db", f"{store}/tasks.sqlite3"],
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(server, url)
        blocks = {}
        with httpx.Client(base_url=url, timeout=600) as client:
            for example in EXAMPLES:
                if example.path == "ask":
                    blocks[example.name] = ask_block(url)
                else:
                    blocks[example.name] = http_block(example, client.post(example.path, json=example.body))
        return blocks
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        shutil.rmtree(store, ignore_errors=True)


def _wait_healthy(server: subprocess.Popen, url: str, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"openjev serve exited {server.returncode} (is the default model installed? make serve)")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"openjev serve not healthy after {timeout_s:.0f} s")


def differences(page: str, fresh: str) -> list[str]:
    """Where a page's block and a fresh one differ in what --check holds (module doc)."""
    if not page.strip():
        return ["the block is empty (run --write)"]
    if page.startswith("```sh\nopenjev ask"):
        strip = lambda t: re.sub(r"[0-9.%█▏▎▍▌▋▊▉·]+", "", t)  # noqa: E731
        return [] if strip(page) == strip(fresh) else ["the text of `openjev ask` (numbers and bars aside)"]
    (p_head, p_body), (f_head, f_body) = _parts(page), _parts(fresh)
    out = [] if p_head == f_head else [f"status or headers: {p_head} != {f_head}"]
    return out + _compare(json.loads(p_body), json.loads(f_body), "body")


def _parts(block: str) -> tuple[list[str], str]:
    output = block.split("```\n")[-2] if block.count("```") >= 4 else block
    head, _, body = output.partition("\n\n")
    kept = []
    for line in head.splitlines():
        name, _, value = line.partition(": ")
        if name.endswith("request-id"):
            value = "req_*"
        elif name == "server-timing":
            value = ",".join(part.split(";")[0].strip() for part in value.split(","))
        kept.append(f"{name}: {value}")
    return kept, body


def _compare(page: Any, fresh: Any, where: str) -> list[str]:
    if isinstance(page, dict) and isinstance(fresh, dict):
        if list(page) != list(fresh):
            return [f"{where}: keys {list(page)} != {list(fresh)}"]
        return [d for k in page for d in _compare(page[k], fresh[k], f"{where}.{k}")]
    if isinstance(page, list) and isinstance(fresh, list):
        if len(page) != len(fresh):
            return [f"{where}: {len(page)} items != {len(fresh)}"]
        return [d for i, (a, b) in enumerate(zip(page, fresh, strict=True)) for d in _compare(a, b, f"{where}[{i}]")]
    if isinstance(page, float) or isinstance(fresh, float):
        close = isinstance(page, int | float) and isinstance(fresh, int | float)
        return [] if close and math.isclose(page, fresh, abs_tol=FLOAT_TOLERANCE) else [f"{where}: {page} != {fresh}"]
    return [] if page == fresh and type(page) is type(fresh) else [f"{where}: {page!r} != {fresh!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite every block from a fresh run")
    mode.add_argument("--check", action="store_true", help="exit 1 where a block differs from a fresh run")
    args = ap.parse_args()
    fresh = fresh_blocks()
    failed = 0
    for name in PAGES:
        path = ROOT / name
        text = path.read_text()
        for match in BLOCK.finditer(text):
            diffs = differences(match.group(3).strip("\n") + "\n", fresh[match.group(2)])
            if diffs and args.check:
                failed += 1
                print(f"{name}: block {match.group(2)!r} differs from a fresh run:", *diffs, sep="\n  ")
                print(f"fresh:\n{fresh[match.group(2)]}")
        if args.write:
            path.write_text(BLOCK.sub(lambda m: m.group(1) + "\n" + fresh[m.group(2)] + m.group(4), text))
            print(f"{name}: written")
    print(f"{failed} block(s) differ" if failed else "every block matches a fresh run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
