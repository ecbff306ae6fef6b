"""Per-key limits held by the fleet, not by each replica (issue 47): two real openjev
replicas on loopback sharing a real redis-server; every line of the issue's deliverable 5.

The issue asks for the limits to hold "over a minute"; these windows are a few seconds
from a full bucket: the same buckets (a minute's burst, refilled at the limit per minute),
so what a key may take in W seconds is limit x (1 + W / 60), within 10 %."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.api_tier.conftest import BODY, auth, load

pytestmark = pytest.mark.skipif(
    os.environ.get("OPENJEV_API_TIER") != "1", reason="the API tier suite runs with `make test-api-tier`"
)


def promised(per_min: int, seconds: float) -> float:
    return per_min * (1 + seconds / 60)


def within_10_percent(got: float, want: float) -> bool:
    return 0.9 * want <= got <= 1.1 * want


async def test_requests_per_min_hold_across_replicas(fleet):
    a, b = fleet.start(2)
    t0 = time.monotonic()
    statuses, _ = await load([a.url, b.url], "rpm-key", seconds=6, concurrency=8)
    elapsed = time.monotonic() - t0
    assert set(statuses) <= {200, 429}, statuses
    want = promised(60, elapsed)
    print(f"requests/min across 2 replicas: {statuses[200]} admitted in {elapsed:.1f} s, {want:.1f} promised")
    assert within_10_percent(statuses[200], want), f"{statuses[200]} admitted, {want:.0f} promised: {statuses}"


async def test_tokens_per_min_hold_across_replicas(fleet, redis_server):
    a, b = fleet.start(2)
    async with httpx.AsyncClient(timeout=30) as client:
        first = await client.post(a.url + "/v1/systemone", json=BODY, headers=auth("tpm-key"))
    assert first.status_code == 200, first.text
    level = float(redis_server.command("HGET", "openjev:bucket:tpm:tokens_per_min:3000", "l").split(b"\r\n")[1])
    tokens = round(3000 - level)  # what one request costs: its distinct tokens
    assert 20 < tokens < 1000, tokens
    t0 = time.monotonic()
    statuses, _ = await load([a.url, b.url], "tpm-key", seconds=6, concurrency=8)
    elapsed = time.monotonic() - t0
    assert set(statuses) <= {200, 429}, statuses
    taken = (statuses[200] + 1) * tokens
    want = promised(3000, elapsed)
    print(
        f"tokens/min across 2 replicas: {taken} admitted in {elapsed:.1f} s ({tokens} a request), {want:.0f} promised"
    )
    assert within_10_percent(taken, want), f"{taken} tokens admitted, {want:.0f} promised: {statuses}"


async def _in_flight(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(url + "/metrics")).text
    found = re.search(r"^openjev_evaluations_in_flight ([0-9.]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_flooding_key_takes_no_more_than_its_in_flight_share_of_the_fleet(fleet, slow_engine_server):
    a, b = fleet.start(2, engine=slow_engine_server)  # --max-in-flight 4: a key's share is 2, fleet-wide
    most = 0.0
    done = asyncio.Event()

    bob_busy = False

    async def watch() -> None:  # the replicas' evaluations in flight, counted while bob has none
        nonlocal most
        async with httpx.AsyncClient(timeout=10) as client:
            while not done.is_set():
                busy_before = bob_busy
                seen = sum(await asyncio.gather(_in_flight(client, a.url), _in_flight(client, b.url)))
                if not (busy_before or bob_busy):
                    most = max(most, seen)
                await asyncio.sleep(0.02)

    async def bob() -> list[int]:
        nonlocal bob_busy
        await asyncio.sleep(1)
        codes = []
        async with httpx.AsyncClient(timeout=30) as client:
            for url in (a.url, b.url):
                bob_busy = True
                codes.append((await client.post(url + "/v1/systemone", json=BODY, headers=auth("bob-key"))).status_code)
                await asyncio.sleep(0.1)  # until the replica's count has let go of it
                bob_busy = False
        return codes

    async def flood():
        try:
            return await load([a.url, b.url], "flood-key", seconds=3, concurrency=12)
        finally:
            done.set()

    (statuses, _), _, bobs = await asyncio.gather(flood(), watch(), bob())
    assert set(statuses) <= {200, 429} and statuses[200] > 0, statuses
    assert most == 2, f"the flooding key had {most} evaluations in flight across the fleet (its share: 2)"
    assert bobs == [200, 200], bobs  # another key is served on both replicas meanwhile


async def test_a_refused_body_on_one_replica_is_charged_to_the_key_on_the_other(fleet):
    a, b = fleet.start(2)
    bomb = {**BODY, "state": "7 " * 40_000}  # past the 32,768 tokens of a branch
    async with httpx.AsyncClient(timeout=60) as client:
        refused = await client.post(a.url + "/v1/systemone", json=bomb, headers=auth("tpm-key"))
        assert refused.status_code == 422, refused.text[:300]
        after = await client.post(b.url + "/v1/systemone", json=BODY, headers=auth("tpm-key"))
        assert after.status_code == 429 and "in debt" in after.text, after.text[:300]
        assert 1 <= int(after.headers["retry-after"]) <= 61
        other = await client.post(b.url + "/v1/systemone", json=BODY, headers=auth("bob-key"))
        assert other.status_code == 200, other.text[:300]


async def test_a_sighupd_keys_file_reaches_every_replica(fleet):
    a, b = fleet.start(2)
    new = fleet.keys_file.read_text() + "dave:dave-key requests_per_min=5\n"
    staged = Path(str(fleet.keys_file) + ".new")
    staged.write_text(new)
    async with httpx.AsyncClient(timeout=30) as client:
        for url in (a.url, b.url):
            r = await client.post(url + "/v1/systemone", json=BODY, headers=auth("dave-key"))
            assert r.status_code == 401
        os.replace(staged, fleet.keys_file)  # written whole, then renamed into place; then SIGHUP each
        fleet.hangup()
        for url in (a.url, b.url):
            for _ in range(100):
                r = await client.get(url + "/v1/limits", headers=auth("dave-key"))
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert r.status_code == 200 and r.json()["key_requests_per_min"] == 5, r.text
        codes = [
            (await client.post(url + "/v1/systemone", json=BODY, headers=auth("dave-key"))).status_code
            for url in (a.url, b.url) * 4
        ]
    assert codes.count(200) == 5 and codes.count(429) == 3, codes  # dave's 5 a minute, fleet-wide


async def _limits(url: str, key: str) -> dict:
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(url + "/v1/limits", headers=auth(key))
        assert r.status_code == 200, r.text
        return r.json()["limits_store"]


@pytest.mark.parametrize("mode", ["local", "closed", "open"])
async def test_redis_killed_mid_load_the_mode_holds_and_restarted_the_fleet_rejoins(fleet, redis_server, mode):
    a, b = fleet.start(2, "--limits-redis-mode", mode, "--limits-redis-timeout-ms", "100")
    urls = [a.url, b.url]
    before, _ = await load(urls, "rpm-key", seconds=1.5, concurrency=4)
    assert set(before) <= {200, 429}, before
    redis_server.kill()  # mid-load: a crash, no goodbye
    t0 = time.monotonic()
    during, slowest = await load(urls, "rpm-key", seconds=3, concurrency=4)
    outage = time.monotonic() - t0
    print(f"mode {mode}, Redis away {outage:.1f} s: {dict(during)}, slowest answer {slowest * 1000:.0f} ms")
    assert slowest < 2, f"an answer took {slowest:.1f} s while Redis was away"  # nothing hangs
    assert await _limits(a.url, "bob-key") == {"backend": "redis", "mode": mode, "reachable": False}
    async with httpx.AsyncClient(timeout=10) as client:
        health = (await client.get(b.url + "/health", headers=auth("bob-key"))).json()
        assert health["limits_store"]["reachable"] is False, health
        assert (await client.get(b.url + "/health")).json().get("limits_store") is None  # operators only
        assert re.search(r"^openjev_limits_store_up 0\.0$", (await client.get(a.url + "/metrics")).text, re.M)
    if mode == "closed":  # an outage of ours: 503 with Retry-After (load() checks the header)
        assert set(during) <= {429, 503} and during[503] > 0, during
    elif mode == "local":  # each replica holds the key to its share: 60 / 2
        assert set(during) <= {200, 429}, during
        assert during[200] <= 1.1 * 2 * promised(30, outage), during
    else:  # open: per-key limits off until Redis answers
        assert set(during) <= {200, 429} and during[200] > 1.1 * 2 * promised(30, outage), during
    redis_server.start()  # back, empty (no persistence): the fleet's buckets start full
    await asyncio.sleep(1.2)  # one call a second tries Redis again: the next one on each replica rejoins
    async with httpx.AsyncClient(timeout=10) as client:
        for url in urls:
            assert (await client.post(url + "/v1/systemone", json=BODY, headers=auth("bob-key"))).status_code == 200
    t0 = time.monotonic()
    after, _ = await load(urls, "rpm-key", seconds=3, concurrency=4)
    assert set(after) <= {200, 429}, after
    print(f"mode {mode}, Redis back: {dict(after)} in {time.monotonic() - t0:.1f} s")
    assert within_10_percent(after[200], promised(60, time.monotonic() - t0)), after
    assert redis_server.command("EXISTS", "openjev:bucket:rpm:requests_per_min:60").startswith(b":1")
    for server in (a, b):
        assert (await _limits(server.url, "bob-key"))["reachable"] is True
        log = fleet.log(server)
        assert log.count("unreachable") == 1 and log.count("answers again") == 1, log[-3000:]


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def test_two_workers_share_one_port_one_set_of_limits_and_the_keys_file(fleet):
    (server,) = fleet.start(1, "--workers", "2")
    workers = _children(server.process.pid)
    assert len(workers) == 2, workers

    async def one(url: str, key: str) -> int:
        async with httpx.AsyncClient(timeout=30) as client:  # a connection each: the kernel spreads them
            return (await client.post(url + "/v1/systemone", json=BODY, headers=auth(key))).status_code

    t0 = time.monotonic()
    codes = await asyncio.gather(*(one(server.url, "rpm-key") for _ in range(90)))
    assert set(codes) <= {200, 429}, codes
    assert within_10_percent(codes.count(200), promised(60, time.monotonic() - t0)), codes
    fleet.keys_file.write_text(fleet.keys_file.read_text() + "erin:erin-key\n")
    os.kill(server.process.pid, signal.SIGHUP)  # the parent passes it to each worker
    await asyncio.sleep(1)
    codes = await asyncio.gather(*(one(server.url, "erin-key") for _ in range(16)))
    assert codes == [200] * 16, codes
    assert _children(server.process.pid) == workers  # SIGHUP reloads, it does not restart
