"""Send labelled items to a server and keep every answer, resumably.

Each item is sent as it is ("main"); with flips, its choice questions are sent once more
with their options rotated by one position ("flip"). Records are appended to
`results.jsonl` in the run folder as they complete, so an interrupted run resumes where
it stopped (only answered requests count as done; failed ones are tried again). The
folder's `run.json` records what the run measures; resuming a folder made for another
run is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from openjev.evals.dataset import Item, rotated_choices
from openjev.evals.metrics import Scored

RETRYABLE = {429, 503, 529}
MAX_TRIES = 8


class RunMismatch(RuntimeError):
    """The run folder holds results of a different run."""


@dataclass(frozen=True)
class RunConfig:
    """What is asked of the server. None: the server's own default."""

    readout: str | None = None
    rotations: int | None = None
    calibrated: bool = True
    flips: bool = True

    def headers(self, key: str | None = None) -> dict[str, str]:
        h = {}
        if self.readout is not None:
            h["x-openjev-readout"] = self.readout
        if self.rotations is not None:
            h["x-openjev-rotations"] = str(self.rotations)
        if not self.calibrated:
            h["x-openjev-calibration"] = "none"
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h


class ResultStore:
    def __init__(self, folder: str | Path, meta: dict[str, Any], *, restart: bool = False) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / "results.jsonl"
        meta_path = self.folder / "run.json"
        if restart:
            self.path.unlink(missing_ok=True)
        elif meta_path.exists() and self.path.exists():
            old = json.loads(meta_path.read_text())
            if old != meta:
                changed = sorted(k for k in set(old) | set(meta) if old.get(k) != meta.get(k))
                raise RunMismatch(
                    f"{self.folder} holds another run (differs in: {', '.join(changed)}); "
                    "pass --restart to start over, or choose another --out"
                )
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        self.records: dict[tuple[str, str], dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by an interruption
                self.records[(rec["id"], rec["kind"])] = rec

    def done(self, key: tuple[str, str]) -> bool:
        rec = self.records.get(key)
        return rec is not None and rec["status"] == 200

    def add(self, rec: dict) -> None:
        self.records[(rec["id"], rec["kind"])] = rec
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


async def _send(
    client: httpx.AsyncClient, body: dict, headers: dict[str, str]
) -> tuple[httpx.Response | None, str | None, float]:
    """(response, transport error, latency ms of the last try); retries overload and outages."""
    for attempt in range(MAX_TRIES):
        t0 = time.perf_counter()
        try:
            r = await client.post("/v1/systemone", json=body, headers=headers)
        except httpx.TransportError as e:
            if attempt == MAX_TRIES - 1:
                return None, f"{type(e).__name__}: {e}", (time.perf_counter() - t0) * 1000
            await asyncio.sleep(min(2**attempt, 10))
            continue
        latency = (time.perf_counter() - t0) * 1000
        if r.status_code in RETRYABLE and attempt < MAX_TRIES - 1:
            await asyncio.sleep(float(r.headers.get("retry-after", "1") or 1))
            continue
        return r, None, latency
    raise AssertionError("unreachable")


async def run_items(
    url: str,
    items: Sequence[Item],
    config: RunConfig,
    store: ResultStore,
    *,
    concurrency: int = 4,
    key: str | None = None,
    timeout_s: float = 600.0,
    progress: bool = True,
) -> None:
    """Send every item (and its flip) not yet answered in `store`."""
    jobs: list[tuple[str, str, dict]] = []
    for item in items:
        jobs.append((item.id, "main", item.request))
        flip = rotated_choices(item) if config.flips else None
        if flip is not None:
            jobs.append((item.id, "flip", flip))
    todo = [j for j in jobs if not store.done((j[0], j[1]))]
    headers = config.headers(key)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), unit="req", desc="eval", dynamic_ncols=True)
    sem = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, item_id: str, kind: str, body: dict) -> None:
        async with sem:
            r, error, latency = await _send(client, body, headers)
        store.add(_record(item_id, kind, r, error, latency))
        if bar is not None:
            bar.update(1)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    try:
        async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s, limits=limits) as client:
            await asyncio.gather(*(one(client, *job) for job in todo))
    finally:
        if bar is not None:
            bar.close()


