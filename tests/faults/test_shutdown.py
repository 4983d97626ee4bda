"""Cancellation and shutdown: afterwards no task, thread, child, fd or shared memory is left.

Every test here runs under the suite's leak check (``leak_check``, autouse);
the ones in a running loop also check ``asyncio.all_tasks()`` and, for garbage
collection, check everything while the loop still runs.  Envs hang on a
:class:`~aiovec.testing.Gate`, so a call is really in flight when it is
cancelled, interrupted or closed; gates are released before the vector env is
closed (a thread or a worker blocked in an env cannot be interrupted).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import Lockstep, require_async_envs
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec._core.lifecycle import State
from aiovec.testing import AsyncHangingEnv, FaultyEnv, Gate, HangingEnv, SpaceEnv
from faults.conftest import skip_unless_available
from faults.leaks import LeakCheck, checking, pending_tasks
from faults.scenarios import GROUP_BACKENDS, LONG, NUM_ENVS, actions_for, space_env

pytestmark = pytest.mark.timeout(60)

# (backend, flavour) where an env can wait on a gate without blocking the event loop
WAITING_SETUPS = [
    ("inline", "async"),
    ("thread", "sync"),
    ("process", "sync"),
    ("process", "async"),
    ("ray", "sync"),
    ("ray", "async"),
]
ALL_SETUPS = [("inline", "sync"), *WAITING_SETUPS]


def hanging(gate: Gate, flavour: str) -> Any:
    """A factory of envs whose first step waits on ``gate``."""
    return functools.partial(_hanging, gate, flavour)


def _hanging(gate: Gate, flavour: str) -> Any:
    cls = AsyncHangingEnv if flavour == "async" else HangingEnv
    return cls(space_env(LONG), gate, at=1)


def plain() -> Any:
    return space_env(LONG)


def setup_or_skip(backend: str, flavour: str) -> None:
    skip_unless_available(backend)
    if flavour == "async":
        require_async_envs(backend)


async def in_flight(venv: aiovec.AsyncioVectorEnv[Any, Any]) -> asyncio.Task[Any]:
    """Start a step and return once it waits on its envs."""
    step = asyncio.ensure_future(venv.step(actions_for(1)))
    await asyncio.sleep(0)  # one yield: the loop runs the new task up to its first wait
    assert venv.state is State.BUSY
    return step


def kwargs_for(backend: str) -> dict[str, Any]:
    return {"num_workers": 2} if backend in GROUP_BACKENDS else {}


async def recovers(venv: aiovec.AsyncioVectorEnv[Any, Any]) -> None:
    """After ``reset()`` the vector env steps exactly like the oracle."""
    oracle = SyncVectorEnv([plain] * NUM_ENVS)
    try:
        want = oracle.reset(seed=8)
        got = await venv.reset(seed=8)
        np.testing.assert_array_equal(got[0], want[0])
        for step in range(2, 5):
            got = await venv.step(actions_for(step))
            want = oracle.step(actions_for(step))
            for g, w in zip(got[:4], want[:4], strict=True):
                np.testing.assert_array_equal(g, w)
    finally:
        oracle.close()


# --------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize(("backend", "flavour"), WAITING_SETUPS)
@pytest.mark.asyncio
async def test_cancelling_the_task_awaiting_step(backend, flavour, gates):
    setup_or_skip(backend, flavour)
    gate = gates()
    venv = aiovec.AsyncioVectorEnv([hanging(gate, flavour)] * NUM_ENVS, backend=backend)
    try:
        await venv.reset(seed=1)
        step = await in_flight(venv)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        assert venv.state is State.BROKEN
        with pytest.raises(aiovec.StateError, match="interrupted"):
            await venv.step(actions_for(1))
        if backend == "inline":  # each env's own call was cancelled and unwound
            assert [env.cancelled for env in venv.envs] == [1] * NUM_ENVS
        gate.release()  # thread/process calls cannot be interrupted: they end late
        await recovers(venv)
    finally:
        gate.release()
        await venv.close()
    assert pending_tasks(asyncio.get_running_loop()) == []


# --------------------------------------------------------------------------- close in flight


@pytest.mark.parametrize(("backend", "flavour"), WAITING_SETUPS)
@pytest.mark.asyncio
async def test_close_while_a_step_is_in_flight(backend, flavour, gates):
    setup_or_skip(backend, flavour)
    gate = gates()
    fns = [hanging(gate, flavour)] * NUM_ENVS
    venv = aiovec.AsyncioVectorEnv(fns, backend=backend, **kwargs_for(backend))
    await venv.reset(seed=1)
    step = await in_flight(venv)
    # A blocked thread or worker finishes its (abandoned) call once the step has
    # given up; only then can it close its env.
    step.add_done_callback(lambda _: gate.release())
    await venv.close()
    with pytest.raises(aiovec.ClosedError, match="in flight"):
        await step
    assert venv.closed
    assert pending_tasks(asyncio.get_running_loop()) == []
    if backend == "inline":
        assert [env.cancelled for env in venv.envs] == [1] * NUM_ENVS
    await venv.close()  # idempotent


# --------------------------------------------------------------------------- Ctrl-C


class Interrupting(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Its first step presses Ctrl-C for the test process, then waits on a gate.

    SIGINT goes to the test's main thread (from an env's thread) or process (from a
    worker process).
    """

    def __init__(self, gate: Gate, pid: int, thread: int) -> None:
        super().__init__(space_env(LONG))
        self.gate, self.pid, self.thread = gate, pid, thread
        self.steps = 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 1:
            if os.getpid() == self.pid:
                signal.pthread_kill(self.thread, signal.SIGINT)
            else:
                os.kill(self.pid, signal.SIGINT)
            self.gate.wait(60)
        return self.env.step(action)


