"""Cancellation, Ctrl-C, loops and threads: nothing orphaned, states always named."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import signal
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest

import aiovec
from aiovec.testing import AsyncTwin, SpaceEnv

DISCRETE = gymnasium.spaces.Discrete(4)


class GateEnv(aiovec.AsyncEnv[int, int]):
    """Steps wait on a gate the test controls; records what happened to it."""

    observation_space = DISCRETE
    action_space = DISCRETE

    def __init__(self, gates: dict[str, Any], index: int) -> None:
        self.gates, self.index = gates, index
        self.cancelled = 0
        self.closed = False

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        return 0, {}

    async def step(self, action):
        self.gates["entered"].add(self.index)
        if len(self.gates["entered"]) == self.gates["n"]:
            self.gates["all_in"].set()
        try:
            await self.gates["open"].wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return int(action), 1.0, False, False, {}

    async def close(self):
        self.closed = True


def gate_fns(n):
    gates: dict[str, Any] = {"entered": set(), "n": n}

    def make(i):
        return lambda: GateEnv(gates, i)

    return gates, [make(i) for i in range(n)]


def other_tasks():
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


@pytest.mark.asyncio
async def test_cancelling_a_step_cancels_every_env_and_breaks():
    gates, fns = gate_fns(4)
    gates["open"], gates["all_in"] = asyncio.Event(), asyncio.Event()
    venv = aiovec.AsyncioVectorEnv(fns)
    await venv.reset(seed=0)
    step = asyncio.create_task(venv.step(np.zeros(4, np.int64)))
    await gates["all_in"].wait()
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert [env.cancelled for env in venv.envs] == [1, 1, 1, 1]
    assert venv.state is aiovec._core.lifecycle.State.BROKEN
    with pytest.raises(aiovec.StateError, match=r"interrupted.*reset\(\)"):
        await venv.step(np.zeros(4, np.int64))
    gates["open"].set()
    await venv.reset()
    obs, *_ = await venv.step(np.array([1, 2, 3, 0]))
    assert obs.tolist() == [1, 2, 3, 0]
    await venv.close()
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_close_while_a_step_is_in_flight():
    gates, fns = gate_fns(3)
    gates["open"], gates["all_in"] = asyncio.Event(), asyncio.Event()
    venv = aiovec.AsyncioVectorEnv(fns)
    await venv.reset()
    step = asyncio.create_task(venv.step(np.zeros(3, np.int64)))
    await gates["all_in"].wait()
    await venv.close()
    with pytest.raises(aiovec.ClosedError, match="in flight"):
        await step
    assert [(env.closed, env.cancelled) for env in venv.envs] == [(True, 1)] * 3
    assert other_tasks() == set()
    await venv.close()  # idempotent


@pytest.mark.asyncio
async def test_a_second_call_while_one_is_in_flight_is_refused():
    gates, fns = gate_fns(2)
    gates["open"], gates["all_in"] = asyncio.Event(), asyncio.Event()
    async with aiovec.AsyncioVectorEnv(fns) as venv:
        await venv.reset()
        step = asyncio.create_task(venv.step(np.zeros(2, np.int64)))
        await gates["all_in"].wait()
        with pytest.raises(aiovec.StateError, match="in flight"):
            await venv.step(np.zeros(2, np.int64))
        with pytest.raises(aiovec.StateError, match="in flight"):
            await venv.get_attr("index")
        gates["open"].set()
        await step  # the first call is unharmed
        assert await venv.get_attr("index") == (0, 1)


class TimeoutAwareEnv(aiovec.AsyncEnv[int, int]):
    """Uses asyncio.timeout, contextvars and current_task across a suspension."""

    observation_space = DISCRETE
    action_space = DISCRETE
    var: contextvars.ContextVar[int] = contextvars.ContextVar("var")

    def __init__(self) -> None:
        self.tasks: set[int] = set()

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        return 0, {}

    async def step(self, action):
        token = self.var.set(int(action))
        task = asyncio.current_task()
        async with asyncio.timeout(5):
            for _ in range(int(action) + 1):
                await asyncio.sleep(0)
        assert asyncio.current_task() is task
        assert self.var.get() == int(action)
        self.var.reset(token)  # raises if the context changed across the suspension
        self.tasks.add(id(task))
        return int(action), 0.0, False, False, {}


@pytest.mark.asyncio
async def test_env_coroutines_see_their_own_task_and_context():
    async with aiovec.AsyncioVectorEnv([TimeoutAwareEnv] * 4) as venv:
        await venv.reset()
        for _ in range(3):
            obs, *_ = await venv.step(np.array([0, 1, 2, 3]))
            assert obs.tolist() == [0, 1, 2, 3]
        tasks = [env.tasks for env in venv.envs]
        assert all(len(t) == 1 for t in tasks)  # one lane per env, reused
        assert len(set().union(*tasks)) == 4  # and not shared
        assert asyncio.current_task() not in set().union(*tasks)


class SleepyTimeoutEnv(TimeoutAwareEnv):
    async def step(self, action):
        async with asyncio.timeout(0):  # expires: must cancel this env's task only
            await asyncio.Event().wait()
        return 0, 0.0, False, False, {}


@pytest.mark.asyncio
async def test_an_env_timeout_cancels_that_env_not_the_caller():
    async with aiovec.AsyncioVectorEnv([SleepyTimeoutEnv] * 2) as venv:
        await venv.reset()
        with pytest.raises(aiovec.EnvError) as info:
            await venv.step(np.zeros(2, np.int64))
        assert sorted(info.value.errors) == [0, 1]
        assert all(isinstance(e, TimeoutError) for e in info.value.errors.values())
        assert asyncio.current_task().cancelling() == 0


def test_one_vector_env_across_two_event_loops():
    venv = aiovec.AsyncioVectorEnv([lambda: AsyncTwin(SpaceEnv(), max_yields=3)] * 3)
    first = asyncio.run(venv.reset(seed=1))
    second = asyncio.run(venv.step(np.zeros(3, np.int64)))
    asyncio.run(venv.close())
    oracle = gymnasium.vector.SyncVectorEnv([SpaceEnv] * 3)
    assert np.array_equal(first[0], oracle.reset(seed=1)[0])
    assert np.array_equal(second[0], oracle.step(np.zeros(3, np.int64))[0])
    oracle.close()


# -- the blocking front end -----------------------------------------------------------


class InterruptingEnv(aiovec.AsyncEnv[int, int]):
    """Its step sends SIGINT to this process from inside the event loop, then waits."""

    observation_space = DISCRETE
    action_space = DISCRETE
    interrupt = True

    def __init__(self, first: bool = False) -> None:
        self.cancelled = 0
        self.first = first

    async def reset(self, *, seed=None, options=None):
        return 0, {}

    async def step(self, action):
        if type(self).interrupt:
            if self.first:  # one Ctrl-C (a second one means "force quit" to asyncio)
                asyncio.get_running_loop().call_soon(signal.raise_signal, signal.SIGINT)
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return 1, 0.0, False, False, {}


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
def test_ctrl_c_during_a_blocking_step_cancels_everything(monkeypatch):
    envs = aiovec.BlockingVectorEnv([lambda: InterruptingEnv(first=True)] + [InterruptingEnv] * 2)
    try:
        envs.reset()
        with pytest.raises(KeyboardInterrupt):
            envs.step(np.zeros(3, np.int64))
        assert [env.cancelled for env in envs.envs] == [1, 1, 1]
        assert envs.state is aiovec._core.lifecycle.State.BROKEN
        with pytest.raises(aiovec.StateError, match="interrupted"):
            envs.step(np.zeros(3, np.int64))
        monkeypatch.setattr(InterruptingEnv, "interrupt", False)
        envs.reset()
        assert envs.step(np.zeros(3, np.int64))[0].tolist() == [1, 1, 1]
    finally:
        envs.close()


class InterruptsOnce(SpaceEnv):
    """Its first step raises KeyboardInterrupt (as a Ctrl-C in a sync env does)."""

    pressed = False

    def step(self, action):
        if not InterruptsOnce.pressed:
            InterruptsOnce.pressed = True
            raise KeyboardInterrupt
        return super().step(action)


@pytest.mark.parametrize("call", ["step", "send"])
def test_keyboard_interrupt_raised_by_a_sync_env_propagates_as_is(call, monkeypatch):
    monkeypatch.setattr(InterruptsOnce, "pressed", False)
    envs = aiovec.BlockingVectorEnv([SpaceEnv, InterruptsOnce, SpaceEnv])
    try:
        envs.reset(seed=0)
        with pytest.raises(KeyboardInterrupt):
            getattr(envs, call)(np.zeros(3, np.int64))
        assert envs.state is aiovec._core.lifecycle.State.BROKEN
        assert envs.envs[2].episode_steps == 0  # nothing started after Ctrl-C
        # send() cannot wait for the envs it abandons: the reset after it must not
        # take their outcomes (the KeyboardInterrupt among them) for its own.
        try:
            obs, _ = envs.reset(seed=1)
        except KeyboardInterrupt:  # not pytest.raises: this one must not be raised
            pytest.fail(f"reset() raised the KeyboardInterrupt of the {call}() before it")
        assert len(obs) == 3
        envs.step(np.zeros(3, np.int64))
    finally:
        envs.close()


@pytest.mark.asyncio
async def test_blocking_env_inside_a_running_loop_uses_a_helper_thread():
    threads_before = threading.active_count()
    envs = aiovec.BlockingVectorEnv([lambda: AsyncTwin(SpaceEnv())] * 3)
    assert envs._runner.strategy == "loop-thread"
    oracle = gymnasium.vector.SyncVectorEnv([SpaceEnv] * 3)
    try:
        assert np.array_equal(envs.reset(seed=4)[0], oracle.reset(seed=4)[0])
        for _ in range(5):
            actions = np.array([0, 1, 2])
            assert np.array_equal(envs.step(actions)[0], oracle.step(actions)[0])
    finally:
        envs.close()
        oracle.close()
    assert threading.active_count() == threads_before


@pytest.mark.asyncio
async def test_a_script_made_blocking_env_refuses_to_run_inside_a_loop():
    envs = await asyncio.to_thread(aiovec.BlockingVectorEnv, [SpaceEnv] * 2)
    try:
        with pytest.raises(RuntimeError, match="inside a running loop"):
            envs.reset()
    finally:
        await asyncio.to_thread(envs.close)


def test_blocking_env_with_waiting_async_envs_in_a_script():
    envs = aiovec.BlockingVectorEnv(
        [lambda: AsyncTwin(SpaceEnv(), max_delay=0.002)] * 4, autoreset_mode="SameStep"
    )
    oracle = gymnasium.vector.SyncVectorEnv([SpaceEnv] * 4, autoreset_mode="SameStep")
    try:
        assert envs._runner.strategy == "same-thread"
        assert np.array_equal(envs.reset(seed=9)[0], oracle.reset(seed=9)[0])
        for _ in range(10):
            actions = np.array([0, 1, 2, 1])
            got, want = envs.step(actions), oracle.step(actions)
            assert np.array_equal(got[0], want[0])
            assert np.array_equal(got[1], want[1])
    finally:
        envs.close()
        oracle.close()


def test_unclosed_vector_envs_warn():
    venv = aiovec.AsyncioVectorEnv([SpaceEnv])
    with pytest.warns(ResourceWarning, match="never closed"):
        venv.__del__()
    asyncio.run(venv.close())
    envs = aiovec.BlockingVectorEnv([SpaceEnv])
    with pytest.warns(ResourceWarning, match="never closed"):
        envs.__del__()
    assert envs.closed  # the blocking one also released its loop and envs


class EndingEnv(aiovec.AsyncEnv[int, int]):
    """Each step waits (or not) and ends the episode; the autoreset that follows
    records the task and the context variable it sees, and may fail or hang."""

    observation_space = DISCRETE
    action_space = DISCRETE
    var: contextvars.ContextVar[int] = contextvars.ContextVar("ending_env")

    def __init__(self, waits: bool, reset_fails: bool = False, reset_hangs: bool = False) -> None:
        self.waits, self.reset_fails, self.reset_hangs = waits, reset_fails, reset_hangs
        self.seen: list[tuple[object, int | None]] = []
        self.cancelled = False
        self.stepped = False

    async def reset(self, *, seed=None, options=None):
        if self.stepped:  # the autoreset of a step
            self.seen.append((asyncio.current_task(), self.var.get(None)))
            if self.reset_fails:
                raise RuntimeError("reset failed")
            if self.reset_hangs:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.cancelled = True
                    raise
        return 3, {}

    async def step(self, action):
        self.stepped = True
        self.var.set(int(action))
        self.seen.append((asyncio.current_task(), self.var.get()))
        if self.waits:
            await asyncio.sleep(0)
        return int(action), 1.0, True, False, {"stepped": True}


@pytest.mark.asyncio
@pytest.mark.parametrize("waits", [False, True])
async def test_a_steps_autoreset_runs_in_the_steps_task_and_context(waits):
    """SAME_STEP: the reset after an env ended is part of the step's call, in its lane."""
    async with aiovec.AsyncioVectorEnv(
        [lambda: EndingEnv(waits)] * 2, autoreset_mode="SameStep"
    ) as venv:
        await venv.reset()
        obs, _, terminated, _, infos = await venv.step(np.array([1, 2]))
        assert obs.tolist() == [3, 3]  # the reset's observation
        assert terminated.tolist() == [True, True]
        assert infos["final_obs"].tolist() == [1, 2]
        for env, action in zip(venv.envs, (1, 2), strict=True):
            (step_task, step_var), (reset_task, reset_var) = env.seen
            assert reset_task is step_task is not asyncio.current_task()
            assert step_var == reset_var == action  # set in step, seen in the reset


