"""SGLang's own /v1/systemone beside openjev, on one real SGLang server (0.5.23, PyTorch, CPU).

One SGLang server (.venv-sglang-torch: scripts/setup_sglang_torch.sh) serves the embedded
model's converted float32 weights; three systems answer the same wire requests on this machine:

- sglang:          SGLang's own POST /v1/systemone on that server
- openjev_sglang:  `openjev serve --engine sglang --connect` to that same server
- openjev:         `openjev serve --dtype float32` (in-process, the same weights)

Each is a real HTTP server, measured in one run, systems alternating (bench/common.py requests):

- latency: p50 of --repeats, cold (a ~1,000-token state never sent) and warm (the same state,
  new questions), at 1 and 8 questions;
- throughput: decisions/s with 4 clients (4 questions per request, ~300-token states); with
  --throughput-rounds N, N rounds in alternating order, each round's ratio and their median;
- quality on evals/data/test.jsonl (each system's default readout and calibration): accuracy,
  ECE, Brier, mean label mass (x_label_mass);
- jevcompat's conformance summary (MUST / SHOULD);
- the Decisions routes (`/v1/decisions`), driven by the official `openai` SDK
  (`client.decisions.create`) on every system: cold and warm p50 at 1 and 8 questions, the same
  questions in each route's own wire format. SGLang's route takes its own question format (`id`,
  `yes_no`, `options`), not OpenAI's (`name`, `predicate`, `choices`): the SDK sends it all the
  same (its request types are not enforced at run time), and the section records how SGLang
  answers the OpenAI format.

JSON lines on stdout, one per section. The server's scheduler keeps a core busy while idle:
everything is stopped at the end.

    .venv/bin/python bench/bench_sglang_own.py [--repeats 3] [--skip-latency] [--skip-decisions]
        [--skip-throughput] [--throughput-rounds 1] [--skip-eval] [--skip-jevcompat] [--clients 4] [--skip-inprocess]
        [--tiny 64]

--tiny HIDDEN serves a tiny random model the bench generates (the embedded tokenizer, one
Llama layer of HIDDEN units): its forward costs almost nothing, so what is measured is each
route's own work per request, as on a GPU. openjev's rows then carry the p50 of each phase of
its Server-Timing header.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the repo root, for tests.*

import httpx
import openai
from bench_vllm import System, cpu_parts, jevcompat, throughput
from common import machine, p50, payload, questions, state_text
from tests.integration.conftest import start_server, stop_server
from tests.sglang import server as sgl

from openjev.evals.dataset import load_items
from openjev.evals.metrics import summarize
from openjev.evals.runner import ResultStore, RunConfig, run_items, score

KEY = "bench-key-1"
REPO = Path(__file__).resolve().parent.parent
TEST_SET = REPO / "evals" / "data" / "test.jsonl"


async def latency(systems: list[System], repeats: int, sizes: tuple[int, ...], emit=None) -> dict:
    """Cold and warm p50 per size; each size's row is also passed to `emit` as soon as it is
    measured. For openjev's systems, the p50 of each phase of its Server-Timing header too
    (prepare: compile and encode; engine: the engine calls, the hop included; total less
    engine and prepare: the edge, JSON both ways and HTTP)."""
    rows = []
    async with httpx.AsyncClient(timeout=1800) as client:
        for s in systems:  # warm-up: first-call costs (allocations, lazy imports)
            await s.ask(client, payload(2, tag=7000 + systems.index(s)))
        for n in sizes:
            cold = {s.name: [] for s in systems}
            warm = {s.name: [] for s in systems}
            phases: dict[str, list[dict]] = {f"{s.name}_{w}": [] for s in systems for w in ("cold", "warm")}
            for rep in range(repeats):
                for s in systems if rep % 2 == 0 else systems[::-1]:
                    tag = 8000 + 1000 * n + 100 * systems.index(s) + rep
                    for which, qtag, into in (("cold", None, cold), ("warm", tag + 5000, warm)):
                        seen = len(s.timings)
                        wire = payload(n, tag=tag) if qtag is None else payload(n, tag=tag, qtag=qtag)
                        into[s.name].append(await s.ask(client, wire))
                        phases[f"{s.name}_{which}"] += s.timings[seen:]
            row: dict = {"questions": n}
            for s in systems:
                row[f"{s.name}_cold_p50_ms"] = round(p50(cold[s.name]))
                row[f"{s.name}_warm_p50_ms"] = round(p50(warm[s.name]))
            for name, seen_phases in phases.items():
                if seen_phases:
                    keys = {k for t in seen_phases for k in t}
                    row[f"{name}_phases_p50_ms"] = {
                        k: round(p50([t[k] for t in seen_phases if k in t]), 1) for k in keys
                    }
            rows.append(row)
            if emit is not None:
                emit({"section": "latency", "repeats": repeats, "results": [row]})
    return {"section": "latency", "repeats": repeats, "state_tokens": "~1000", "results": rows}


async def quality(system: System, key: str | None, folder: Path, concurrency: int, limit: int | None = None) -> dict:
    """The test set through `system` with its own defaults (no openjev headers but the key);
    `limit`: an even spread of that many items (every k-th), the same for every system."""
    items = load_items(TEST_SET)
    if limit is not None and limit < len(items):
        items = items[:: -(-len(items) // limit)]
    items = [replace(i, request={**i.request, "model": system.model}) for i in items]
    store = ResultStore(folder, {"system": system.name}, restart=True)
    t0 = time.perf_counter()
    await run_items(system.url, items, RunConfig(flips=False), store, concurrency=concurrency, key=key, progress=False)
    scored, facts = score(items, store)
    summary = summarize(scored)
    return {
        "section": "quality",
        "system": system.name,
        "data": "evals/data/test.jsonl",
        "items": facts["items"],
        "items_failed": facts["items_failed"],
        "questions": summary.get("questions"),
        "accuracy": _r(summary.get("accuracy")),
        "ece": _r(summary.get("ece")),
        "brier": _r(summary.get("brier")),
        "label_mass_mean": _r(facts["label_mass_mean"]),
        "calibration": facts["calibration"],
        "readout": facts["readout"],
        "seconds": round(time.perf_counter() - t0),
    }


def openai_questions(n: int, tag: int) -> list[dict]:
    """bench/common.py's questions in OpenAI's Decisions format (openjev's /v1/decisions)."""
    out = []
    for qid, q in questions(n, tag).items():
        if q["type"] == "noul":
            out.append({"type": "predicate", "name": qid, "instructions": q["instructions"]})
        elif q["type"] == "choice":
            choices = [{"value": k, **({"description": v} if v else {})} for k, v in q["criteria"].items()]
            out.append({"type": "choice", "name": qid, "instructions": q["instructions"], "choices": choices})
        else:
            levels = [{"label": c} for c in q["criteria"]]
            out.append({"type": "score", "name": qid, "instructions": q["instructions"], "levels": levels})
    return out


def sglang_questions(n: int, tag: int) -> list[dict]:
    """The same questions in SGLang 0.5.23's own /v1/decisions format (its protocol.py)."""
    out = []
    for qid, q in questions(n, tag).items():
        if q["type"] == "noul":
            out.append({"id": qid, "type": "yes_no", "question": q["instructions"]})
        elif q["type"] == "choice":
            options = [{"name": k, **({"description": v} if v else {})} for k, v in q["criteria"].items()]
            out.append({"id": qid, "type": "choice", "question": q["instructions"], "options": options})
        else:
            out.append({"id": qid, "type": "score", "question": q["instructions"], "levels": list(q["criteria"])})
    return out


class DecisionsSystem:
    """One system's /v1/decisions through the openai SDK; `own_format`: SGLang's question format."""

    def __init__(self, name: str, url: str, key: str | None, model: str, own_format: bool) -> None:
        self.name, self.model, self.own_format = name, model, own_format
        self.client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key or "none", max_retries=0, timeout=1800)

    async def ask(self, n: int, tag: int, qtag: int) -> float:
        qs = sglang_questions(n, qtag) if self.own_format else openai_questions(n, qtag)
        t0 = time.perf_counter()
        # with_raw_response: SGLang's answer is its own shape, not the SDK's Decision; both are
        # read from the JSON, and each must carry one answer per question.
        raw = await self.client.decisions.with_raw_response.create(
            model=self.model, input=state_text(tag), questions=qs
        )
        ms = (time.perf_counter() - t0) * 1000
        answers = raw.http_response.json()["answers"]
        if len(answers) != n:
            raise RuntimeError(f"{self.name}: {len(answers)} answers to {n} questions")
        return ms