class AsyncInterrupting(AsyncHangingEnv):
    """The async :class:`Interrupting`: raises SIGINT from inside the event loop."""

    async def step(self, action: Any) -> Any:
        if not self.counts.get("step"):
            asyncio.get_running_loop().call_soon(signal.raise_signal, signal.SIGINT)
        return await super().step(action)


def interrupting(gate: Gate, flavour: str, backend: str) -> Any:
    if flavour == "async" and backend not in GROUP_BACKENDS:
        return functools.partial(_async_interrupting, gate)
    sync = functools.partial(Interrupting, gate, os.getpid(), threading.main_thread().ident)
    if flavour == "async":
        return functools.partial(_twin_of, sync)
    return sync


def _async_interrupting(gate: Gate) -> Any:
    return AsyncInterrupting(space_env(LONG), gate, at=1)


def _twin_of(fn: Any) -> Any:
    return aiovec.testing.AsyncTwin(fn(), max_yields=0)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
@pytest.mark.parametrize(("backend", "flavour"), WAITING_SETUPS)
def test_ctrl_c_in_the_blocking_wrapper(backend, flavour, gates):
    setup_or_skip(backend, flavour)
    gate = gates()
    fns = [interrupting(gate, flavour, backend)] + [hanging(gate, flavour)] * (NUM_ENVS - 1)
    envs = aiovec.BlockingVectorEnv(fns, backend=backend, **kwargs_for(backend))
    oracle = SyncVectorEnv([plain] * NUM_ENVS)
    try:
        envs.reset(seed=1)
        oracle.reset(seed=1)
        with pytest.raises(KeyboardInterrupt):
            envs.step(actions_for(1))
        assert envs.state is State.BROKEN
        with pytest.raises(aiovec.StateError, match="interrupted"):
            envs.step(actions_for(1))
        gate.release()
        lock = Lockstep(envs, oracle)
        lock.reset(seed=9)
        for step in range(2, 5):
            lock.step(actions_for(step))
    finally:
        gate.release()
        envs.close()
        oracle.close()


# --------------------------------------------------------------------------- closing


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
@pytest.mark.asyncio
async def test_close_releases_everything_even_while_the_object_lives(backend):
    check = LeakCheck.start()
    venv = aiovec.AsyncioVectorEnv([plain] * NUM_ENVS, backend=backend)
    await venv.reset(seed=0)
    await venv.step(actions_for(1))
    await venv.close()
    assert check.finish() == []
    assert venv.closed  # still referenced here, on purpose


