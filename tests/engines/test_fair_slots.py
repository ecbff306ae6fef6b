"""The HTTP engines' call slots (engines/http/slots.py): the cap, and the keys' fair order of
the calls that wait for a slot."""

import asyncio

import pytest

from openjev.core.types import Share
from openjev.engines.http.slots import FairSlots


async def _call(
    slots: FairSlots, share: Share, tokens: int, order: list[str], release: asyncio.Event, name: str = ""
) -> None:
    async with slots.hold(tokens, share):
        order.append(name or share.tenant)
        await release.wait()


def test_calls_beyond_the_cap_wait_and_go_in_arrival_order_with_one_key():
    async def scenario() -> tuple[list[str], int, int]:
        slots, order, release = FairSlots(2), [], asyncio.Event()
        tasks = []
        for k in range(5):  # one after the other: arrival order is creation order
            tasks.append(asyncio.create_task(_call(slots, Share(), 10 * (5 - k), order, release, str(k))))
            await asyncio.sleep(0.001)
        held, waiting = slots.held, slots.waiting
        release.set()
        await asyncio.gather(*tasks)
        return order, held, waiting

    order, held, waiting = asyncio.run(scenario())
    assert (held, waiting) == (2, 3)
    assert order == ["0", "1", "2", "3", "4"]  # not the smallest call first: no keys, today's order


def test_a_light_keys_call_goes_ahead_of_a_heavy_keys_waiting_calls():
    async def scenario() -> list[str]:
        slots, order = FairSlots(1), []
        gates = [asyncio.Event() for _ in range(8)]
        heavy, light = Share("heavy"), Share("light")
        tasks = [asyncio.create_task(_call(slots, heavy, 100, order, gates[k])) for k in range(6)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(_call(slots, light, 100, order, gates[6])))
        await asyncio.sleep(0.01)
        for gate in gates:  # each call ends in turn, freeing the one slot
            gate.set()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(scenario())
    assert order.index("light") == 1, order  # after the call under way, ahead of five queued before it


def test_a_cancelled_waiter_leaves_no_slot_behind():
    async def scenario() -> tuple[int, int]:
        slots, order, release = FairSlots(1), [], asyncio.Event()
        first = asyncio.create_task(_call(slots, Share("a"), 1, order, release))
        await asyncio.sleep(0.01)
        waiter = asyncio.create_task(_call(slots, Share("b"), 1, order, release))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await first
        await _call(slots, Share("c"), 1, order, release)  # the slot is free again
        return slots.held, len(order)

    assert asyncio.run(scenario()) == (0, 2)
