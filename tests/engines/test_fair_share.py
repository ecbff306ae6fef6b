"""The per-key fair order (engines/fair_share.py): which waiting items go next, for given
queues, and the shares keys get over many rounds or turns."""

import pytest

from openjev.core.types import Share
from openjev.engines.fair_share import FairRounds, FairTurns, Want, in_order

LIGHT, HEAVY = Share("light"), Share("heavy")


def _wants(*spec: tuple[Share, int, int]) -> list[Want]:
    """(share, items, tokens each), concatenated in queue order."""
    return [Want(share, tokens) for share, n, tokens in spec for _ in range(n)]


def test_one_key_or_none_keeps_todays_round():
    wants = _wants((Share(), 3, 100), (Share(), 1, 900), (Share(), 2, 100))
    assert FairRounds().pick(wants, budget=600) == in_order(wants, 600) == [0, 1, 2, 4, 5]
    assert FairRounds().pick(_wants((HEAVY, 30, 64)), budget=2048) == list(range(30))  # 32 would fit; 30 wait
    assert in_order(_wants((Share(), 1, 3000)), 2048) == [0]  # the first goes, cut by the caller


def test_a_light_key_goes_in_the_next_round_behind_a_long_heavy_queue():
    wants = _wants((HEAVY, 20, 64), (LIGHT, 1, 80))
    picked = FairRounds(quantum=256).pick(wants, budget=2048)
    assert 20 in picked  # the light key's request, queued last
    assert [i for i in picked if i < 20] == [0, 1, 2, 3]  # the heavy key: its quantum, in queue order
    # without the fair order the round is the heavy key's whole queue, the light key's request after it
    assert in_order(wants, 2048) == list(range(21))


def test_leftover_credit_carries_while_a_key_waits_and_is_dropped_when_it_empties():
    rounds = FairRounds(quantum=100)
    wants = _wants((HEAVY, 4, 60), (LIGHT, 1, 30))
    assert sorted(rounds.pick(wants, budget=2048)) == [0, 4]  # 100 each: heavy takes one 60-token item
    # heavy kept 40 of its credit: next round it takes two 60-token items (140 >= 120)
    second = rounds.pick(_wants((HEAVY, 3, 60), (LIGHT, 1, 30)), budget=2048)
    assert sorted(second) == [0, 1, 3]
    # light emptied its queue each round: nothing banked, so a long absence earns no burst
    third = rounds.pick(_wants((HEAVY, 1, 60), (LIGHT, 5, 30)), budget=2048)
    assert sorted(third) == [0, 1, 2, 3]  # light: 100 credit, three 30-token items


def test_items_longer_than_a_quantum_still_run():
    rounds = FairRounds(quantum=64)
    wants = _wants((HEAVY, 2, 512), (LIGHT, 2, 512))
    picked = rounds.pick(wants, budget=2048)
    assert sorted(picked) == [0, 2]  # rounds in which nothing fits are skipped, not run empty


def _saturated_shares(heavy_weight: int, light_weight: int, rounds: int = 200) -> tuple[int, int]:
    """Tokens each key gets over `rounds` rounds with both always having 20 items waiting."""
    a, b = Share("a", heavy_weight), Share("b", light_weight)
    fair = FairRounds(quantum=128)
    got = {"a": 0, "b": 0}
    for _ in range(rounds):
        wants = _wants((a, 20, 48), (b, 20, 48))
        for i in fair.pick(wants, budget=4096):
            got[wants[i].share.tenant] += wants[i].tokens
    return got["a"], got["b"]


@pytest.mark.parametrize("weights", [(1, 1), (2, 1), (3, 1)])
def test_saturated_keys_get_tokens_in_proportion_to_their_weights(weights):
    a, b = _saturated_shares(*weights)
    assert a / b == pytest.approx(weights[0] / weights[1], rel=0.05)


def test_the_budget_still_bounds_a_round_of_many_keys():
    wants = [Want(Share(f"k{i}"), 200) for i in range(20)]
    picked = FairRounds(quantum=256).pick(wants, budget=1000)
    assert sum(wants[i].tokens for i in picked) <= 1000 and len(picked) == 5
    again = FairRounds(quantum=256)
    firsts = {again.pick(wants, budget=1000)[0] for _ in range(20)}
    assert len(firsts) > 1  # where the budget binds, the first key turns


# ---- one item at a time


def test_turns_with_one_key_are_queue_order():
    turns = FairTurns()
    assert turns.choose(_wants((HEAVY, 5, 10))) == 0
    with pytest.raises(ValueError, match="nothing is waiting"):
        turns.choose([])


def test_turns_serve_the_least_served_key_first():
    turns = FairTurns()
    queue = _wants((HEAVY, 8, 100))
    served = [queue.pop(turns.choose(queue)).share.tenant for _ in range(2)]
    queue += _wants((LIGHT, 1, 100))  # the light key arrives behind six heavy items
    assert turns.choose(queue) == len(queue) - 1  # level with heavy, fewer waiting: it goes first
    assert served == ["heavy", "heavy"]


@pytest.mark.parametrize("weights", [(1, 1), (2, 1)])
def test_saturated_turns_follow_the_weights(weights):
    a, b = Share("a", weights[0]), Share("b", weights[1])
    turns = FairTurns()
    queue = _wants((a, 5, 50), (b, 5, 50))
    got = {"a": 0, "b": 0}
    for _ in range(300):
        chosen = queue.pop(turns.choose(queue))
        got[chosen.share.tenant] += 1
        queue.append(Want(chosen.share, 50))  # both stay saturated
    assert got["a"] / got["b"] == pytest.approx(weights[0] / weights[1], rel=0.05)


def test_a_key_served_in_the_last_round_still_bounds_the_next():
    rounds = FairRounds(quantum=256)
    rounds.pick(_wants((HEAVY, 20, 64), (LIGHT, 1, 64)), budget=2048)
    # the light key's next request is not in yet: the heavy key still gets about its quantum
    assert len(rounds.pick(_wants((HEAVY, 16, 64)), budget=2048)) == 4
    # a round later without it, the heavy key has the round to itself again
    assert len(rounds.pick(_wants((HEAVY, 12, 64)), budget=2048)) == 12