class ThreadNoting(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Notes the thread it was built on and the threads its ``close`` ran on."""

    def __init__(self, env: Any, closed_on: dict[int, list[int]], index: int) -> None:
        super().__init__(env)
        self.built_on, self.index = threading.get_ident(), index
        self.closed_on = closed_on.setdefault(index, [])

    def close(self) -> None:
        self.closed_on.append(threading.get_ident())
        super().close()


def _noting(closed_on: dict[int, list[int]], index: int, obs_space: Any = None) -> Any:
    return ThreadNoting(SpaceEnv(obs_space, min_len=50, max_len=50), closed_on, index)


def worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aiovec-env-worker")]


@pytest.mark.parametrize(
    ("last", "error", "match"),
    [
        ("other-spaces", ValueError, "all envs must share one observation_space"),
        ("factory-raises", aiovec.EnvError, r"env_fns\[3\]\(\)"),
    ],
    ids=["other-spaces", "factory-raises"],
)
def test_a_failed_thread_construction_closes_each_env_on_its_thread(last, error, match):
    """Every env built is closed on the thread it was built on; every thread is stopped."""
    before = set(worker_threads())
    closed_on: dict[int, list[int]] = {}
    built: list[Any] = []

    def factory(i: int) -> Any:
        if i == 3 and last == "factory-raises":
            raise ConnectionRefusedError("no server")
        other = spaces.Box(-1.0, 1.0, (4,), np.float32) if i == 3 else None
        built.append(_noting(closed_on, i, other))
        return built[-1]

    fns = [functools.partial(factory, i) for i in range(NUM_ENVS)]
    with pytest.raises(error, match=match):
        aiovec.AsyncioVectorEnv(fns, backend="thread")
    assert set(worker_threads()) <= before, "threads still run after the error"
    assert len(built) == (NUM_ENVS if last == "other-spaces" else NUM_ENVS - 1)
    for env in built:
        assert env.closed_on == [env.built_on], f"env {env.index} closed on the wrong thread"
        assert env.built_on != threading.get_ident()


def failing_close(flavour: str) -> Any:
    return functools.partial(_failing_close, flavour)


def _failing_close(flavour: str) -> Any:
    env = FaultyEnv(space_env(LONG), method="close", at=1)
    return aiovec.testing.AsyncTwin(env) if flavour == "async" else env


@pytest.mark.parametrize(("backend", "flavour"), ALL_SETUPS)
@pytest.mark.asyncio
async def test_an_env_whose_close_raises_is_named_and_everything_is_released(backend, flavour):
    setup_or_skip(backend, flavour)
    fns = [plain, failing_close(flavour), plain, plain]
    venv = aiovec.AsyncioVectorEnv(fns, backend=backend, **kwargs_for(backend))
    await venv.reset(seed=0)
    with pytest.raises(aiovec.EnvError, match=r"in close\(\)") as info:
        await venv.close()
    assert set(info.value.errors) == {1}
    assert venv.closed
    await venv.close()  # idempotent: no second error
    assert pending_tasks(asyncio.get_running_loop()) == []


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
def test_blocking_close_that_raises_still_closes(backend):
    envs = aiovec.BlockingVectorEnv([plain, failing_close("sync")], backend=backend)
    envs.reset(seed=0)
    with pytest.raises(aiovec.EnvError, match=r"in close\(\)"):
        envs.close()
    try:
        assert envs.closed
        envs.close()  # idempotent
    finally:
        envs.closed = True  # whatever happened, garbage collection must stay silent


# --------------------------------------------------------------------------- garbage collection


GC_SETUPS = [("inline", "sync"), ("inline", "async"), *WAITING_SETUPS[1:3]]


def drop(held: list[Any]) -> None:
    """Drop the last reference to a vector env and collect garbage."""
    held.clear()
    gc.collect()


def drop_on_a_thread(held: list[Any]) -> None:
    """:func:`drop`, on a thread of its own (garbage collection can happen on any thread)."""
    thread = threading.Thread(target=drop, args=(held,))
    thread.start()
    thread.join()


def waiting_twin() -> Any:
    """An async env that really suspends (so its lane task exists)."""
    return aiovec.testing.AsyncTwin(space_env(LONG), max_yields=2, seed=4)


class Cycle:
    """Holds a vector env in a reference cycle: only the cycle collector frees it."""

    def __init__(self, venv: Any) -> None:
        self.venv, self.me = venv, self


GC_CASES = [
    *[pytest.param(*setup, "freed", id=f"{setup[0]}-{setup[1]}-freed") for setup in GC_SETUPS],
    *[pytest.param(*setup, "in-a-cycle", id=f"{setup[0]}-{setup[1]}-cycle") for setup in GC_SETUPS],
    pytest.param("inline", "async", "on-a-thread", id="inline-async-on-a-thread"),
]


@pytest.mark.parametrize(("backend", "flavour", "how"), GC_CASES)
@pytest.mark.asyncio
async def test_garbage_collecting_an_unclosed_vector_env(backend, flavour, how, caplog, leak_check):
    """Inside a running loop: a ResourceWarning, and then nothing is left behind.

    The vector env is freed when its last reference goes, or by the cycle
    collector, or on another thread (whose collection must not touch the loop).
    """
    setup_or_skip(backend, flavour)
    leak_check.grace = 1.0  # (a leak need not be waited for long)
    fns = [waiting_twin if flavour == "async" else plain] * NUM_ENVS
    with checking(grace=1.0):
        venv = aiovec.AsyncioVectorEnv(fns, backend=backend)
        await venv.reset(seed=0)
        await venv.step(actions_for(1))
        held: list[Any] = [Cycle(venv) if how == "in-a-cycle" else venv]
        del venv
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            lanes = pending_tasks(asyncio.get_running_loop())
            with pytest.warns(ResourceWarning, match="never closed"):
                (drop_on_a_thread if how == "on-a-thread" else drop)(held)
            if how == "on-a-thread":  # it asked the loop to cancel the lanes, not did it itself
                assert lanes, "the async envs' lane tasks should be waiting"
                assert [task.cancelling() for task in lanes] == [0] * len(lanes)
            await asyncio.sleep(0)  # let the loop run callbacks made by the collection
            await asyncio.sleep(0)  # (a callback from another thread: then the lanes end)
        assert pending_tasks(asyncio.get_running_loop()) == []
        assert "destroyed but it is pending" not in caplog.text


@pytest.mark.parametrize(("backend", "flavour"), GC_SETUPS)
def test_garbage_collecting_an_unclosed_blocking_vector_env(backend, flavour):
    setup_or_skip(backend, flavour)
    fns = [waiting_twin if flavour == "async" else plain] * NUM_ENVS
    with checking():
        envs = aiovec.BlockingVectorEnv(fns, backend=backend)
        envs.reset(seed=0)
        envs.step(actions_for(1))
        held = [envs]
        del envs
        with pytest.warns(ResourceWarning, match="never closed"):
            drop(held)