async def decisions(systems: list[DecisionsSystem], repeats: int, sizes: tuple[int, ...], emit) -> dict:
    """Cold (a new ~1,000-token state) and warm (the same state, new questions) p50 per size."""
    for s in systems:  # warm-up, as for /v1/systemone
        await s.ask(2, 7500 + systems.index(s), 7500)
    rows = []
    for n in sizes:
        cold: dict[str, list[float]] = {s.name: [] for s in systems}
        warm: dict[str, list[float]] = {s.name: [] for s in systems}
        for rep in range(repeats):
            for s in systems if rep % 2 == 0 else systems[::-1]:
                tag = 60_000 + 1000 * n + 100 * systems.index(s) + rep
                cold[s.name].append(await s.ask(n, tag, tag))
                warm[s.name].append(await s.ask(n, tag, tag + 5000))
        row: dict = {"questions": n}
        for s in systems:
            row[f"{s.name}_cold_p50_ms"] = round(p50(cold[s.name]))
            row[f"{s.name}_warm_p50_ms"] = round(p50(warm[s.name]))
        rows.append(row)
        emit(
            {
                "section": "decisions",
                "route": "/v1/decisions",
                "client": f"openai {openai.__version__}",
                "repeats": repeats,
                "results": [row],
            }
        )
    # SGLang's route asked in OpenAI's format (what an OpenAI SDK user sends as typed)
    sglang = next(s for s in systems if s.own_format)
    try:
        await sglang.client.decisions.create(model=sglang.model, input=state_text(1), questions=openai_questions(1, 1))
        refused = "answered"
    except openai.APIStatusError as e:
        refused = f"{e.status_code}: {str(e.message)[:200]}"
    for s in systems:
        await s.client.close()
    return {"section": "decisions", "sglang_given_openai_format": refused, "results": rows}