@pytest.mark.asyncio
async def test_a_failing_autoreset_after_a_wait_fails_that_env_and_its_flow_is_remade():
    async with aiovec.AsyncioVectorEnv(
        [lambda: EndingEnv(True), lambda: EndingEnv(True, reset_fails=True)],
        autoreset_mode="SameStep",
    ) as venv:
        await venv.reset()
        with pytest.raises(aiovec.EnvError) as info:
            await venv.step(np.array([1, 2]))
        assert list(info.value.errors) == [1]
        assert str(info.value.errors[1]) == "reset failed"
        venv.envs[1].reset_fails = False
        await venv.reset()
        obs, *_ = await venv.step(np.array([1, 2]))  # a new flow: the old one was discarded
        assert obs.tolist() == [3, 3]


@pytest.mark.asyncio
async def test_a_hanging_autoreset_after_a_wait_times_out_and_is_cancelled():
    async with aiovec.AsyncioVectorEnv(
        [lambda: EndingEnv(True), lambda: EndingEnv(True, reset_hangs=True)],
        autoreset_mode="SameStep",
        step_timeout=0.2,
    ) as venv:
        await venv.reset()
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.step(np.array([1, 2]))
        assert list(info.value.errors) == [1]
        assert venv.envs[1].cancelled


@pytest.mark.asyncio
async def test_suspended_envs_keep_no_more_objects_alive_than_their_own_plus_two():
    """A suspended env-step keeps alive the env's own coroutine and what it waits on,
    plus two objects: its lane's wake-up on that future and the lane's next wake-up.
    (A bare ``asyncio.gather`` adds five: a Task, two contexts, a weak reference and
    the wake-up; benchmarks/allocations.py measures both.)"""
    n = 200
    futures: list[asyncio.Future[None]] = []
    alive: list[int] = []

    class Waiting(EndingEnv):
        async def step(self, action):
            future = asyncio.get_running_loop().create_future()
            futures.append(future)
            await future
            return 0, 0.0, False, False, {}

    def settle(hops):
        if hops:
            asyncio.get_running_loop().call_soon(settle, hops - 1)
            return
        alive.append(len(gc.get_objects(0)))
        for future in futures:
            future.set_result(None)

    async with aiovec.AsyncioVectorEnv([lambda: Waiting(True)] * n) as venv:
        await venv.reset()
        actions = np.zeros(n, np.int64)
        asyncio.get_running_loop().call_soon(settle, 3)
        await venv.step(actions)  # lanes made
        futures.clear()
        alive.clear()
        gc.collect()
        gc.disable()
        try:
            before = len(gc.get_objects(0))
            asyncio.get_running_loop().call_soon(settle, 3)
            await venv.step(actions)
        finally:
            gc.enable()
        # the env's own: its step coroutine, its future, the future's iterator; and a
        # fixed few for the vector call itself (its coroutines, the op, lists)
        assert alive[0] - before <= (3 + 2) * n + 50


