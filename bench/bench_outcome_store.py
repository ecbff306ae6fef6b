"""What keeping decisions for /v1/outcomes costs in storage: N decisions (default 100,000,
two questions each, as the recorder writes them: one batch of 512 a transaction) written
to a fresh task store under the default retention (100,000 per key), then 10% more, so the
bound is seen holding. Reported: the file's size per decision, the process's RSS growth,
write throughput, the count kept, and with outcomes posted for half of one question, how
long reading a task's outcomes takes. One JSON line.

    .venv/bin/python bench/bench_outcome_store.py [--decisions 100000]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine

from openjev.api.server.outcomes.recorder import BATCH
from openjev.api.server.outcomes.store import DecisionRecord, QuestionReading, open_outcomes
from openjev.api.server.task_store import open_store

NOUL = '{"type":"noul","instructions":"Does the customer ask for their money back?"}'
CHOICE = (
    '{"type":"choice","instructions":"Which team handles it?","criteria":{"billing":null,"shipping":null,"tech":null}}'
)
BINDING = '{"base_temperature":1.0,"fingerprint":"%s","prompt_version":"7","readout":"letters","rotations":1,"type":"%s","wording":"%s"}'


def decision(owner: str, n: int, now: float, rng: random.Random) -> DecisionRecord:
    def reading(i: int, qtype: str, options: int, body: str) -> QuestionReading:
        probs = [rng.random() + 1e-3 for _ in range(options)]
        logs = tuple(math.log(p / sum(probs)) for p in probs)
        wording = f"{qtype:0<32}"
        bound = BINDING % ("f" * 16, qtype, wording)
        return QuestionReading(i, ("refund", "team")[i], wording, body, bound, logs, "task:task_" + "0" * 24)

    return DecisionRecord(owner, f"req_{n:032x}", now, (reading(0, "noul", 2, NOUL), reading(1, "choice", 3, CHOICE)))


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=100_000)
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.sqlite3"
        open_store(path).close()
        store = open_outcomes(path)
        rss0, t0 = rss_mib(), time.perf_counter()
        total = int(args.decisions * 1.1)
        now = time.time()
        for start in range(0, total, BATCH):
            store.write([decision("alice", n, now + n * 1e-3, rng) for n in range(start, min(total, start + BATCH))])
            store.prune(["alice"], args.decisions, now - 30 * 86400)
        elapsed = time.perf_counter() - t0
        kept = store.count("alice")
        answered = [(f"req_{n:032x}", 0, n % 2) for n in range(total - kept, total, 2)]
        store.answer("alice", answered, time.time())
        t1 = time.perf_counter()
        outcomes = store.outcomes("alice", f"{'noul':0<32}", limit=1000)
        read_ms = (time.perf_counter() - t1) * 1000
        size = path.stat().st_size
        print(
            json.dumps(
                {
                    "decisions_written": total,
                    "kept": kept,
                    "retention_per_key": args.decisions,
                    "file_mib": round(size / 2**20, 1),
                    "bytes_per_decision": round(size / kept),
                    "rss_growth_mib": round(rss_mib() - rss0, 1),
                    "decisions_per_s": round(total / elapsed),
                    "outcomes_posted": len(answered),
                    "read_1000_outcomes_ms": round(read_ms, 1),
                    "read": len(outcomes),
                    **machine(),
                }
            )
        )


if __name__ == "__main__":
    main()
