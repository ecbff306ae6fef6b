"""The llama.cpp engine's batch layout, prefix cache and worker against SimulatedLlamaCpp, a
named fake of the binding seam that enforces llama.cpp's batch rules (tests/support/
fake_llamacpp.py). The real binding and model: tests/llamacpp."""

import asyncio
import dataclasses
import random

import pytest

from openjev.core.plan import Branch, Plan
from openjev.core.types import Share
from openjev.engines.llamacpp.cache import StateCache
from openjev.engines.llamacpp.engine import LlamaCppEngine
from openjev.engines.llamacpp.layout import layout, leaves
from openjev.errors import TokensExceeded
from tests.support.fake_llamacpp import SimulatedLlamaCpp, expected

STATE = tuple(range(100, 160))


def _plan(options: int, *, state=STATE, extra=(7, 8), ns: str = "") -> Plan:
    branches = [Branch((*extra, 20 + k, 30 + k), (1, 2, 3 + k), prefix=state) for k in range(options)]
    return Plan.from_branches(branches, cache_namespace=ns)


def _random_plan(rng: random.Random) -> Plan:
    """Branches that share prefixes at random depths (some identical, some a prefix of another)."""
    base = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))]
    branches = []
    for _ in range(rng.randrange(1, 12)):
        cut = rng.randrange(0, len(base) + 1)
        ids = base[:cut] + [rng.randrange(1, 50) for _ in range(rng.randrange(0 if cut else 1, 6))]
        if not ids:
            ids = [1]
        branches.append(Branch(tuple(ids), tuple(rng.sample(range(1, 60), rng.randrange(1, 4)))))
    if rng.random() < 0.3:
        branches.append(branches[0])
    return Plan.from_branches(branches)


def _run(engine, plan):
    return asyncio.run(engine.run(plan))


def _check(plan, result):
    for branch, got in zip(plan.branches, result.branches, strict=True):
        assert got.logprobs == expected(branch.input_ids, branch.label_ids)


def test_layout_puts_each_shared_token_in_every_branch_sequence_below_it_once():
    plan = _plan(3)
    lay = layout(plan, cached=0, root_seq=0, cache_seq=None, free_seqs=[1, 2, 3])
    (group,) = lay.groups
    assert lay.computed == plan.unique_tokens == len(group.items)
    root = [it for it in group.items if it.pos < len(plan.root.tokens)]
    assert all(it.seqs == (0, 1, 2, 3) for it in root)
    assert [it.pos for it in group.items[: len(root)]] == list(range(len(root)))
    assert [it.reads for it in group.items if it.reads] == [(0,), (1,), (2,)]
    assert all(len(it.seqs) == 1 for it in group.items[len(root) :])


def test_layout_of_a_cached_root_starts_after_it_and_copies_it():
    plan = _plan(2)
    lay = layout(plan, cached=50, root_seq=5, cache_seq=7, free_seqs=[1, 2])
    (group,) = lay.groups
    assert (group.copy_from, group.copy_len, group.copy_into) == (7, 50, (5, 1, 2))
    assert group.items[0].pos == 50 and lay.computed == plan.unique_tokens - 50


def test_more_leaves_than_sequences_go_in_groups_that_compute_the_root_once():
    plan = _plan(7)
    lay = layout(plan, cached=0, root_seq=0, cache_seq=None, free_seqs=[1, 2, 3])
    assert [len(g.leaf_seqs) for g in lay.groups] == [3, 3, 1]
    assert all(g.copy_from == 0 and g.copy_len == len(plan.root.tokens) for g in lay.groups[1:])
    assert lay.computed == plan.unique_tokens
    reads = [b for g in lay.groups for it in g.items for b in it.reads]
    assert sorted(reads) == list(range(7))


