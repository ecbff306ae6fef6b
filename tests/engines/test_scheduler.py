"""The in-process scheduler with a FakeRunner whose forward costs time per token (like a
CPU): rounds are bounded in time, so cancellation acts within about one slice."""

import asyncio
import threading
import time

import pytest
import torch

from openjev.core.plan import Branch, Plan
from openjev.core.ports import PlanResult
from openjev.core.types import Share
from openjev.engines.fair_share import QUANTUM
from openjev.engines.prefix_cache import PrefixCache
from openjev.engines.torch.scheduler import FIRST_SLICE, MIN_SLICE, Job, JobState, Scheduler, SchedulerLimits
from openjev.errors import EngineError


class FakeRunner:
    """Forward: `s_per_token` seconds per real token; records (time, tokens) of each forward."""

    def __init__(self, s_per_token: float) -> None:
        self.s_per_token = s_per_token
        self.forwards: list[tuple[float, int]] = []
        self.lock = threading.Lock()

    def forward(self, rows):
        n = sum(len(r.tokens) for r in rows)
        time.sleep(n * self.s_per_token)
        with self.lock:
            self.forwards.append((time.monotonic(), n))
        chunks = [
            tuple((torch.zeros(1, 1, len(r.tokens), 1), torch.zeros(1, 1, len(r.tokens), 1)) for _ in range(1))
            for r in rows
        ]
        return None, chunks

    def read(self, hidden, picks, label_ids):
        return [tuple(-1.0 for _ in ids) for ids in label_ids]

    def tokens_after(self, t: float) -> int:
        with self.lock:
            return sum(n for end, n in self.forwards if end > t)


def _plan(n: int, first: int = 1) -> Plan:
    return Plan.from_branches([Branch(tuple(range(first, first + n)), (1, 2))])


def _scheduler(runner, slice_s=0.05, batch_tokens=2048, fair_quantum=QUANTUM):
    limits = SchedulerLimits(
        batch_tokens=batch_tokens, attention_budget=1 << 30, window_s=0, slice_s=slice_s, fair_quantum=fair_quantum
    )
    return Scheduler(runner, PrefixCache(0), limits)


def test_a_cancelled_long_prefill_stops_within_about_one_slice():
    # 2 ms per token: a 2048-token round (the size without a time bound) runs 4 s past the
    # cancellation; a time-bounded round is MIN_SLICE tokens (1 s) here.
    runner = FakeRunner(0.002)
    scheduler = _scheduler(runner, slice_s=0.05)

    async def go():
        task = asyncio.create_task(scheduler.run(_plan(6000)))
        while len(runner.forwards) < 2:  # a few rounds in: the cost per token is measured
            await asyncio.sleep(0.01)
        task.cancel()
        cancelled_at = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.5)
        return cancelled_at

    try:
        cancelled_at = asyncio.run(go())
    finally:
        scheduler.stop()
    after = runner.tokens_after(cancelled_at)
    assert after <= MIN_SLICE, f"{after} tokens computed after the cancellation"
    assert sum(n for _, n in runner.forwards) < 6000


def test_rounds_follow_the_measured_cost_between_the_floor_and_batch_tokens():
    runner = FakeRunner(0.0001)  # 0.1 ms per token: 0.1 s is 1000 tokens
    scheduler = _scheduler(runner, slice_s=0.1)
    try:
        result = asyncio.run(scheduler.run(_plan(6000)))
    finally:
        scheduler.stop()
    sizes = [n for _, n in runner.forwards]
    assert sizes[0] == FIRST_SLICE
    assert all(MIN_SLICE <= n <= 1050 for n in sizes[1:-1]), sizes  # (sleep overshoots: fewer, never more)
    assert max(sizes[1:-1]) > MIN_SLICE + 100, sizes
    assert sum(sizes) == 6000 and result.computed_tokens == 6000


def test_fast_hardware_keeps_full_rounds():
    runner = FakeRunner(0.0)
    scheduler = _scheduler(runner, slice_s=0.05, batch_tokens=1024)
    try:
        asyncio.run(scheduler.run(_plan(3000)))
    finally:
        scheduler.stop()
    assert [n for _, n in runner.forwards] == [FIRST_SLICE, 1024, 1024, 3000 - FIRST_SLICE - 2 * 1024]


# ---- the Job's states, against the same fake runner


