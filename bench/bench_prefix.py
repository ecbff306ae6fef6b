"""Execution plans, measured side by side in one run (issue: execution plans).

Sections (one JSON line each):
- ratio: tokens computed / distinct tokens for cold requests (1,000-token state; 1, 4, 8,
  16 questions), ours vs naive independent prefills.
- latency: p50 of cold requests (a state never seen) and warm requests (the same state
  again, new questions), ours vs naive vs llm2jev 0.6.1 (its transformers backend through
  its Python API on the same converted weights), each in float32 and, on CPUs with native
  bfloat16, in bfloat16 too (llm2jev always in the same dtype as ours); with both,
  `bfloat16_speedup_cold/warm` is ours in float32 over ours in bfloat16, same run.
- throughput: decisions/s with 1, 4 and 16 concurrent clients, ours vs llm2jev, per dtype.

    .venv/bin/python bench/bench_prefix.py [--repeats N] [--skip-llm2jev] [--dtypes float32 bfloat16]
        [--sections ratio latency throughput] [--latency-questions 1 4 8] [--systems ours naive llm2jev]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import threading
import time
from pathlib import Path

from openjev.config import EMBEDDED_MODEL

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import core_request, machine, p50, payload

from openjev.api.server.assembly import service_limits
from openjev.config import MAX_CHOICE_OPTIONS, load_settings
from openjev.core.plan import Plan
from openjev.core.ports import BranchResult, Engine, PlanResult
from openjev.core.prompts import PromptCompiler
from openjev.core.service import DecisionService
from openjev.engines import load_engine
from openjev.engines.models.source import gguf_cache_folder, resolve_source
from openjev.engines.torch.dtype import cpu_flags, native_bf16, pick_dtype
from openjev.engines.torch.engine import TransformersEngine

_SETTINGS = load_settings({"max_in_flight": 64, "engine_timeout_s": 3600}, environ={})
LIMITS = service_limits(_SETTINGS.quality, _SETTINGS.limits)


class NaiveEngine(Engine):
    """Baseline: every branch prefilled independently through the full model (nothing shared)."""

    parallel_layouts = False

    def __init__(self, model) -> None:
        self._model = model
        self._lock = threading.Lock()

    def _run(self, plan: Plan) -> PlanResult:
        out = []
        with self._lock, torch.inference_mode():
            for b in plan.branches:
                logits = self._model(torch.tensor([b.input_ids])).logits[0, -1].float()
                out.append(BranchResult(tuple(torch.log_softmax(logits, -1)[list(b.label_ids)].tolist())))
        return PlanResult(tuple(out), computed_tokens=plan.prompt_tokens, cached_tokens=0)

    async def run(self, plan: Plan) -> PlanResult:
        return await asyncio.to_thread(self._run, plan)

    async def close(self) -> None:
        pass

    def stats(self) -> dict[str, float]:
        return {}  # nothing kept between requests


class Systems:
    """The systems under test, each answering a wire payload, named `system@dtype`: ours, naive
    and llm2jev, each in every dtype measured (llm2jev in the same dtype as ours)."""

    def __init__(self, dtypes: list[str], with_llm2jev: bool) -> None:
        self.dtypes = dtypes
        self.models, self.engines, self.compilers, self.services, self.llm2jev = {}, {}, {}, {}, {}
        for dtype in dtypes:
            settings = load_settings({"engine": "transformers", "model": EMBEDDED_MODEL, "dtype": dtype}, environ={})
            loaded = load_engine(settings)
            self.models[dtype] = loaded.engine.model
            self.compilers[dtype] = PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)
            self.engines[dtype] = loaded.engine
            self.services[f"ours@{dtype}"] = DecisionService(self.compilers[dtype], loaded.engine, LIMITS)
            self.services[f"naive@{dtype}"] = DecisionService(
                self.compilers[dtype], NaiveEngine(self.models[dtype]), LIMITS
            )
            if with_llm2jev:
                from llm2jev.backends import HF
                from llm2jev.engine import LLM2Jev
                from transformers import AutoTokenizer

                folder = str(gguf_cache_folder(resolve_source(None), settings.served.cache_dir))
                backend = HF(folder, device="cpu", dtype=dtype)
                self.llm2jev[f"llm2jev@{dtype}"] = LLM2Jev(AutoTokenizer.from_pretrained(folder), backend)

    def names(self, *systems: str) -> list[str]:
        return [
            f"{system}@{dtype}" for dtype in self.dtypes for system in systems if system != "llm2jev" or self.llm2jev
        ]

    async def fresh_ours(self) -> None:
        """New engines on the same weights: empty prefix caches, so 'cold' means cold."""
        for dtype in self.dtypes:
            await self.engines[dtype].close()
            self.engines[dtype] = TransformersEngine(self.models[dtype])
            self.services[f"ours@{dtype}"] = DecisionService(self.compilers[dtype], self.engines[dtype], LIMITS)

    async def answer(self, name: str, wire: dict):
        if name in self.llm2jev:
            return await asyncio.to_thread(self.llm2jev[name].run, wire["state"], wire["questions"])
        return await self.services[name].decide(core_request(wire))


def _ours(name: str) -> str:
    return "ours@" + name.split("@")[1]


async def timed(systems: Systems, name: str, wire: dict) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = await systems.answer(name, wire)
    return (time.perf_counter() - t0) * 1000, out


async def ratio_section(systems: Systems) -> dict:
    rows = []
    for n in (1, 4, 8, 16):
        await systems.fresh_ours()  # cold: nothing of this request in any cache
        ours = (await systems.answer(systems.names("ours")[0], payload(n, tag=500 + n))).usage
        rows.append(
            {
                "questions": n,
                "distinct_tokens": ours.input_tokens,
                "ours_computed": ours.computed_tokens,
                "naive_computed": ours.prompt_tokens,
                "ours_ratio": round(ours.computed_tokens / ours.input_tokens, 3),
                "naive_ratio": round(ours.prompt_tokens / ours.input_tokens, 3),
            }
        )
    return {"section": "ratio", "results": rows}


async def latency_section(systems: Systems, names: list[str], repeats: int, sizes=(1, 4, 8)) -> dict:
    rows = []
    for n in sizes:
        for name in names:
            await timed(systems, name, payload(n, tag=900 + n))  # warm-up: kernels, allocator
        cold = {name: [] for name in names}
        warm = {name: [] for name in names}
        for rep in range(repeats):
            for name in names if rep % 2 == 0 else names[::-1]:
                tag = 1000 * (names.index(name) + 1) + 10 * n + rep  # a state no system has seen
                ms, _ = await timed(systems, name, payload(n, tag=tag))
                cold[name].append(ms)
                ms, _ = await timed(systems, name, payload(n, tag=tag, qtag=tag + 5000))  # same state, new questions
                warm[name].append(ms)
        row = {"questions": n}
        for name in names:
            row[f"{name}_cold_p50_ms"] = round(p50(cold[name]))
            row[f"{name}_warm_p50_ms"] = round(p50(warm[name]))
        for name in names:
            if not name.startswith("ours@"):
                row[f"{name}_over_ours_cold"] = round(p50(cold[name]) / p50(cold[_ours(name)]), 2)
                row[f"{name}_over_ours_warm"] = round(p50(warm[name]) / p50(warm[_ours(name)]), 2)
        if "ours@float32" in names and "ours@bfloat16" in names:  # the CPU fast path, same run
            for kind, times in (("cold", cold), ("warm", warm)):
                row[f"bfloat16_speedup_{kind}"] = round(p50(times["ours@float32"]) / p50(times["ours@bfloat16"]), 2)
        rows.append(row)
    return {"section": "latency", "repeats": repeats, "results": rows}


async def throughput_section(
    systems: Systems, names: list[str], requests: int, questions: int, paragraphs: int
) -> dict:
    rows = []
    for clients in (1, 4, 16):
        row = {"clients": clients}
        for name in names:
            queue = [
                payload(questions, tag=20_000 + 1000 * clients + 100 * names.index(name) + i, paragraphs=paragraphs)
                for i in range(requests)
            ]

            async def client(name: str = name, queue: list = queue):
                while queue:
                    await systems.answer(name, queue.pop())

            t0 = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            seconds = time.perf_counter() - t0
            row[f"{name}_decisions_per_s"] = round(requests * questions / seconds, 2)
        rows.append(row)
    for row in rows:
        for name in names:
            if name.startswith("ours@"):
                key = f"{name}_decisions_per_s"
                row[f"{name}_over_serial"] = round(row[key] / rows[0][key], 2)
            else:
                row[f"{_ours(name)}_over_{name}"] = round(
                    row[f"{_ours(name)}_decisions_per_s"] / row[f"{name}_decisions_per_s"], 2
                )
    return {
        "section": "throughput",
        "requests_per_level": requests,
        "questions_per_request": questions,
        "state_paragraphs": paragraphs,
        "results": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-llm2jev", action="store_true")
    parser.add_argument("--throughput-requests", type=int, default=16)
    parser.add_argument("--sections", nargs="+", default=["ratio", "latency", "throughput"])
    parser.add_argument("--latency-questions", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument(
        "--systems", nargs="+", choices=["ours", "naive", "llm2jev"], default=["ours", "naive", "llm2jev"]
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=["float32", "bfloat16"],
        default=None,
        help="default: both where the CPU computes bfloat16 natively, else float32",
    )
    args = parser.parse_args()
    dtypes = args.dtypes or (["float32", "bfloat16"] if native_bf16(cpu_flags()) else ["float32"])
    with_llm2jev = not args.skip_llm2jev and "llm2jev" in args.systems
    systems = Systems(dtypes, with_llm2jev=with_llm2jev)
    names = systems.names(*dict.fromkeys(["ours", *args.systems]))
    head = {
        "bench": "plans",
        "machine": machine(),
        "torch_threads": torch.get_num_threads(),
        "dtypes": dtypes,
        "auto_dtype": pick_dtype("auto", "cpu").reason,
        "llm2jev": "0.6.1, transformers backend via its Python API, same dtype" if with_llm2jev else None,
    }

    async def run():
        if "ratio" in args.sections:
            print(json.dumps({**head, **await ratio_section(systems)}), flush=True)
        if "latency" in args.sections:
            await systems.fresh_ours()
            section = await latency_section(systems, names, args.repeats, args.latency_questions)
            print(json.dumps({**head, **section}), flush=True)
        if "throughput" in args.sections:
            await systems.fresh_ours()
            tnames = systems.names("ours", "llm2jev")
            # a ~300-token ticket with 4 questions, and a short one with 1 (where per-forward cost dominates)
            for questions, paragraphs in ((4, 3), (1, 1)):
                section = await throughput_section(systems, tnames, args.throughput_requests, questions, paragraphs)
                print(json.dumps({**head, **section}), flush=True)

    asyncio.run(run())
    print(
        json.dumps(
            {
                **head,
                "section": "memory",
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            }
        )
    )


if __name__ == "__main__":
    main()
