"""max_concurrency: at most K env calls in flight, per vector env or per shared limiter."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anyio
import gymnasium
import numpy as np
import pytest

import aiovec


class Peak:
    """Counts env calls in flight and remembers the most seen at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.lock = threading.Lock()

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


SPACE = gymnasium.spaces.Discrete(3)


class AsyncServerEnv(aiovec.AsyncEnv[int, int]):
    observation_space = action_space = SPACE

    def __init__(self, peak: Peak) -> None:
        self.peak = peak

    async def reset(self, *, seed=None, options=None):
        return 0, {}

    async def step(self, action):
        self.peak.enter()
        for _ in range(3):  # a few suspensions: a round trip
            await asyncio.sleep(0)
        self.peak.leave()
        return int(action), 1.0, False, False, {}


class BlockingServerEnv(gymnasium.Env[int, int]):
    observation_space = action_space = SPACE

    def __init__(self, peak: Peak) -> None:
        self.peak = peak

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        self.peak.enter()
        time.sleep(0.002)  # the blocking call's work (not synchronisation)
        self.peak.leave()
        return int(action), 1.0, False, False, {}


CASES = [("inline", AsyncServerEnv), ("thread", BlockingServerEnv)]


@pytest.mark.parametrize(("backend", "env_cls"), CASES)
@pytest.mark.parametrize("limit", [None, 3])
@pytest.mark.asyncio
async def test_at_most_k_calls_in_flight(backend, env_cls, limit):
    peak = Peak()
    fns: list[Any] = [lambda: env_cls(peak)] * 12
    async with aiovec.AsyncioVectorEnv(fns, backend=backend, max_concurrency=limit) as venv:
        await venv.reset()
        for _ in range(5):
            obs, *_ = await venv.step(np.arange(12) % 3)
            assert obs.tolist() == (np.arange(12) % 3).tolist()
    if limit is None:
        assert peak.peak > 3  # without a limit they overlap: the check below can fail
    else:
        assert peak.peak <= limit


@pytest.mark.asyncio
async def test_a_limiter_shared_by_two_vector_envs_bounds_both_together():
    peak = Peak()
    limiter = anyio.CapacityLimiter(2)
    fns: list[Any] = [lambda: AsyncServerEnv(peak)] * 6
    async with (
        aiovec.AsyncioVectorEnv(fns, max_concurrency=limiter) as first,
        aiovec.AsyncioVectorEnv(fns, max_concurrency=limiter) as second,
    ):
        await asyncio.gather(first.reset(), second.reset())
        for _ in range(3):
            await asyncio.gather(
                first.step(np.zeros(6, np.int64)), second.step(np.ones(6, np.int64))
            )
    assert peak.peak <= 2
    assert limiter.borrowed_tokens == 0


@pytest.mark.asyncio
async def test_limited_calls_are_cancelled_cleanly():
    peak = Peak()
    gate, two_in = asyncio.Event(), asyncio.Event()

    class Stuck(AsyncServerEnv):
        async def step(self, action):
            self.peak.enter()
            if self.peak.now == 2:
                two_in.set()
            try:
                await gate.wait()
            finally:
                self.peak.leave()
            return 0, 0.0, False, False, {}

    limiter = anyio.CapacityLimiter(2)
    async with aiovec.AsyncioVectorEnv([lambda: Stuck(peak)] * 5, max_concurrency=limiter) as venv:
        await venv.reset()
        task = asyncio.create_task(venv.step(np.zeros(5, np.int64)))
        await two_in.wait()  # two calls hold the two tokens; three wait for one
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert limiter.borrowed_tokens == 0
        assert peak.now == 0


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), ("2", TypeError), (True, TypeError)])
def test_bad_max_concurrency(value, error):
    with pytest.raises(error, match="max_concurrency"):
        aiovec.AsyncioVectorEnv([lambda: AsyncServerEnv(Peak())], max_concurrency=value)


class SlowEnv(aiovec.AsyncEnv[int, int]):
    """Env ``i``'s server takes ``i`` * 10 ms per step: a higher index is a slower server.

    (Suspending more often is not a slower server: waits for the loop are queue wait.)
    """

    observation_space = action_space = SPACE

    def __init__(self, i: int) -> None:
        self.i = i

    async def reset(self, *, seed=None, options=None):
        return 0, {}

    async def step(self, action):
        if self.i:
            await asyncio.sleep(0.01 * self.i)
        return 0, 0.0, False, False, {}


@pytest.mark.asyncio
async def test_latency_stats_show_which_env_is_slow():
    fns: list[Any] = [lambda i=i: SlowEnv(i) for i in range(4)]
    async with aiovec.AsyncioVectorEnv(fns) as venv:
        await venv.reset()
        for _ in range(5):
            await venv.step(np.zeros(4, np.int64))
        stats = venv.latency_stats()
    assert stats.count.tolist() == [0, 5, 5, 5]  # env 0 never waited: not timed
    assert stats.slowest(1) == [3]
    assert stats.p50[3] > stats.p50[1]
    assert stats.overall_p99 >= stats.overall_p50 > 0