def openjev_commit() -> str:
    """Which openjev answered: the package's folder and, if it is a git checkout, its commit."""
    import subprocess

    import openjev

    where = Path(openjev.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or "unknown"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8], help="questions per latency request")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--throughput-requests", type=int, default=8)
    parser.add_argument(
        "--throughput-rounds",
        type=int,
        default=1,
        help="measure throughput this many times, the systems' order alternating; report each round's ratio and the median",
    )
    parser.add_argument("--eval-concurrency", type=int, default=2)
    parser.add_argument("--eval-limit", type=int, default=None, help="an even spread of this many test items")
    parser.add_argument("--skip-jevcompat", action="store_true")
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument("--skip-decisions", action="store_true")
    parser.add_argument(
        "--tiny",
        type=int,
        default=None,
        metavar="HIDDEN",
        help="serve a tiny random model instead (the embedded tokenizer, one layer of HIDDEN units, e.g. 64): "
        "its forward costs almost nothing, so each route's own work per request is what is measured",
    )
    parser.add_argument("--skip-inprocess", action="store_true", help="only SGLang's route and openjev over it")
    parser.add_argument(
        "--baseline-src",
        default=None,
        metavar="SRC",
        help="also measure openjev from another checkout's src folder over the same server (openjev_base)",
    )
    parser.add_argument(
        "--baseline-args",
        default="",
        metavar="ARGS",
        help="also measure openjev (this checkout, or --baseline-src's) with these extra `openjev serve` "
        "arguments over the same server (openjev_base), e.g. '--readout letters' for one plain reading",
    )
    return parser.parse_args()


