"""`openjev task`: a client of a running server's /v1/tasks, like `openjev ask`.

    openjev task create --question '{"type": "noul", "instructions": "Is a refund asked?"}' \\
        --examples examples.jsonl [--target-precision 0.9] [--wait]
    openjev task add TASK_ID --examples more.jsonl
    openjev task show TASK_ID
    openjev task list [--after NEXT]      # a page of tasks; `next` names the following page
    openjev task delete TASK_ID

Examples are JSON Lines, one `{"state": ..., "answer": ...}` per line (noul: true or false;
choice: the option's name; score: the level's index). Output is the server's JSON. Exit
status: 0 done, 1 the server refused or failed (its message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from openjev.ask import KEY_ENV, URL_ENV, _error_message

ACTIONS = ("create", "add", "show", "list", "delete")


def add_parser(sub: argparse._SubParsersAction) -> None:
    import os

    p = sub.add_parser("task", help="create, fill, read, list and delete tasks (/v1/tasks) on a running server")
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("task_id", nargs="?", help="the task (add, show, delete)")
    p.add_argument(
        "--url", default=os.environ.get(URL_ENV, "http://127.0.0.1:8000"), help=f"server root [env {URL_ENV}]"
    )
    p.add_argument("--key", default=os.environ.get(KEY_ENV), help=f"API key [env {KEY_ENV}]")
    p.add_argument("--question", help="create: the Jev question object (JSON, or @FILE)")
    p.add_argument("--examples", help="create, add: JSON Lines of {state, answer}")
    p.add_argument("--target-precision", type=float, help="create: the abstain threshold's target precision")
    p.add_argument("--after", help="list: the page after this one (the previous page's `next`)")
    p.add_argument("--wait", action="store_true", help="create, add: wait until the fit is ready or failed")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per HTTP call (default 60)")


def _json_arg(text: str) -> Any:
    return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)


def _examples(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path, body) of the action; ValueError for a missing argument."""
    needs_id = args.action in ("add", "show", "delete")
    if needs_id and not args.task_id:
        raise ValueError(f"task {args.action} needs a TASK_ID")
    if args.action in ("create", "add") and not args.examples:
        raise ValueError(f"task {args.action} needs --examples FILE")
    if args.action == "create":
        if not args.question:
            raise ValueError("task create needs --question")
        body: dict[str, Any] = {"question": _json_arg(args.question), "examples": _examples(args.examples)}
        if args.target_precision is not None:
            body["target_precision"] = args.target_precision
        return "POST", "/v1/tasks", body
    if args.action == "add":
        return "POST", f"/v1/tasks/{args.task_id}/examples", {"examples": _examples(args.examples)}
    if args.action == "list":
        return "GET", "/v1/tasks" + (f"?after={quote(args.after)}" if args.after else ""), None
    return ("GET" if args.action == "show" else "DELETE"), f"/v1/tasks/{args.task_id}", None


def run(args: argparse.Namespace) -> int:
    try:
        method, path, body = _request(args)
    except (ValueError, OSError) as e:
        print(f"openjev task: {e}", file=sys.stderr)
        return 2
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    root = args.url.rstrip("/")
    try:
        with httpx.Client(base_url=root, headers=headers, timeout=args.timeout) as client:
            r = client.request(method, path, json=body)
            if r.status_code >= 400:
                print(f"openjev task: {r.status_code} {_error_message(r)}", file=sys.stderr)
                return 1
            out = r.json() if r.content else {"deleted": args.task_id}
            if args.wait and args.action in ("create", "add"):
                out = _wait(client, out["id"])
    except httpx.HTTPError as e:
        print(f"openjev task: cannot reach {root}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2))
    return 0 if out.get("status") != "failed" else 1


def _wait(client: httpx.Client, task_id: str) -> dict[str, Any]:
    """The task once its fit is ready or failed, its progress on stderr meanwhile."""
    while True:
        task: dict[str, Any] = client.get(f"/v1/tasks/{task_id}").raise_for_status().json()
        if task["status"] in ("ready", "failed"):
            return task
        done, total = task["progress"]["done"], task["progress"]["total"]
        print(f"\r{task['status']}: {done}/{total}", end="", file=sys.stderr)
        time.sleep(0.5)
