"""What a stalled or restarted Redis leaves behind (docs/scale-out.md, "While Redis is away"
and "When Redis restarts"): two real openjev replicas on loopback sharing a real
redis-server. A Redis stopped (SIGSTOP) for 3 s while a key sends small decisions, then
resumed (SIGCONT), leaves none of the key's in-flight slots taken, so its next decision is
200 on both replicas within 5 s; a Redis restarted forgets every debt unless it keeps an
append-only file."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from tests.api_tier.conftest import BODY, auth, load
from tests.support.redis_server import RedisServer, require_redis

pytestmark = pytest.mark.skipif(
    os.environ.get("OPENJEV_API_TIER") != "1", reason="the API tier suite runs with `make test-api-tier`"
)

STALL_S = 3.0
WITHIN_S = 5.0


async def _reachable(client: httpx.AsyncClient, url: str, key: str) -> bool:
    r = await client.get(url + "/v1/limits", headers=auth(key))
    return bool(r.json()["limits_store"]["reachable"])


async def _next_decision(client: httpx.AsyncClient, url: str, key: str, since: float) -> tuple[int, float, list[int]]:
    """Decisions until one is answered by a replica that has rejoined Redis (the first ones
    after a stall may meet its mode: 503 in closed, a local share in local), then one more:
    its status, the seconds from `since` to its answer, and the statuses before it."""
    before: list[int] = []
    while time.monotonic() - since < WITHIN_S:
        r = await client.post(url + "/v1/systemone", json=BODY, headers=auth(key))
        if r.status_code == 200 and await _reachable(client, url, key):
            break
        before.append(r.status_code)
        await asyncio.sleep(0.2)
    r = await client.post(url + "/v1/systemone", json=BODY, headers=auth(key))
    return r.status_code, time.monotonic() - since, before


@pytest.mark.parametrize("mode", ["local", "closed"])
async def test_redis_stalled_then_resumed_leaves_no_in_flight_slot_behind(fleet, redis_server, mode):
    # --max-in-flight 4: the key's share is 2 fleet-wide; a share left taken would make its
    # next decision wait the queue (10 s here, past WITHIN_S) for a 429
    extra = ("--limits-redis-mode", mode, "--limits-redis-timeout-ms", "250", "--max-queue-wait-s", "10")
    a, b = fleet.start(2, *extra)
    urls = [a.url, b.url]

    async def stall() -> float:
        await asyncio.sleep(1.0)
        redis_server.pause()
        await asyncio.sleep(STALL_S)
        redis_server.resume()
        return time.monotonic()

    (during, _), resumed = await asyncio.gather(load(urls, "flood-key", 1.0 + STALL_S, 8), stall())
    print(f"mode {mode}, Redis stopped {STALL_S:.0f} s under load: {dict(during)}")
    assert set(during) <= {200, 429, 503}, during
    async with httpx.AsyncClient(timeout=30) as client:
        for url in urls:
            status, after, before = await _next_decision(client, url, "flood-key", resumed)
            print(f"  {url}: next decision {status}, {after:.2f} s after SIGCONT (before it: {before})")
            assert status == 200 and after < WITHIN_S, (status, after, before)
            assert set(before) <= {200, 503}, before  # never a 429 for a share held by no one
    leases = redis_server.command("ZCARD", "openjev:inflight:flood")
    assert leases == b":0\r\n", f"leases left in Redis with nothing in flight: {leases!r}"
    for server in (a, b):
        assert "unreachable" in fleet.log(server), "the stall was not seen"


async def _rejoined(client: httpx.AsyncClient, urls: list[str]) -> None:
    """Each replica's next call to Redis after its restart (one a second while away)."""
    deadline = time.monotonic() + 10
    for url in urls:
        while not await _reachable(client, url, "rpm-key"):
            assert time.monotonic() < deadline, f"{url} did not rejoin Redis"
            await client.post(url + "/v1/systemone", json=BODY, headers=auth("rpm-key"))
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("append_only", [False, True], ids=["no-persistence", "appendonly"])
async def test_a_debt_after_redis_restarts_is_kept_only_by_an_append_only_file(fleet, tmp_path, append_only):
    store = RedisServer(require_redis(), str(tmp_path) if append_only else None)
    store.start()
    fleet.redis_url = store.url
    try:
        a, b = fleet.start(2)
        bomb = {**BODY, "state": "7 " * 40_000}  # refused past a branch's tokens: the key in debt
        async with httpx.AsyncClient(timeout=60) as client:
            refused = await client.post(a.url + "/v1/systemone", json=bomb, headers=auth("tpm-key"))
            assert refused.status_code == 422, refused.text[:300]
            await asyncio.sleep(1.5)  # appendfsync everysec: a crash loses at most the last second
            store.kill()  # a crash, then back on the same port
            store.start()
            await _rejoined(client, [a.url, b.url])
            after = [await client.post(u + "/v1/systemone", json=BODY, headers=auth("tpm-key")) for u in (a.url, b.url)]
        codes = [r.status_code for r in after]
        print(f"append_only={append_only}: the key in debt after Redis restarted -> {codes}")
        if append_only:
            assert codes == [429, 429] and all("in debt" in r.text for r in after), [r.text[:200] for r in after]
        else:  # what a restart without persistence costs: the debt forgotten at once
            assert codes == [200, 200], [r.text[:200] for r in after]
    finally:
        store.stop()
