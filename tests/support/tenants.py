"""Two tenants' traffic against a real server, for the fair-share bench and its live test.

The light tenant sends one small request at a time (a 10-word state, one noul question);
the heavy tenant keeps work in flight: `batches` batches of `items` short states each
(`/v1/systemone/batch`), or `singles` concurrent single requests. Every state is new (a
counter in it), so no answer comes from the prefix cache beyond the prompt's common head.
Each loop stops starting work at `until` (time.monotonic()) and reports what it saw, with
the time each decision was answered (batches are read as their NDJSON stream, item by item):
a rate over the phase counts what was answered before `until`, not the tail after it, where
a tenant still finishing its last batches has the engine to itself.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

import httpx

QUESTION = {"ship": {"type": "noul", "instructions": "Is the text about a ship?"}}
_counter = itertools.count()


def short_state(repeats: int = 1) -> str:
    """Ten words (`repeats` times that, about 15 tokens each), never sent before in this process."""
    n = next(_counter)
    return " ".join(f"Note {n}.{k}: the harbour crew loaded crates onto barge {n} today." for k in range(repeats))


@dataclass
class Tally:
    """What one tenant got: answered decisions (and when, time.monotonic()), each request's
    latency, statuses other than 200."""

    latencies_s: list[float] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=dict)
    answered_at: list[float] = field(default_factory=list)

    @property
    def decisions(self) -> int:
        return len(self.answered_at)

    def answered(self) -> None:
        self.answered_at.append(time.monotonic())

    def rate(self, start: float, until: float) -> float:
        """Decisions per second answered between `start` and `until`."""
        return sum(start <= t <= until for t in self.answered_at) / (until - start)

    def add_error(self, status: int) -> None:
        self.errors[status] = self.errors.get(status, 0) + 1


def _client(url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600)


async def light(url: str, key: str, until: float) -> Tally:
    """Serial single requests until `until`."""
    tally = Tally()
    async with _client(url, key) as client:
        while time.monotonic() < until:
            body = {"model": "jev-latest", "state": short_state(), "questions": QUESTION}
            t0 = time.perf_counter()
            r = await client.post("/v1/systemone", json=body)
            if r.status_code != 200:
                tally.add_error(r.status_code)
                await asyncio.sleep(0.05)  # a refusal is not retried at once
                continue
            tally.latencies_s.append(time.perf_counter() - t0)
            tally.answered()
    return tally


async def heavy_batches(url: str, key: str, until: float, batches: int = 2, items: int = 10, repeats: int = 1) -> Tally:
    """`batches` loops, each sending one batch of `items` new states (short_state(repeats)) at
    a time, until `until`."""
    tally = Tally()

    async def loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < until:
            body = {"questions": QUESTION, "states": [short_state(repeats) for _ in range(items)]}
            t0 = time.perf_counter()
            async with client.stream("POST", "/v1/systemone/batch", json=body) as r:
                if r.status_code != 200:
                    tally.add_error(r.status_code)
                    await r.aread()
                    await asyncio.sleep(0.05)
                    continue
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    if "answers" in item:
                        tally.answered()
                    elif "summary" not in item:
                        tally.add_error(int(item.get("status", 0)))
            tally.latencies_s.append(time.perf_counter() - t0)

    async with _client(url, key) as client:
        await asyncio.gather(*(loop(client) for _ in range(batches)))
    return tally


async def heavy_singles(url: str, key: str, until: float, singles: int = 16) -> Tally:
    """`singles` concurrent loops of single requests until `until`."""
    tallies = await asyncio.gather(*(light(url, key, until) for _ in range(singles)))
    total = Tally()
    for t in tallies:
        total.latencies_s += t.latencies_s
        total.answered_at += t.answered_at
        for status, n in t.errors.items():
            total.errors[status] = total.errors.get(status, 0) + n
    return total
