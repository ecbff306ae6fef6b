"""A fair share of the engine per key (issue 50): a light tenant beside a heavy one, on a real
server with two keys, measured side by side in one run.

The light key sends one small request at a time (a 10-word state, one noul question); the
heavy key keeps either two batches of 10 short states in flight (`batches`) or 16
concurrent single requests (`singles`). Each phase runs `--seconds` (and until its last
answers are in; a rate counts the decisions answered within the `--seconds`, not that tail):
the light key alone, the heavy key alone, then both together, repeated in `--rounds`
alternating rounds. Reported per heavy mode: the light key's rate (decisions/s, the median of
the rounds') and p50 latency beside its solo figures, the heavy key's
decisions/s beside its solo figure, the total decisions/s together, and every status other
than 200. One JSON line.

    flock /tmp/openjev-heavy.lock .venv/bin/python bench/bench_fair.py [--seconds 20] [--rounds 2] [--serve-arg=--engine=llamacpp]

`--sglang-tiny HIDDEN` measures openjev over a real SGLang 0.5.23 server (PyTorch, CPU;
.venv-sglang-torch: scripts/setup_sglang_torch.sh) serving a tiny random model (the embedded
tokenizer, one layer of HIDDEN units), once per `--engine-calls N` (openjev's
--max-engine-calls: calls past it wait in the keys' fair order; SGLang schedules what it was
sent). One JSON line per setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine
from tests.integration.conftest import start_server, stop_server
from tests.support.tenants import Tally, heavy_batches, heavy_singles, light

KEYS = "light:light-key-0001\nheavy:heavy-key-0002\n"
LIGHT, HEAVY = "light-key-0001", "heavy-key-0002"
HEAVY_MODES = {"batches": heavy_batches, "singles": heavy_singles}


def figures(tallies: list[Tally], windows: list[tuple[float, float]]) -> dict:
    """Decisions/s answered within each round's phase (the median of the rounds'), p50
    latency over every round, other statuses."""
    ms = sorted(x * 1000 for t in tallies for x in t.latencies_s)
    errors: dict[int, int] = {}
    for t in tallies:
        for status, n in t.errors.items():
            errors[status] = errors.get(status, 0) + n
    return {
        "decisions_per_s": round(statistics.median(t.rate(*w) for t, w in zip(tallies, windows, strict=True)), 3),
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "errors": errors,
    }


async def phase(
    url: str, seconds: float, light_on: bool, heavy: str | None
) -> dict[str, tuple[Tally, tuple[float, float]]]:
    """Each tenant's tally and the phase's window (start, end): what is answered after it, a
    tenant finishing its last batches alone, does not count."""
    t0 = time.monotonic()
    until = t0 + seconds
    tasks = {}
    if light_on:
        tasks["light"] = light(url, LIGHT, until)
    if heavy is not None:
        tasks["heavy"] = HEAVY_MODES[heavy](url, HEAVY, until)
    tallies = await asyncio.gather(*tasks.values())
    return {name: (t, (t0, until)) for name, t in zip(tasks, tallies, strict=True)}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


async def measure(url: str, seconds: float, modes: list[str], rounds: int) -> dict:
    """`rounds` rounds, each: the light key alone, then per heavy mode the heavy key alone and
    both together (the machine's load drifts: each ratio compares phases of the same rounds)."""
    await phase(url, 3, True, modes[0])  # warm-up: first forwards are slow
    runs: dict[str, list[tuple[Tally, tuple[float, float]]]] = {}
    for _ in range(rounds):
        runs.setdefault("light_solo", []).append((await phase(url, seconds, True, None))["light"])
        for mode in modes:
            runs.setdefault(f"{mode}/heavy_solo", []).append((await phase(url, seconds, False, mode))["heavy"])
            both = await phase(url, seconds, True, mode)
            runs.setdefault(f"{mode}/light", []).append(both["light"])
            runs.setdefault(f"{mode}/heavy", []).append(both["heavy"])
    fig = {name: figures([t for t, _ in rs], [s for _, s in rs]) for name, rs in runs.items()}
    out: dict = {"light_solo": fig["light_solo"]}
    for mode in modes:
        solo_l, solo_h, lt, hv = (
            fig["light_solo"],
            fig[f"{mode}/heavy_solo"],
            fig[f"{mode}/light"],
            fig[f"{mode}/heavy"],
        )
        total = lt["decisions_per_s"] + hv["decisions_per_s"]
        out[mode] = {
            "heavy_solo": solo_h,
            "together": {"light": lt, "heavy": hv},
            "light_rate_vs_solo": ratio(lt["decisions_per_s"], solo_l["decisions_per_s"]),
            "light_p50_vs_solo": ratio(lt["p50_ms"], solo_l["p50_ms"]),
            "heavy_rate_vs_solo": ratio(hv["decisions_per_s"], solo_h["decisions_per_s"]),
            "total_decisions_per_s": round(total, 3),
            "total_vs_heavy_solo": ratio(total, solo_h["decisions_per_s"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--modes", default="batches,singles", help="heavy modes to run: batches, singles")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of every phase")
    parser.add_argument("--serve-arg", action="append", default=[], help="an extra `openjev serve` argument")
    parser.add_argument("--sglang-tiny", type=int, metavar="HIDDEN", help="over SGLang serving a tiny model")
    parser.add_argument("--weights", action="store_true", help="two heavy keys of weight 1 and 2 instead")
    parser.add_argument("--weight-batches", type=int, default=2, help="with --weights: batches in flight per key")
    parser.add_argument("--engine-calls", default="64,4", help="with --sglang-tiny: --max-engine-calls values")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    head = {"bench": "fair", "machine": machine(), "seconds": args.seconds, "rounds": args.rounds}
    if args.sglang_tiny:
        over_sglang(args, modes, head)
        return
    if args.weights:
        print(json.dumps({**head, **weighted(args), "load_avg_1m": os.getloadavg()[0]}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys").write_text(KEYS)
        server = start_server(Path(tmp), "--api-keys-file", str(Path(tmp) / "keys"), *args.serve_arg, env={})
        try:
            result = asyncio.run(measure(server.url, args.seconds, modes, args.rounds))
        finally:
            stop_server(server)
    print(json.dumps({**head, "load_avg_1m": os.getloadavg()[0], **result}))


WEIGHTED_KEYS = "one:weight-one-key-01 weight=1\ntwo:weight-two-key-02 weight=2\n"


def weighted(args: argparse.Namespace) -> dict:
    """Two heavy keys (`--weight-batches` batches of 10 in flight each), of weight 1 and 2, side by side for
    `--rounds` phases: each key's decisions/s and the ratio of the weight-2 key's to the other's."""

    async def rounds(url: str) -> list[tuple[Tally, Tally, tuple[float, float]]]:
        out = []
        for _ in range(args.rounds + 1):  # the first: warm-up, not counted
            t0 = time.monotonic()
            until = t0 + args.seconds
            one, two = await asyncio.gather(
                heavy_batches(url, "weight-one-key-01", until, batches=args.weight_batches),
                heavy_batches(url, "weight-two-key-02", until, batches=args.weight_batches),
            )
            out.append((one, two, (t0, until)))
        return out[1:]

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "keys").write_text(WEIGHTED_KEYS)
        server = start_server(Path(tmp), "--api-keys-file", str(Path(tmp) / "keys"), *args.serve_arg, env={})
        try:
            runs = asyncio.run(rounds(server.url))
        finally:
            stop_server(server)
    one = [round(a.rate(*w), 3) for a, _, w in runs]
    two = [round(b.rate(*w), 3) for _, b, w in runs]
    errors = [dict(a.errors) | dict(b.errors) for a, b, _ in runs]
    ratios = [round(b / a, 2) if a else None for a, b in zip(one, two, strict=True)]
    return {
        "weight_1_decisions_per_s": one,
        "weight_2_decisions_per_s": two,
        "ratio_per_round": ratios,
        "errors": errors,
    }


def over_sglang(args: argparse.Namespace, modes: list[str], head: dict) -> None:
    """The bench over one SGLang server, once per --engine-calls value (one JSON line each)."""
    from tests.sglang import server as sgl

    if not sgl.SGL_TORCH_PYTHON.exists():
        sys.exit(f"no SGLang venv at {sgl.SGL_TORCH_PYTHON}: run scripts/setup_sglang_torch.sh")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "keys").write_text(KEYS)
        folder = sgl.tiny_model_folder(root / "tiny", hidden=args.sglang_tiny)
        engine = sgl.start(folder, root / "sglang.log", kind="torch", max_running=32, context_length=2048, chunk=1024)
        try:
            for calls in [int(c) for c in args.engine_calls.split(",") if c]:
                flags = ("--engine", "sglang", "--connect", engine.url, "--model", str(folder))
                more = ("--max-engine-calls", str(calls), *args.serve_arg)
                server = start_server(root, "--api-keys-file", str(root / "keys"), *flags, *more, env={})
                try:
                    result = asyncio.run(measure(server.url, args.seconds, modes, args.rounds))
                finally:
                    stop_server(server)
                engine_head = {"engine": f"sglang 0.5.23 (torch, CPU), tiny random model (hidden {args.sglang_tiny})"}
                line = {**head, **engine_head, "max_engine_calls": calls, "load_avg_1m": os.getloadavg()[0], **result}
                print(json.dumps(line), flush=True)
        finally:
            engine.stop()


if __name__ == "__main__":
    main()
