"""Shared-prefix execution vs naive independent prefills, side by side in one run.

For a ~1,000-token state and 1, 4 and 8 questions: p50 latency of the in-process engine
(ours) and of a naive engine that prefills every branch on its own, the tokens each
computes, and the distinct tokens of the request (the floor). Runs alternate ours/naive
so machine noise hits both. Prints one JSON line.

    .venv/bin/python bench/bench_prefix.py [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from common import machine, p50, request  # noqa: E402
from openjev.config import MAX_CHOICE_OPTIONS, load_settings  # noqa: E402
from openjev.core.plan import Plan  # noqa: E402
from openjev.core.ports import BranchResult, PlanResult  # noqa: E402
from openjev.core.prompts import PromptCompiler  # noqa: E402
from openjev.core.service import DecisionService, ServiceLimits  # noqa: E402
from openjev.engines import load_engine  # noqa: E402


class NaiveEngine:
    """Baseline: every branch prefilled independently through the full model (nothing shared)."""

    def __init__(self, model) -> None:
        self._model = model

    async def run(self, plan: Plan) -> PlanResult:
        out = []
        with torch.inference_mode():
            for b in plan.branches:
                logits = self._model(torch.tensor([b.input_ids])).logits[0, -1].float()
                out.append(BranchResult(tuple(torch.log_softmax(logits, -1)[list(b.label_ids)].tolist())))
        return PlanResult(tuple(out), computed_tokens=plan.prompt_tokens, cached_tokens=0)

    async def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--questions", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()

    loaded = load_engine(load_settings({}, environ={}))
    compiler = PromptCompiler(loaded.tokenizer, max_labels=MAX_CHOICE_OPTIONS)
    limits = ServiceLimits(32_768, 262_144, 64, 600, 1)
    services = {
        "ours": DecisionService(compiler, loaded.engine, limits),
        "naive": DecisionService(compiler, NaiveEngine(loaded.engine._model), limits),
    }

    async def timed(service, req):
        t0 = time.perf_counter()
        result = await service.decide(req)
        return (time.perf_counter() - t0) * 1000, result

    async def run() -> list[dict]:
        rows = []
        for n in args.questions:
            await timed(services["ours"], request(n, 999))  # warm-up (kernels, allocator)
            times = {"ours": [], "naive": []}
            last = {}
            for rep in range(args.repeats):
                req = request(n, rep)  # a fresh state each time: every run is cold
                for name in (("ours", "naive") if rep % 2 == 0 else ("naive", "ours")):
                    ms, last[name] = await timed(services[name], req)
                    times[name].append(ms)
            ours, naive = last["ours"].usage, last["naive"].usage
            # same answers whatever the engine (float noise only)
            diff = max(abs(pa - pb)
                       for (_, a), (_, b) in zip(last["ours"].answers, last["naive"].answers)
                       for pa, pb in zip(_probs(a), _probs(b)))
            rows.append({
                "questions": n,
                "ours_p50_ms": round(p50(times["ours"]), 1),
                "naive_p50_ms": round(p50(times["naive"]), 1),
                "speedup": round(p50(times["naive"]) / p50(times["ours"]), 2),
                "unique_tokens": ours.input_tokens,
                "ours_computed_tokens": ours.computed_tokens,
                "naive_computed_tokens": naive.computed_tokens,
                "ours_computed_over_unique": round(ours.computed_tokens / ours.input_tokens, 3),
                "naive_computed_over_unique": round(naive.computed_tokens / naive.input_tokens, 3),
                "max_probability_difference": float(f"{diff:.2e}"),
            })
        return rows

    rows = asyncio.run(run())
    print(json.dumps({
        "bench": "prefix",
        "machine": machine(),
        "torch_threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "results": rows,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }))


def _probs(answer) -> list[float]:
    if hasattr(answer, "p_true"):
        return [answer.p_true]
    if hasattr(answer, "legend"):
        return list(answer.probabilities)
    return [p for _, p in answer.probabilities]


if __name__ == "__main__":
    main()
