"""What each submission of a cold 8-branch plan computes on the real SGLang 0.5.23 (PyTorch, CPU).

One server on the tiny random model (tests/sglang/server.py `tiny_model_folder`: the forward
costs almost nothing), then, after `/flush_cache` each, the same plan shape sent as one batched
prefill-only `/generate` (`all`), the shared prefix alone and then one batch (`warmup`), one
branch and then one batch of the rest (`staged`), one batch generating a token, and 8 calls of
one branch each (openjev's calls before batching, `all` and `staged`). Each plan: a ~1,000-token
state of random ids and 8 questions of 60. Prints JSON lines: calls, prompt, cached and computed
tokens (the server's own counts), and wall time.

    .venv/bin/python bench/bench_sglang_batch.py [--chunk 1024] [--policy lpm] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for tests.*

import httpx
from tests.sglang import server as sgl

LABELS = [330, 331, 332]


def ids(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1000, 40000) for _ in range(n)]


def body(seqs: list[list[int]], new_tokens: int, batched: bool) -> dict:
    rids = [uuid.uuid4().hex for _ in seqs]
    b = {
        "input_ids": seqs if batched else seqs[0],
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": -1,
        "token_ids_logprob": [LABELS] * len(seqs) if batched else LABELS,
        "rid": rids if batched else rids[0],
    }
    return b


def post(client: httpx.Client, b: dict) -> list[dict]:
    r = client.post("/generate", json=b)
    r.raise_for_status()
    out = r.json()
    return out if isinstance(out, list) else [out]


def run(client: httpx.Client, name: str, seqs: list[list[int]], state: list[int]) -> tuple[list[dict], int]:
    """(every item's reply, calls) of one way of sending `seqs`."""
    if name == "batch_all":
        return post(client, body(seqs, 0, True)), 1
    if name == "batch_warmup":
        return post(client, body([state], 0, True)) + post(client, body(seqs, 0, True)), 2
    if name == "batch_staged":
        return post(client, body(seqs[:1], 0, True)) + post(client, body(seqs[1:], 0, True)), 2
    if name == "batch_new1":
        return post(client, body(seqs, 1, True)), 1
    first, rest = ([], seqs) if name == "per_branch_all" else (post(client, body(seqs[:1], 1, False)), seqs[1:])
    with ThreadPoolExecutor(len(rest)) as pool:
        return first + [o for out in pool.map(lambda s: post(client, body([s], 1, False)), rest) for o in out], 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunk", type=int, default=1024, help="the server's --chunked-prefill-size")
    parser.add_argument("--policy", default=None, help="the server's --schedule-policy (default: its own, fcfs)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-sglang-batch-"))
    kind = sgl.KINDS["torch"]
    if args.policy:
        sgl.KINDS["torch"] = replace(kind, flags=(*kind.flags, "--schedule-policy", args.policy))
    folder = sgl.tiny_model_folder(root / "tiny")
    server = sgl.start(folder, root / "sglang.log", kind="torch", max_running=8, context_length=2048, chunk=args.chunk)
    head = {"chunk": args.chunk, "policy": args.policy or "fcfs (default)"}
    try:
        client = httpx.Client(base_url=server.url, timeout=600)
        names = ("batch_all", "batch_warmup", "batch_staged", "batch_new1", "per_branch_all", "per_branch_staged")
        for rep in range(args.repeats):
            for k, name in enumerate(names):
                tag = 1000 * rep + k
                state = ids(tag, 1000)
                seqs = [state + ids(tag * 100 + i + 1, 60) for i in range(8)]
                assert sgl.flush_cache(server.url)
                t0 = time.perf_counter()
                outs, calls = run(client, name, seqs, state)
                ms = (time.perf_counter() - t0) * 1000
                prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
                cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
                row = {"repeat": rep, "sent": name, "calls": calls, "prompt": prompt, "cached": cached}
                print(json.dumps({**head, **row, "computed": prompt - cached, "ms": round(ms)}), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