class FailingRunner(FakeRunner):
    """A FakeRunner whose forwards fail while `failing` is set (an engine error mid-request)."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.failing = threading.Event()

    def forward(self, rows):
        if self.failing.is_set():
            raise RuntimeError("the device fell over")
        return super().forward(rows)


def _job(outcomes: list) -> Job:
    return Job(plan=_plan(4), deliver=outcomes.append)


def test_a_job_delivers_exactly_one_outcome():
    outcomes: list = []
    job = _job(outcomes)
    assert job.state is JobState.QUEUED
    job.fail(EngineError("first"))
    job.fail(EngineError("second"))
    job.succeed(PlanResult(branches=(), computed_tokens=0, cached_tokens=0))
    assert job.state is JobState.FAILED
    assert [str(o) for o in outcomes] == ["first"]


def test_a_cancelled_job_is_dropped_without_an_outcome():
    outcomes: list = []
    job = _job(outcomes)
    job.state = JobState.RUNNING
    job.cancel()
    assert not job.active and job.state is JobState.CANCELLED
    job.fail(EngineError("too late"))
    assert outcomes == []


def test_a_finished_job_is_done_with_every_branch_read():
    runner = FakeRunner(0.0)
    scheduler = _scheduler(runner)
    plan = Plan.from_branches([Branch((1, 2, 3), (7, 8)), Branch((1, 2, 4, 5), (9,))])
    try:
        result = asyncio.run(scheduler.run(plan))
    finally:
        scheduler.stop()
    assert [len(b.logprobs) for b in result.branches] == [2, 1]
    assert result.computed_tokens == 5 and result.cached_tokens == 0


def test_a_failed_forward_fails_its_requests_and_the_next_request_is_served():
    runner = FailingRunner()
    scheduler = _scheduler(runner)
    runner.failing.set()
    try:
        with pytest.raises(EngineError, match="the engine failed"):
            asyncio.run(scheduler.run(_plan(10)))
        runner.failing.clear()
        result = asyncio.run(scheduler.run(_plan(10, first=100)))
    finally:
        scheduler.stop()
    assert result.computed_tokens == 10


def test_stopping_fails_waiting_requests_and_refuses_new_ones():
    runner = FakeRunner(0.002)  # 6000 tokens: seconds of work, still running at stop()
    scheduler = _scheduler(runner, slice_s=0.05)

    async def go():
        task = asyncio.create_task(scheduler.run(_plan(6000)))
        while not runner.forwards:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(scheduler.stop)
        with pytest.raises(EngineError, match="shut down"):
            await task
        with pytest.raises(EngineError, match="shut down"):
            await scheduler.run(_plan(3))

    asyncio.run(go())


def test_the_prefix_cache_is_per_namespace():
    """A plan finds in the cache only what plans of its own namespace computed."""
    scheduler = Scheduler(
        FakeRunner(0.0),
        PrefixCache(1 << 30),
        SchedulerLimits(batch_tokens=2048, attention_budget=1 << 30, window_s=0, slice_s=0.5),
    )
    state = tuple(range(1, 201))
    branches = [Branch((*state, 500 + i, 600 + i), (1, 2)) for i in range(2)]

    def run(namespace: str):
        return asyncio.run(scheduler.run(Plan.from_branches(branches, cache_namespace=namespace)))

    try:
        first_a, first_b, again_a, again_b = run("a"), run("b"), run("a"), run("b")
        keyless = run("")
    finally:
        scheduler.stop()
    assert (first_a.cached_tokens, first_a.computed_tokens) == (0, 204)
    assert (first_b.cached_tokens, first_b.computed_tokens) == (0, 204)  # a's state is not b's
    assert again_a.cached_tokens == 200 and again_b.cached_tokens == 200
    assert keyless.cached_tokens == 0


def test_a_failing_forward_tells_the_client_only_that_the_engine_failed():
    class Broken(FakeRunner):
        def forward(self, rows):
            raise RuntimeError("CUDA error at /opt/models/secret-model/weights.bin")

    scheduler = _scheduler(Broken(0.0))
    try:
        with pytest.raises(EngineError) as failed:
            asyncio.run(scheduler.run(_plan(10)))
    finally:
        scheduler.stop()
    assert failed.value.message == "the engine failed"
    assert "/opt/models" in failed.value.detail


def _joining_scheduler(runner) -> Scheduler:
    return Scheduler(
        runner,
        PrefixCache(1 << 30),
        SchedulerLimits(batch_tokens=64, attention_budget=1 << 30, window_s=0.005, slice_s=0.5),
    )


@pytest.mark.parametrize("namespaces", [1, 2])
def test_identical_concurrent_cold_requests_compute_their_state_once_per_namespace(namespaces):
    """Issue 28, item 7: on main each of 12 concurrent requests on one new state computed
    all of it (12 x 204 tokens); now the first computes the state and the others, of its
    namespace, wait for it and compute only their own 4 tokens."""
    scheduler = _joining_scheduler(FakeRunner(2e-4))  # the 200-token state takes ~40 ms, in 4 slices
    state = tuple(range(1, 201))
    branches = [Branch((*state, 500 + i, 600 + i), (1, 2)) for i in range(2)]

    async def all_at_once():
        plans = [Plan.from_branches(branches, cache_namespace=f"ns{k % namespaces}") for k in range(12)]
        return await asyncio.gather(*(scheduler.run(p) for p in plans))

    try:
        results = asyncio.run(all_at_once())
        after = asyncio.run(scheduler.run(_plan(5, first=900)))  # the next request is served
    finally:
        scheduler.stop()
    assert sum(r.computed_tokens for r in results) == namespaces * 204 + (12 - namespaces) * 4
    assert sorted(r.cached_tokens for r in results) == [0] * namespaces + [200] * (12 - namespaces)
    assert all(len(r.branches) == 2 for r in results)
    assert after.computed_tokens == 5


def test_followers_of_a_cancelled_leader_compute_for_themselves():
    scheduler = _joining_scheduler(FakeRunner(5e-4))
    state = tuple(range(1, 401))
    plan = Plan.from_branches([Branch((*state, 7), (1, 2))])

    async def leader_cancelled():
        leader = asyncio.ensure_future(scheduler.run(plan))
        await asyncio.sleep(0.002)
        followers = [asyncio.ensure_future(scheduler.run(plan)) for _ in range(3)]
        await asyncio.sleep(0.02)
        leader.cancel()
        return await asyncio.gather(*followers)

    try:
        results = asyncio.run(leader_cancelled())
    finally:
        scheduler.stop()
    assert all(len(r.branches) == 1 for r in results)
    assert sum(r.computed_tokens for r in results) == 401 + 2 * 1  # one new leader, two joined it


# ---- keys' fair order (engines/fair_share.py)


@pytest.mark.parametrize("quantum", [QUANTUM, 64, 384])
def test_a_light_keys_request_goes_in_the_next_small_round_beside_a_heavy_keys_queue(quantum):
    runner = FakeRunner(0.0002)
    scheduler = _scheduler(runner, slice_s=10, fair_quantum=quantum)
    heavy = [
        Plan.from_branches([Branch(tuple(range(100 * k + 1, 100 * k + 65)), (1, 2))], share=Share("heavy"))
        for k in range(80)
    ]
    light = Plan.from_branches([Branch(tuple(range(9001, 9065)), (1, 2))], share=Share("light"))

    async def go() -> tuple[float, float]:
        tasks = [asyncio.create_task(scheduler.run(p)) for p in heavy]
        while not runner.forwards:  # the first round (the heavy key alone) is done
            await asyncio.sleep(0.001)
        t0 = time.monotonic()
        await scheduler.run(light)
        t1 = time.monotonic()
        await asyncio.gather(*tasks)
        return t0, t1

    try:
        t0, t1 = asyncio.run(go())
    finally:
        scheduler.stop()
    during = [n for end, n in runner.forwards if t0 < end <= t1]
    # at most the round under way when it arrived, then its own: the heavy key's quantum and it
    assert len(during) <= 2 and during[-1] <= quantum + 64, during
    assert sum(n for _, n in runner.forwards) == 81 * 64


class KeyedRunner(FakeRunner):
    """A FakeRunner that counts each forward's tokens by key: key a's token ids are below
    30,000, key b's above."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.by_key: list[tuple[int, int]] = []

    def forward(self, rows):
        a = sum(1 for r in rows for t in r.tokens if t < 30_000)
        self.by_key.append((a, sum(len(r.tokens) for r in rows) - a))
        return super().forward(rows)


