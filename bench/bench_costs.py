"""What the largest bodies cost before their answer: CPU seconds, RSS growth, and how long
`/health/live` waits meanwhile. One JSON line per case, then a summary.

Two parts, both with the embedded model's real tokenizer and chat template:

- `server`: a real `openjev serve` process on loopback receives each cost bomb of issue 16
  (tests/support/bombs.py: the yesno and letters compile bombs, the batch states form, 66,000
  empty chat turns) while a second client polls `/health/live` every 20 ms. Reported per
  bomb: status, wall seconds to the answer, the server's CPU seconds (user + system) and
  its RSS growth (peak sampled every 10 ms, minus the RSS before), and the slowest
  `/health/live`. A small valid request follows each bomb (its status is reported).
- `prepare`: the largest bodies the limits *accept*, per readout and override, compiled
  in-process as the server does (DecisionService.prepare_now): letters with one reading
  (64 questions over a state just under --max-branch-tokens), letters with
  x-openjev-rotations at --max-rotations, and yesno at --max-branches over the longest state
  --max-prompt-tokens allows. Reported: CPU seconds and RSS growth of the compile, the peak
  of its Python allocations (tracemalloc, a second run), the plan's branches, distinct
  tokens and branch tokens added up.

    .venv/bin/python bench/bench_costs.py [--part all|prepare|server]

(`--part server` also runs against an older checkout, e.g. with PYTHONPATH=<old>/src, to
compare: the bodies are the same.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import httpx
import psutil

from openjev.config import EMBEDDED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import embedded_serve, machine
from tests.support import bombs

ROOT = Path(__file__).resolve().parents[1]


class Peak:
    """Samples a process's RSS every 10 ms on a thread; `growth_mb()` is the peak minus the start."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.start = proc.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.01)

    def growth_mb(self) -> float:
        self._stop.set()
        self._thread.join()
        return round((self.peak - self.start) / 2**20, 1)


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def _bomb(client: httpx.AsyncClient, proc: psutil.Process, name: str, path: str, body: dict, headers: dict):
    data = bombs.encoded(body)
    worst = 0.0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal worst
        while not done.is_set():
            t = time.perf_counter()
            await client.get("/health/live")
            worst = max(worst, time.perf_counter() - t)
            await asyncio.sleep(0.02)

    peak, cpu0, t0 = Peak(proc), cpu_s(proc), time.perf_counter()
    prober = asyncio.create_task(probe())
    r = await client.post(path, content=data, headers={"content-type": "application/json", **headers})
    wall = time.perf_counter() - t0
    done.set()
    await prober
    cpu, growth = cpu_s(proc) - cpu0, peak.growth_mb()
    after = await client.post("/v1/systemone", json=bombs.SMALL)
    return {
        "part": "server",
        "case": name,
        "body_bytes": len(data),
        "status": r.status_code,
        "message": r.text[:160],
        "wall_s": round(wall, 3),
        "server_cpu_s": round(cpu, 3),
        "rss_growth_mb": growth,
        "health_live_worst_ms": round(worst * 1000, 1),
        "next_request_status": after.status_code,
    }


def server_part() -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from tests.support.net import free_port

    port = free_port()
    proc = subprocess.Popen(
        embedded_serve(port, "--log-level", "warning"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        server = psutil.Process(proc.pid)
        cases = [
            ("yesno_compile_bomb", "/v1/systemone", bombs.yesno_compile_bomb(), {"x-openjev-readout": "yesno"}),
            ("letters_compile_bomb", "/v1/systemone", bombs.letters_compile_bomb(), {}),
            ("batch_states_bomb", "/v1/systemone/batch", bombs.batch_states_bomb(), {}),
            ("empty_turns_bomb", "/v1/systemone", bombs.empty_turns_bomb(), {}),
        ]

        async def run() -> list[dict]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                await client.post("/v1/systemone", json=bombs.SMALL)  # warm
                return [await _bomb(client, server, *case) for case in cases]

        return asyncio.run(run())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def prepare_part() -> list[dict]:
    from openjev.api.contract.jev import convert, schemas
    from openjev.api.server.assembly import build_service
    from openjev.config import load_settings
    from openjev.core.readouts import ReadoutSpec
    from openjev.engines import load_engine

    settings = load_settings({"engine": "transformers", "model": EMBEDDED_MODEL}, environ={})
    loaded = load_engine(settings)
    service = build_service(settings.quality, settings.limits, loaded)
    me = psutil.Process()
    digits = "1234567890"

    def body(state_tokens: int, questions: int, options: int) -> dict:
        return {
            "model": "jev-latest",
            "state": (digits * (state_tokens // 10 + 1))[:state_tokens],
            "questions": {
                f"q{k}": {
                    "type": "choice",
                    "instructions": f"Which {k}?",
                    "criteria": {f"o{i}": None for i in range(options)},
                }
                for k in range(questions)
            },
        }

    lim, qual = settings.limits, settings.quality
    cases = [
        (
            "letters, 64 questions, state near max_branch_tokens",
            ReadoutSpec("letters", 1),
            body(lim.max_branch_tokens - 400, 64, 4),
        ),
        (
            f"letters, x-openjev-rotations {qual.max_rotations}, 64 eight-option questions",
            ReadoutSpec("letters", qual.max_rotations),
            body(lim.max_prompt_tokens // (64 * qual.max_rotations) - 200, 64, 8),
        ),
        (
            "yesno, 16 questions of 255 options (max_branches)",
            ReadoutSpec("yesno"),
            body(lim.max_prompt_tokens // (16 * 255) - 200, 16, 255),
        ),
    ]
    out = []
    for name, spec, wire in cases:
        request = convert.request_of(schemas.SystemOneRequest.model_validate(wire))
        readout = service.readout(spec)
        peak, cpu0 = Peak(me), cpu_s(me)
        status = "accepted"
        try:
            compiled = service.prepare_now(request, readout)
        except Exception as e:  # reported, not hidden
            status, compiled = f"refused: {e}", None
        cpu, growth = cpu_s(me) - cpu0, peak.growth_mb()
        del compiled
        # Again under tracemalloc (slower, so not timed): the peak of Python allocations,
        # which RSS hides where the allocator reuses memory freed earlier.
        tracemalloc.start()
        compiled = service.prepare_now(request, readout) if status == "accepted" else None
        traced_mb = round(tracemalloc.get_traced_memory()[1] / 2**20, 1)
        tracemalloc.stop()
        plan = compiled.plan if compiled is not None else None
        out.append(
            {
                "part": "prepare",
                "case": name,
                "body_bytes": len(bombs.encoded(wire)),
                "status": status,
                "cpu_s": round(cpu, 3),
                "rss_growth_mb": growth,
                "python_alloc_peak_mb": traced_mb,
                "branches": len(plan.branches) if plan else None,
                "distinct_tokens": plan.unique_tokens if plan else None,
                "branch_tokens_added_up": plan.prompt_tokens if plan else None,
            }
        )
        del compiled, plan
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "prepare", "server"), default="all")
    part = parser.parse_args().part
    rows = (prepare_part() if part != "server" else []) + (server_part() if part != "prepare" else [])
    for row in rows:
        print(json.dumps(row))
    print(json.dumps({"machine": machine()}))


if __name__ == "__main__":
    main()