@pytest.mark.parametrize("seed", range(40))
def test_random_tries_give_every_branch_its_independent_prefill(seed):
    rng = random.Random(seed)
    fake = SimulatedLlamaCpp(n_seq_max=rng.choice([2, 3, 8]), n_batch=rng.choice([1, 5, 64]))
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    try:
        for _ in range(3):
            plan = _random_plan(rng)
            result = _run(engine, plan)
            _check(plan, result)
            if len(leaves(plan.root)) <= fake.n_seq_max - 1:
                # one group: every distinct token computed once, less what the cache served
                assert result.computed_tokens + result.cached_tokens == plan.unique_tokens
            # nothing leaks: the context is empty between requests (the cache is outside it)
            assert not fake.cells
    finally:
        asyncio.run(engine.close())


def test_the_counts_are_the_engines_own_and_match_the_fake_backend():
    fake = SimulatedLlamaCpp()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)
    plan = _plan(4)
    result = _run(engine, plan)
    _check(plan, result)
    assert result.computed_tokens == fake.decoded_tokens == plan.unique_tokens
    assert result.cached_tokens == 0 and not fake.cells  # cache off: nothing kept
    asyncio.run(engine.close())
    assert fake.closed


def test_a_second_request_on_the_same_state_computes_only_its_questions():
    fake = SimulatedLlamaCpp()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    first = _plan(3, extra=(7, 8))
    _run(engine, first)
    second = _plan(2, extra=(9,))
    before = fake.decoded_tokens
    result = _run(engine, second)
    _check(second, result)
    assert result.cached_tokens == len(STATE)
    assert result.computed_tokens == fake.decoded_tokens - before == second.unique_tokens - len(STATE)
    assert engine.cache.hits == 1
    asyncio.run(engine.close())


def test_the_cache_never_serves_another_namespace():
    fake = SimulatedLlamaCpp()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    _run(engine, _plan(2, ns="tenant-a"))
    other = _run(engine, _plan(2, ns="tenant-b"))
    same = _run(engine, _plan(2, ns="tenant-a"))
    assert other.cached_tokens == 0 and same.cached_tokens > 0
    asyncio.run(engine.close())


def test_a_request_identical_to_a_cached_root_still_computes_its_read_position():
    fake = SimulatedLlamaCpp()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    plan = Plan.from_branches([Branch(STATE, (1, 2))])
    _run(engine, plan)
    again = _run(engine, plan)
    _check(plan, again)
    assert (again.cached_tokens, again.computed_tokens) == (len(STATE) - 1, 1)
    asyncio.run(engine.close())


def test_the_byte_bound_evicts_the_least_recent_entries_and_frees_their_cells():
    fake = SimulatedLlamaCpp(bytes_per_cell=10)
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10 * 150)  # room for two 62-token roots
    for k in range(4):
        _run(engine, _plan(2, state=tuple(range(1000 * (k + 1), 1000 * (k + 1) + 60))))
    assert len(engine.cache) == 2 and engine.cache.nbytes == 2 * 620 <= 1500
    assert not fake.cells  # the entries are saved states, not cells of the context
    asyncio.run(engine.close())


def test_state_cache_supersedes_a_shorter_entry_and_keeps_a_longer_one():
    cache = StateCache(1000)
    three, four = b"x" * 30, b"y" * 40
    assert cache.insert((1, 2, 3), three)
    assert cache.insert((1, 2, 3, 4), four) and len(cache) == 1  # superseded
    assert not cache.insert((1, 2), b"z" * 20)  # covered: the new one is not kept
    assert cache.lookup((1, 2, 9)) == (2, four)
    assert cache.lookup((1, 2, 9), namespace="other") == (0, None)
    assert cache.nbytes == 40
    assert not cache.insert((5,), b"w" * 1001)  # larger than the bound
    assert cache.insert((6,), b"v" * 980) and cache.lookup((1, 2)) == (0, None)  # the LRU went
    assert cache.nbytes == 980


