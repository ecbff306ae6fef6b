"""The queue-wait refusal (529) counts what is ahead of a request in the keys' fair order
(api/identity/fair_queue.py): another key's long request in flight does not make a light
key's small one look late, while the long key's own next request is refused as before."""

from __future__ import annotations

import asyncio

from openjev.api.identity.fair_queue import FairQueue
from openjev.core.types import Share
from tests.api.conftest import running_app
from tests.api.test_systemone import VALID
from tests.support.fakes import FakeEngine

HEAVY, LIGHT = Share("heavy"), Share("light", weight=2)


def test_ahead_is_the_keys_own_work_and_each_other_keys_share_of_it():
    queue = FairQueue()
    assert queue.ahead(LIGHT, 100) == 100  # nothing in flight
    queue.add(HEAVY, 6000)
    assert queue.ahead(Share("heavy"), 100) == 6100  # its own key: all of it
    assert queue.ahead(Share("other"), 100) == 200  # weight 1 each: as much again of the heavy key's
    assert queue.ahead(LIGHT, 100) == 150  # weight 2 against 1: half as much
    queue.add(Share("small"), 30)
    assert queue.ahead(Share("other"), 100) == 100 + 100 + 30  # a key with less than its share: all of it
    queue.add(HEAVY, -6000)
    assert queue.ahead(Share("other"), 100) == 130


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_a_light_keys_request_is_admitted_beside_a_heavy_keys_long_one():
    engine = FakeEngine(delay_s=0.3)
    long = {**VALID, "state": VALID["state"] + " 7" * 2000}
    async with running_app(engine, max_queue_wait_s=1.0, api_keys=("heavy-key", "light-key")) as (client, _):
        assert (await client.post("/v1/systemone", json=VALID, headers=_auth("light-key"))).status_code == 200
        rate = client._transport.app.state.ops.gate.rate.per_second()  # a small request's tokens in 0.3 s
        heavy = asyncio.create_task(client.post("/v1/systemone", json=long, headers=_auth("heavy-key")))
        gate = client._transport.app.state.ops.gate
        while gate.in_flight_tokens == 0:
            await asyncio.sleep(0.01)
        assert gate.in_flight_tokens / rate > 1.0  # by the tokens in flight alone, past the wait
        light, again = await asyncio.gather(
            client.post("/v1/systemone", json=VALID, headers=_auth("light-key")),
            client.post("/v1/systemone", json=long, headers=_auth("heavy-key")),
        )
        assert (await heavy).status_code == 200
    assert light.status_code == 200, light.text
    assert again.status_code == 529 and "queue is too long" in again.json()["detail"]["message"]