def _record(item_id: str, kind: str, r: httpx.Response | None, error: str | None, latency: float) -> dict[str, Any]:
    """One answer's record for the store: its answers and usage, or its error."""
    rec: dict[str, Any] = {"id": item_id, "kind": kind, "latency_ms": round(latency, 2)}
    if r is None:
        rec.update(status=0, error=error)
        return rec
    rec["status"] = r.status_code
    payload: Any = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
    if r.status_code == 200:
        rec.update(
            answers=payload["answers"],
            usage=payload["usage"],
            readout=r.headers.get("x-openjev-readout"),
            calibration=r.headers.get("x-openjev-calibration"),
        )
    else:
        rec["error"] = payload
    return rec


def score(items: Sequence[Item], store: ResultStore) -> tuple[list[Scored], dict[str, Any]]:
    """Scored questions (answered items only) and facts about the run (failures, tokens, latency)."""
    scored: list[Scored] = []
    failed, latencies, computed, prompt, distinct, mass, abstained = [], [], [], [], [], [], []
    readouts, calibrations = set(), set()
    for item in items:
        main = store.records.get((item.id, "main"))
        if main is None or main["status"] != 200:
            failed.append(
                {
                    "id": item.id,
                    "status": main["status"] if main else None,
                    "error": main.get("error") if main else "not sent",
                }
            )
            continue
        flip = store.records.get((item.id, "flip"))
        flip_answers = flip["answers"] if flip is not None and flip["status"] == 200 else None
        latencies.append(main["latency_ms"])
        usage = main["usage"]
        distinct.append(usage["input_tokens"])
        prompt.append(usage.get("x_prompt_tokens", usage["input_tokens"]))
        if "x_computed_tokens" in usage:
            computed.append(usage["x_computed_tokens"])
        readouts.add(main.get("readout"))
        calibrations.add(main.get("calibration"))
        for qid, expected in item.expected.items():
            q = item.request["questions"][qid]
            a = main["answers"][qid]
            mass.append(a.get("x_label_mass", float("nan")))
            declined = bool(a.get("x_abstain", False))  # the server's abstain rule (core/abstain.py)
            abstained.append(declined)
            scored.append(_scored(q, a, expected, None if flip_answers is None else (flip_answers, qid), declined))
    facts = {
        "items": len(items),
        "items_failed": len(failed),
        "failures": failed[:20],
        "readout": sorted(r for r in readouts if r) or None,
        "calibration": sorted(c for c in calibrations if c) or None,
        "latency_ms_p50": _quantile(latencies, 0.5),
        "latency_ms_p90": _quantile(latencies, 0.9),
        "tokens_distinct_per_request": _mean(distinct),
        "tokens_computed_per_request": _mean(computed),
        "tokens_prompt_per_request": _mean(prompt),
        "label_mass_mean": _mean([m for m in mass if m == m]),
        "abstained_share": _mean([float(x) for x in abstained]),
    }
    return scored, facts


def _scored(q: dict, a: dict, expected: Any, flip: tuple[dict, str] | None, declined: bool) -> Scored:
    """One answered question against its expected answer (`flip`: the flipped run's answers
    and the question's id, read for a choice only)."""
    if q["type"] == "noul":
        return Scored("noul", (a["noul"], 1.0 - a["noul"]), 0 if expected else 1, abstained=declined)
    if q["type"] == "choice":
        names = list(q["criteria"])
        flipped = None if flip is None else flip[0][flip[1]]["choice"] != a["choice"]
        probs = tuple(a["probabilities"][n] for n in names)
        return Scored("choice", probs, names.index(expected), flipped, abstained=declined)
    probs = tuple(a["probabilities"][str(i)] for i in range(len(q["criteria"])))
    return Scored("score", probs, int(expected), abstained=declined)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _quantile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_meta(data: Sequence[str], target: str, config: RunConfig) -> dict[str, Any]:
    import hashlib

    digest = hashlib.sha256()
    for path in data:  # a held-out source's name stands for its pinned package and subsample
        digest.update(Path(path).read_bytes() if Path(path).is_file() else str(path).encode())
    return {"data": [str(p) for p in data], "data_sha256": digest.hexdigest()[:16], "target": target, **asdict(config)}