def sections(
    args: argparse.Namespace, systems: list[System], routes: list[DecisionsSystem], root: Path, emit, cpu: dict
) -> None:
    """Every section asked for, each row passed to `emit`; `cpu`: the process groups serving
    each system (throughput's CPU per decision)."""
    if not args.skip_latency:
        asyncio.run(latency(systems, args.repeats, tuple(args.sizes), emit))
    if not args.skip_decisions:
        emit(asyncio.run(decisions(routes, args.repeats, tuple(args.sizes), emit)))
    if not args.skip_throughput:
        emit(asyncio.run(throughput(systems, args.clients, args.throughput_requests, 4, cpu, args.throughput_rounds)))
    if not args.skip_jevcompat:
        for s in systems:
            key = None if s.name == "sglang" else KEY
            emit({"section": "jevcompat", **jevcompat(s, key, root / f"{s.name}.json")})
    if not args.skip_eval:
        for s in systems:
            key = None if s.name == "sglang" else KEY
            emit(asyncio.run(quality(s, key, root / f"eval-{s.name}", args.eval_concurrency, args.eval_limit)))


def main() -> None:
    args = parse_args()
    if not sgl.SGL_TORCH_PYTHON.exists():
        sys.exit(f"no SGLang venv at {sgl.SGL_TORCH_PYTHON}: run scripts/setup_sglang_torch.sh")
    root = Path(tempfile.mkdtemp(prefix="bench-sglang-own-"))
    folder = sgl.tiny_model_folder(root / "tiny", hidden=args.tiny) if args.tiny else sgl.model_folder("torch", root)
    t0 = time.perf_counter()
    # 8 branches of ~1,100 tokens at once (8 questions on a ~1,000-token state).
    server = sgl.start(folder, root / "sglang.log", kind="torch", max_running=8, context_length=2048, chunk=1024)
    head = {
        "bench": "sglang_own",
        "machine": machine(),
        "model": f"tiny random (1 layer, hidden {args.tiny}), embedded tokenizer, float32"
        if args.tiny
        else "SmolLM2-135M-Instruct, embedded, float32",
        "openjev": openjev_commit(),
        "sglang": "sglang 0.5.23 (PyTorch 2.13.0 CPU, torch_native attention)",
        "sglang_start_s": round(time.perf_counter() - t0),
    }
    lives = []
    try:
        common = ("--engine-timeout-s", "1800", "--max-in-flight", "64", "--max-queue-wait-s", "1000")
        over = start_server(
            root, "--engine", "sglang", "--connect", server.url, "--model", str(folder), *common, key=KEY
        )
        lives.append(over)
        model = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        systems = [
            System("sglang", server.url, {}, model),
            System("openjev_sglang", over.url, over.headers(), "jev-latest"),
        ]
        if args.baseline_src or args.baseline_args:
            base = start_server(
                root,
                *("--engine", "sglang", "--connect", server.url, "--model", str(folder), *common),
                *shlex.split(args.baseline_args),
                key=KEY,
                env={"PYTHONPATH": f"{args.baseline_src}:{REPO}"} if args.baseline_src else None,
            )
            lives.append(base)
            systems.append(System("openjev_base", base.url, base.headers(), "jev-latest"))
        inproc = None
        if not args.skip_inprocess:
            inproc = start_server(root, "--model", str(folder), "--dtype", "float32", *common, key=KEY)
            lives.append(inproc)
            systems.append(System("openjev", inproc.url, inproc.headers(), "jev-latest", in_process=True))

        routes = [
            DecisionsSystem("sglang", server.url, None, model, own_format=True),
            DecisionsSystem("openjev_sglang", over.url, KEY, "jev-latest", own_format=False),
        ]
        if inproc is not None:
            routes.append(DecisionsSystem("openjev", inproc.url, KEY, "jev-latest", own_format=False))
        # CPU per decision in throughput: SGLang's processes, and each openjev's own beside them
        cpu = cpu_parts("sglang", server.process.process.pid, lives, systems)
        sections(args, systems, routes, root, lambda row: print(json.dumps({**head, **row}), flush=True), cpu)
    finally:
        for live in lives:
            stop_server(live)
        server.stop()


if __name__ == "__main__":
    main()