def test_a_key_of_weight_two_gets_twice_the_tokens_of_a_weight_one_key_while_both_wait():
    runner = KeyedRunner()
    limits = SchedulerLimits(batch_tokens=2048, attention_budget=1 << 30, window_s=0.05, slice_s=10)
    scheduler = Scheduler(runner, PrefixCache(0), limits)
    heavy_a, heavy_b = Share("a", 2), Share("b", 1)
    plans = [
        Plan.from_branches([Branch(tuple(range(base + 64 * k + 1, base + 64 * k + 65)), (1, 2))], share=share)
        for k in range(20 * QUANTUM // 64)  # more than eight rounds' worth for each key: the rounds counted are whole
        for base, share in ((0, heavy_a), (30_000, heavy_b))
    ]

    async def go() -> None:
        await asyncio.gather(*(scheduler.run(p) for p in plans))

    try:
        asyncio.run(go())
    finally:
        scheduler.stop()
    both = [(a, b) for a, b in runner.by_key if a and b][:8]  # rounds in which both keys still waited
    a, b = sum(x for x, _ in both), sum(y for _, y in both)
    assert len(both) >= 4 and a == 2 * b, runner.by_key


def test_stopping_ends_a_round_at_its_next_forward():
    """A round of three forwards (slices of unlike lengths do not share one): stopped during
    the first, the scheduler runs none of the others (here 2.4 s of work)."""
    runner = FakeRunner(0.004)
    limits = SchedulerLimits(batch_tokens=2048, attention_budget=1 << 30, window_s=0.05, slice_s=10.0)
    scheduler = Scheduler(runner, PrefixCache(0), limits)

    async def go() -> float:
        tasks = [asyncio.create_task(scheduler.run(_plan(n, first=1000 * k))) for k, n in enumerate((20, 100, 600))]
        while not runner.forwards:  # the 20-token forward done, the 100-token one under way
            await asyncio.sleep(0.005)
        t0 = time.monotonic()
        await asyncio.to_thread(scheduler.stop)
        stopped = time.monotonic() - t0
        for task in tasks[:2]:  # answered by the forwards that ran (the second under way at the stop)
            assert isinstance(await task, PlanResult)
        with pytest.raises(EngineError, match="shut down"):
            await tasks[2]
        return stopped

    stopped = asyncio.run(go())
    assert stopped < 1.0 and len(runner.forwards) == 2, (stopped, runner.forwards)
