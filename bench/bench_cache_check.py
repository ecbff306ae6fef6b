"""What checking the converted-weights cache costs at each start (issue 16, finding 10),
measured alternately in one run (best and median of `--rounds`):

- `check_s`: the size-and-SHA-256 check of every cached file alone (converted.cache_problem);
- `plain_load_s`: loading the cached folder with no check (what a start did before);
- `checked_load_s`: the warm start's load as it is now (load_model_and_tokenizer: sizes
  first, then the hashes on a thread beside the load);
- `sequential_s`: the check, then the load, one after the other (the alternative design);
- `overhead`: checked_load / plain_load (medians). One JSON line.

    .venv/bin/python bench/bench_cache_check.py [--rounds 5]

Needs a current cache (the first `make serve`, or any start, writes one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine

from openjev.config import load_settings
from openjev.engines.models import converted
from openjev.engines.models import source as model_source


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch

    source = model_source.resolve_source(None)
    cache_dir = load_settings(environ={}).served.cache_dir
    folder = model_source.gguf_cache_folder(source, cache_dir)
    if converted.cache_problem(folder) is not None:  # also warms the page cache for both
        sys.exit(f"no current cache at {folder}: start the server once first")
    check: list[float] = []
    plain: list[float] = []
    load: list[float] = []
    sequential: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        assert converted.cache_problem(folder) is None
        model, _tok = converted._load_folder(folder, torch.float32, "cpu")
        sequential.append(time.perf_counter() - t0)
        del model
        t0 = time.perf_counter()
        assert converted.cache_problem(folder) is None
        check.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model, _tok = converted._load_folder(folder, torch.float32, "cpu")
        plain.append(time.perf_counter() - t0)
        del model
        t0 = time.perf_counter()
        model, _tok, from_cache = converted.load_model_and_tokenizer(
            source, cache_dir=cache_dir, dtype=torch.float32, device="cpu"
        )
        load.append(time.perf_counter() - t0)
        assert from_cache
        del model
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    print(
        json.dumps(
            {
                "bench": "cache_check",
                "machine": machine(),
                "cache_mb": round(size / 2**20),
                "check_s": {"best": round(min(check), 3), "median": round(statistics.median(check), 3)},
                "plain_load_s": {"best": round(min(plain), 3), "median": round(statistics.median(plain), 3)},
                "checked_load_s": {"best": round(min(load), 3), "median": round(statistics.median(load), 3)},
                "sequential_s": {
                    "best": round(min(sequential), 3),
                    "median": round(statistics.median(sequential), 3),
                },
                "overhead": round(statistics.median(load) / statistics.median(plain), 2),
            }
        )
    )


if __name__ == "__main__":
    main()
