"""A light key's share of the engine beside a heavy key's batches (issue 50), on a real
`openjev serve` with the embedded model and two keys.

The light key sends one small request at a time; the heavy key keeps two batches of 10
states of about 250 tokens in flight (its 8 in-flight slots full, a round's worth of work
and more). Measured in alternating phases (the machine's load drifts), as the ratio of the
light key's p50 latency beside the heavy key to its p50 alone: in arrival order its request
waits for the heavy key's full rounds (2,048 tokens each); in the keys' fair order
(engines/fair_share.py) for about one quantum of the heavy key's tokens. Heavy: run under
the shared lock (`flock /tmp/openjev-heavy.lock`).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from tests.integration.conftest import start_server, stop_server
from tests.support.tenants import Tally, heavy_batches, light

KEYS = "light:light-key-0001\nheavy:heavy-key-0002\n"
LIGHT, HEAVY = "light-key-0001", "heavy-key-0002"
# The light key's p50 beside the heavy key, over its p50 alone, at most this: 4.1x in the
# fair order on a loaded 2-core CPU, 18.9x in arrival order (docs/operations.md).
MAX_SLOWDOWN = 10.0


@pytest.fixture(scope="module")
def two_keys(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fair")
    (tmp / "keys").write_text(KEYS)
    server = start_server(tmp, "--api-keys-file", str(tmp / "keys"))
    yield server
    stop_server(server)


async def _phase(url: str, seconds: float, heavy: bool) -> tuple[Tally, Tally | None]:
    """The light key's serial requests for `seconds`, beside the heavy key's batches (started
    2 s before, so the light key meets them in full) or alone."""
    busy = None
    if heavy:
        busy = asyncio.create_task(heavy_batches(url, HEAVY, time.monotonic() + seconds + 2, repeats=16))
        await asyncio.sleep(2)
    tally = await light(url, LIGHT, time.monotonic() + seconds)
    return tally, (await busy if busy else None)


def test_a_light_key_keeps_its_share_beside_a_heavy_keys_batches(two_keys):
    asyncio.run(_phase(two_keys.url, 3, heavy=False))  # warm-up: first forwards are slow
    alone: list[float] = []
    beside: list[float] = []
    for _ in range(2):
        solo, _ = asyncio.run(_phase(two_keys.url, 8, heavy=False))
        shared, heavy = asyncio.run(_phase(two_keys.url, 14, heavy=True))
        assert not solo.errors and not shared.errors and heavy and not heavy.errors  # no 529, no 4xx
        assert heavy.decisions > 0 and shared.decisions > 0
        alone += solo.latencies_s
        beside += shared.latencies_s
    slowdown = statistics.median(beside) / statistics.median(alone)
    print(f"light p50 alone {statistics.median(alone):.3f} s, beside the heavy key {statistics.median(beside):.3f} s")
    assert slowdown <= MAX_SLOWDOWN, f"the light key's p50 is {slowdown:.1f}x its p50 alone"
