"""openjev's SGLang engine against a real SGLang-protocol server (SGLang-JAX on CPU).

For each strategy (all, warmup, staged, auto): a cold request (a ~1,000-token state never
sent, 8 questions) and a warm one (the same state again, 8 new questions); latency, tokens
the server actually computed and served from its radix cache (PlanResult.computed_tokens,
cached_tokens), and which strategy `auto` picked. One JSON line per strategy.

The server is started here from .venv-sglang-jax (scripts/setup_sglang_jax.sh) on the
embedded model's converted weights, unless --url names a running one. JAX compiles per
shape on first use (--disable-precompile), so a throwaway round on other states runs
first, then the cache is flushed; each measured round uses fresh states.

    .venv/bin/python bench/bench_sglang.py [--url URL] [--repeats N] [--questions 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the repo root, for tests.sglang

from common import core_request, machine, p50, payload
from tests.sglang import server as sgl

from openjev.config import MAX_CHOICE_OPTIONS
from openjev.core.prompts import PromptCompiler
from openjev.engines.http.engine import HTTPEngine
from openjev.engines.http.sglang_protocol import SGLANG

STRATEGIES = ("all", "warmup", "staged", "auto")


def load_compiler(folder: Path) -> PromptCompiler:
    from transformers import AutoTokenizer

    from openjev.engines.models.tokenizer import HFChatTokenizer

    tokenizer = HFChatTokenizer(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    return PromptCompiler(tokenizer, max_labels=MAX_CHOICE_OPTIONS)


async def timed(engine: HTTPEngine, plan):
    t0 = time.perf_counter()
    result = await engine.run(plan)
    return result, (time.perf_counter() - t0) * 1000


async def measure(url: str, compiler: PromptCompiler, strategy: str, tag: int, n_questions: int) -> dict:
    """One cold and one warm request with a fresh state `tag`, through a fresh engine."""
    cold = compiler.compile(core_request(payload(n_questions, tag))).plan
    warm = compiler.compile(core_request(payload(n_questions, tag, qtag=tag + 5000))).plan
    engine = HTTPEngine(url, SGLANG, strategy=strategy, call_timeout_s=1800)  # CPU prefills take many seconds
    try:
        c, c_ms = await timed(engine, cold)
        w, w_ms = await timed(engine, warm)
    finally:
        await engine.close()
    return {
        "cold_ms": c_ms,
        "warm_ms": w_ms,
        "cold_computed": c.computed_tokens,
        "cold_cached": c.cached_tokens,
        "warm_computed": w.computed_tokens,
        "warm_cached": w.cached_tokens,
        "picked": dict(engine.strategies_used),
        "plan": {
            "shared_prefix": cold.shared_prefix_len,
            "unique": cold.unique_tokens,
            "prompt": cold.prompt_tokens,
            "branches": len(cold.branches),
            "warm_unique": warm.unique_tokens,
            "warm_prompt": warm.prompt_tokens,
        },
    }


async def bench(url: str, compiler: PromptCompiler, repeats: int, n_questions: int, server: dict) -> None:
    # Compile round: the same shapes as the measured rounds, on states never reused.
    t0 = time.perf_counter()
    for k, strategy in enumerate(STRATEGIES):
        await measure(url, compiler, strategy, 900 + k, n_questions)
    compile_s = time.perf_counter() - t0
    head = {
        "bench": "sglang",
        "server": "sglang-jax 0.1.0rc0 (cpu, native attention, float32)",
        "model": "SmolLM2-135M-Instruct (embedded, float32)",
        "url": url,
        **server,
        "machine": machine(),
        "questions": n_questions,
        "repeats": repeats,
        "compile_round_s": round(compile_s, 1),
    }
    for k, strategy in enumerate(STRATEGIES):
        runs = []
        for r in range(repeats):
            if not sgl.flush_cache(url):
                print(f"warning: /flush_cache failed at {url}", file=sys.stderr)
            runs.append(await measure(url, compiler, strategy, 10 * (r + 1) + k, n_questions))
        last = runs[-1]
        print(
            json.dumps(
                {
                    **head,
                    "strategy": strategy,
                    "cold_ms_p50": round(p50([x["cold_ms"] for x in runs]), 1),
                    "warm_ms_p50": round(p50([x["warm_ms"] for x in runs]), 1),
                    "cold_computed_tokens": last["cold_computed"],
                    "cold_cached_tokens": last["cold_cached"],
                    "warm_computed_tokens": last["warm_computed"],
                    "warm_cached_tokens": last["warm_cached"],
                    "picked": last["picked"],
                    "plan": last["plan"],
                }
            ),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running SGLang-protocol server with the embedded model (else one is started)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=1024, help="the started server's chunked prefill size")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args()

    folder = sgl.embedded_model_folder()
    compiler = load_compiler(folder)
    if args.url:
        asyncio.run(bench(args.url.rstrip("/"), compiler, args.repeats, args.questions, {}))
        return
    if not sgl.SGL_JAX_PYTHON.exists():
        sys.exit(f"no SGLang-JAX venv at {sgl.SGL_JAX_PYTHON}: run scripts/setup_sglang_jax.sh (or pass --url)")
    with tempfile.TemporaryDirectory(prefix="bench-sglang-") as tmp:
        served = sgl.served_folder(folder, Path(tmp) / "model")
        # Sized to the workload (sgl.sizing_flags): every branch of a request at once, the
        # longest branch plus the generated token; the native backend's cost grows with both.
        # (tags below 1,000 and question tags below 6,000: these have the longest numbers)
        longest = max(
            len(b.input_ids)
            for qtag in (None, 5999)
            for b in compiler.compile(core_request(payload(args.questions, 999, qtag))).plan.branches
        )
        context = -(-(longest + 16) // 128) * 128
        t0 = time.perf_counter()
        server = sgl.start(
            served,
            Path(tmp) / "server.log",
            timeout_s=args.startup_timeout,
            max_running=max(args.questions, 1),
            context_length=context,
            chunk=args.chunk,
        )
        print(
            f"sgl_jax ready in {time.perf_counter() - t0:.1f} s at {server.url} (context {context}, "
            f"{args.questions} running, chunk {args.chunk})",
            file=sys.stderr,
        )
        try:
            sizing = {
                "server_sizing": {
                    "max_running": max(args.questions, 1),
                    "context_length": context,
                    "chunked_prefill": args.chunk,
                }
            }
            asyncio.run(bench(server.url, compiler, args.repeats, args.questions, sizing))
        except BaseException:
            print(server.log_tail(), file=sys.stderr)
            raise
        finally:
            server.stop()


if __name__ == "__main__":
    main()