def test_latency_stats_on_the_thread_backend():
    peak = Peak()
    with aiovec.BlockingVectorEnv([lambda: BlockingServerEnv(peak)] * 2, backend="thread") as envs:
        envs.reset()
        envs.step(np.zeros(2, np.int64))
        stats = envs.latency_stats()
    assert stats.count.tolist() == [2, 2]  # the reset and the step
    assert (stats.p50 > 0).all()


class Clock:
    """A fake perf_counter that only the envs move: one unit of work, one second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.asyncio
async def test_time_queued_for_a_token_is_not_counted_as_latency(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)

    class OneUnit(AsyncServerEnv):
        async def step(self, action):
            clock.now += 1.0  # this env's own work
            await asyncio.sleep(0)
            return 0, 0.0, False, False, {}

    fns: list[Any] = [lambda: OneUnit(Peak())] * 4
    async with aiovec.AsyncioVectorEnv(fns, max_concurrency=1) as venv:
        await venv.reset()
        await venv.step(np.zeros(4, np.int64))
        stats = venv.latency_stats()
    assert stats.p50.tolist() == [1.0] * 4  # not 1, 2, 3, 4: queueing is not the server's


WORK = 0.3  # seconds of an env's own work per step (the scenario, not synchronisation)
TIMEOUT = 0.5  # more than one env's work, less than two envs' one after the other


class TimedAsyncEnv(AsyncServerEnv):
    """Works ``WORK`` seconds per step; a step with action 1 never ends (until released)."""

    def __init__(self, peak: Peak, release: threading.Event) -> None:
        super().__init__(peak)
        self.release = release

    async def step(self, action):
        if action == 1:
            await asyncio.Event().wait()
        await asyncio.sleep(WORK)
        return 0, 0.0, False, False, {}


class TimedBlockingEnv(BlockingServerEnv):
    def __init__(self, peak: Peak, release: threading.Event) -> None:
        super().__init__(peak)
        self.release = release

    def step(self, action):
        if action == 1:
            self.release.wait(60)
        time.sleep(WORK)
        return 0, 0.0, False, False, {}


@pytest.mark.parametrize(
    ("backend", "env_cls"), [("inline", TimedAsyncEnv), ("thread", TimedBlockingEnv)]
)
@pytest.mark.asyncio
async def test_each_env_has_its_timeout_from_its_own_start_not_the_queue(backend, env_cls):
    """Under max_concurrency=1 the second env starts after the first: its clock starts then."""
    release = threading.Event()
    fns: list[Any] = [lambda: env_cls(Peak(), release)] * 2
    venv = aiovec.AsyncioVectorEnv(fns, backend=backend, max_concurrency=1, step_timeout=TIMEOUT)
    try:
        await venv.reset()
        # 2 x WORK one after the other is more than TIMEOUT; each env's own WORK is less.
        _, _, _, _, infos = await venv.step(np.zeros(2, np.int64))
        assert "error" not in infos
        # A queued env that hangs once it has its slot still times out, and only it.
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.step(np.array([0, 1]))
        assert set(info.value.errors) == {1}
        assert "did not answer step() within 0.5 s" in str(info.value)
    finally:
        release.set()
        await venv.close()


class _Sleeper(aiovec.AsyncEnv[int, int]):
    observation_space = action_space = gymnasium.spaces.Discrete(2)

    async def reset(self, *, seed=None, options=None):
        return 0, {}

    async def step(self, action):
        await asyncio.sleep(0.2)
        return 0, 0.0, False, False, {}


@pytest.mark.asyncio
async def test_latency_stats_keep_queue_wait_apart_from_the_envs_own_time():
    # one slot, three envs of 0.2 s each: the third waits 0.4 s for its slot, and
    # that wait is the queue's, not the env's (its own time stays about 0.2 s)
    async with aiovec.AsyncioVectorEnv([_Sleeper] * 3, max_concurrency=1) as venv:
        await venv.reset()
        await venv.step(np.zeros(3, np.int64))
        stats = venv.latency_stats()
    assert stats.count.tolist() == [1, 1, 1]
    assert (stats.p50 >= 0.2).all()
    assert (stats.p50 < 0.39).all(), stats.p50  # a queued call's own time excludes its wait
    assert stats.queue is not None
    assert stats.queue.count.tolist() == [1, 1, 1]
    assert sorted(stats.queue.p50)[2] >= 0.4  # the last to get the slot waited for two calls
    assert stats.queue.queue is None
