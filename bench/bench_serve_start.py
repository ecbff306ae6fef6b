"""`openjev serve`'s start, process start to its first `GET /health` 200 (the model loaded and
the service built: what an orchestrator waits for), for this tree and, with `--checkout
COMMIT`, an older one side by side: the runs alternate (this tree, the other, ...), so both
see the same machine, and the gain is one ratio of p50s. Each server's RSS is read from
/proc when it turns ready (VmRSS, and VmHWM: the peak so far).

The other tree is a git worktree of COMMIT under the system's temporary folder (made once,
kept for later runs), served by this venv with its `src/` first on PYTHONPATH, so the two
differ in openjev's code only.

    .venv/bin/python bench/bench_serve_start.py --checkout 4564561 --repeats 5 \\
        -- --engine llamacpp --model qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def checkout(commit: str) -> Path:
    """A worktree of `commit` (detached), made once under the temporary folder."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", commit], check=True, capture_output=True, text=True)
    full = sha.stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"openjev-bench-{full[:12]}"
    if not (tree / "src" / "openjev").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), full], check=True)
    return tree


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_mib(pid: int) -> dict[str, int]:
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(line.split()[1]) / 1024)
    return out


def one_start(src: Path, serve_args: list[str], timeout_s: float) -> dict:
    """Seconds from Popen to the first /health 200, and the RSS then; the server stopped after."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "openjev", "serve", "--port", str(port), *serve_args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{src}: server exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"{src}: not ready in {timeout_s} s")
            time.sleep(0.02)
        seconds = time.perf_counter() - t0
        return {"start_s": round(seconds, 2), **status_mib(proc.pid)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", default=None, help="also this commit's openjev, runs alternating")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument(
        "serve_args", nargs="*", help="after --: `openjev serve` flags (default: --engine llamacpp --model embedded)"
    )
    args = ap.parse_args()
    serve_args = args.serve_args or ["--engine", "llamacpp", "--model", "embedded"]
    sides = {"this tree": REPO / "src"}
    if args.checkout:
        sides[f"checkout {args.checkout}"] = checkout(args.checkout) / "src"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(json.dumps({"serve": serve_args, "head": head.stdout.strip(), "repeats": args.repeats}), flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(args.repeats):
        for name, src in sides.items():
            run = one_start(src, serve_args, args.timeout_s)
            runs[name].append(run)
            print(json.dumps({"side": name, "run": r, **run}), flush=True)
    p50 = {name: statistics.median(x["start_s"] for x in rs) for name, rs in runs.items()}
    print(
        "\n| side | start p50 | start min-max | RSS at ready (p50) | RSS peak at ready (p50) |\n|---|---|---|---|---|"
    )
    for name, rs in runs.items():
        starts = [x["start_s"] for x in rs]
        rss = statistics.median(x["VmRSS"] for x in rs)
        hwm = statistics.median(x["VmHWM"] for x in rs)
        print(
            f"| {name} | {p50[name]:.2f} s | {min(starts):.2f}-{max(starts):.2f} s | {rss:,.0f} MiB | {hwm:,.0f} MiB |"
        )
    if args.checkout:
        base, this = p50[f"checkout {args.checkout}"], p50["this tree"]
        print(f"\nstart ratio (checkout / this tree, > 1: this tree starts sooner): {base / this:.2f}x")


if __name__ == "__main__":
    main()