class _Reply:
    """An awaitable that is not a coroutine: it waits (or not), then gives its value."""

    def __init__(self, value, waits):
        self.value, self.waits = value, waits

    def __await__(self):
        if self.waits:
            yield from asyncio.sleep(0).__await__()
        return self.value


class AwaitableStepEnv(gymnasium.Env[int, int]):
    """``step`` returns an awaitable of another kind (a coroutine function marked as one
    with ``inspect.markcoroutinefunction`` may); the test treats the env as async."""

    observation_space = DISCRETE
    action_space = DISCRETE

    def __init__(self, waits):
        self.waits = waits

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        return _Reply((int(action), 1.0, False, False, {}), self.waits)


@pytest.mark.asyncio
@pytest.mark.parametrize("waits", [False, True])
async def test_a_step_that_returns_another_awaitable_is_awaited(monkeypatch, waits):
    monkeypatch.setattr("aiovec.backends.inline.is_async_env", lambda env: True)
    async with aiovec.AsyncioVectorEnv([lambda: AwaitableStepEnv(waits)] * 3) as venv:
        await venv.reset()
        obs, rewards, *_ = await venv.step(np.array([1, 2, 3]))
        assert obs.tolist() == [1, 2, 3]
        assert rewards.tolist() == [1.0, 1.0, 1.0]