def test_a_shorter_shared_prefix_restores_the_entry_cut_to_it():
    fake = SimulatedLlamaCpp()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    _run(engine, _plan(2))
    shorter = _plan(2, state=STATE[:30] + (999,) * 10)
    result = _run(engine, shorter)
    _check(shorter, result)  # the fake checks every read sees exactly its own positions
    assert result.cached_tokens == 30 and fake.restores == 1
    asyncio.run(engine.close())


def test_cached_entries_take_no_cells_of_the_context():
    """The context holds one request: with room for one root only, two states alternate
    and each is served from the cache."""
    fake = SimulatedLlamaCpp(n_ctx=80)
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    a, b = _plan(2), _plan(2, state=tuple(range(500, 560)))
    for plan in (a, b):
        _run(engine, plan)
    again = [_run(engine, plan) for plan in (a, b)]
    assert [r.cached_tokens for r in again] == [62, 62]
    asyncio.run(engine.close())


def test_a_state_llama_cpp_refuses_is_computed_again():
    fake = SimulatedLlamaCpp()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    plan = _plan(2)
    _run(engine, plan)
    fake.refuse_restore = True
    result = _run(engine, plan)
    _check(plan, result)
    assert (result.cached_tokens, result.computed_tokens) == (0, plan.unique_tokens)
    asyncio.run(engine.close())


def test_a_branch_past_the_trained_context_is_refused_before_any_work():
    fake = SimulatedLlamaCpp(n_ctx_train=50)
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)
    with pytest.raises(TokensExceeded):
        _run(engine, _plan(1))
    assert fake.decodes == 0
    asyncio.run(engine.close())


def test_a_cancelled_request_stops_at_its_next_decode_and_leaves_nothing_behind():
    import threading

    fake = SimulatedLlamaCpp(n_batch=8)
    fake.gate = threading.Event()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=10_000)
    plan = _plan(3)  # 72 tokens: 9 decode calls of 8

    async def scenario():
        task = asyncio.create_task(engine.run(plan))
        while not fake.entered.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.05)
        fake.gate.set()  # the decode in flight finishes; the next one is never started
        with pytest.raises(asyncio.CancelledError):
            await task
        fake.gate = None
        return await engine.run(_plan(2, state=(5, 6, 7)))

    result = asyncio.run(scenario())
    assert fake.decodes <= 2 + 1  # the one in flight (maybe the next), then the new request's
    assert result.cached_tokens == 0
    assert not fake.cells and len(engine.cache) == 1
    asyncio.run(engine.close())


def test_a_light_keys_request_runs_next_though_a_heavy_keys_queue_came_first():
    import threading

    fake = SimulatedLlamaCpp()
    fake.gate = threading.Event()
    engine = LlamaCppEngine(fake, prefix_cache_bytes=0)
    heavy, light = Share("heavy"), Share("light")

    def plan(share: Share, k: int) -> Plan:
        return dataclasses.replace(_plan(2, state=tuple(range(200 + 10 * k, 210 + 10 * k))), share=share)

    async def scenario() -> list[str]:
        done: list[str] = []

        async def run(name: str, p: Plan) -> None:
            await engine.run(p)
            done.append(name)

        tasks = [asyncio.create_task(run("heavy", plan(heavy, 0)))]
        while not fake.entered.is_set():  # the first heavy request holds the worker
            await asyncio.sleep(0.005)
        tasks += [asyncio.create_task(run("heavy", plan(heavy, k))) for k in range(1, 6)]
        await asyncio.sleep(0.05)  # queued behind it, in that order
        tasks.append(asyncio.create_task(run("light", plan(light, 9))))
        await asyncio.sleep(0.05)
        fake.gate.set()
        await asyncio.gather(*tasks)
        return done

    try:
        done = asyncio.run(scenario())
    finally:
        fake.gate.set()
        asyncio.run(engine.close())
    assert done.index("light") == 1, done  # after the one under way, ahead of five queued before it
