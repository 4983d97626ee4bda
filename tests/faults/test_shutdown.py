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
import socket
import threading
import time
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import Lockstep
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec._core.lifecycle import State
from aiovec.backends import _drive
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


class SignalsItsOwnThread(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Its first step sends SIGINT to the env's own thread, then waits on a gate.

    It first waits until the main thread sleeps in ``epoll_wait`` (the kernel
    says so in ``/proc``).  CPython runs a signal's C-level handler in whichever
    thread the signal hits and leaves the Python-level handler to the main
    thread, so a main thread asleep in ``epoll_wait`` is not interrupted: it
    learns of the signal only through a wakeup fd.  This is what a SIGINT that
    lands just before the main thread enters ``epoll_wait`` looks like, made
    deterministic.  ``gave_up`` records whether the gate wait ran out (the main
    thread never came to interrupt it).
    """

    def __init__(self, gate: Gate, main_thread: int) -> None:
        super().__init__(space_env(LONG))
        self.gate, self.main_thread = gate, main_thread
        self.steps = 0
        self.gave_up: bool | None = None

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == 1:
            wait_until_in_epoll_wait(self.main_thread, timeout=30)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            self.gave_up = not self.gate.wait(30)
        return self.env.step(action)


def wait_until_in_epoll_wait(native_id: int, timeout: float) -> None:
    """Return once thread ``native_id`` of this process sleeps in ``epoll_wait``."""
    path = f"/proc/self/task/{native_id}/wchan"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path) as file:  # a state the kernel reports, not a guess from a clock
            where = file.read()
        if where in {"do_epoll_wait", "ep_poll"}:  # the names of that wait across kernels
            return
    raise AssertionError(f"thread {native_id} never slept in epoll_wait within {timeout} s")


def epoll_wait_visible() -> bool:
    """Whether the kernel tells which call a thread sleeps in (Linux ``/proc``)."""
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/wchan")


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
@pytest.mark.skipif(not epoll_wait_visible(), reason="needs /proc/self/task/*/wchan (Linux)")
def test_ctrl_c_that_hits_an_env_thread_still_interrupts_the_blocking_wrapper(gates):
    gate = gates()
    interrupting = SignalsItsOwnThread(gate, threading.get_native_id())
    fns = [lambda: interrupting] + [hanging(gate, "sync")] * (NUM_ENVS - 1)
    envs = aiovec.BlockingVectorEnv(fns, backend="thread")
    try:
        envs.reset(seed=1)
        with pytest.raises(KeyboardInterrupt):
            envs.step(actions_for(1))
        # The interrupt came while the env still waited, not once it gave up.
        assert interrupting.gave_up is None
        assert envs.state is State.BROKEN
    finally:
        gate.release()
        envs.close()
    assert interrupting.gave_up is False


class SignalsOnStep(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Each step, once the main thread sleeps in the loop, sends SIGUSR1 to its own thread."""

    def __init__(self, main_thread: int) -> None:
        super().__init__(space_env(LONG))
        self.main_thread = main_thread

    def step(self, action: Any) -> Any:
        wait_until_in_epoll_wait(self.main_thread, timeout=30)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        return self.env.step(action)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
@pytest.mark.skipif(not epoll_wait_visible(), reason="needs /proc/self/task/*/wchan (Linux)")
def test_a_wakeup_fd_set_before_is_restored_and_told_of_signals_caught_meanwhile():
    """Another loop's signal handling keeps its wakeup fd and learns of every signal."""
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    handler = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    before = signal.set_wakeup_fd(writer.fileno())
    main_thread = threading.get_native_id()
    envs = aiovec.BlockingVectorEnv(
        [functools.partial(SignalsOnStep, main_thread)] * NUM_ENVS, backend="thread"
    )
    try:
        envs.reset(seed=0)
        envs.step(actions_for(1))
        assert signal.set_wakeup_fd(writer.fileno()) == writer.fileno()
        caught = reader.recv(64)  # one byte per signal, each sent to its own thread
        assert caught == bytes([signal.SIGUSR1] * NUM_ENVS)
    finally:
        envs.close()
        signal.set_wakeup_fd(before)
        signal.signal(signal.SIGUSR1, handler)
        reader.close()
        writer.close()


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
@pytest.mark.skipif(not epoll_wait_visible(), reason="needs /proc/self/task/*/wchan (Linux)")
@pytest.mark.timeout(30, method="thread")  # forwarding to itself spins past a signal timeout
def test_a_wakeup_fd_left_installed_by_a_cut_short_call_is_never_forwarded_to():
    """A Ctrl-C between two bytecodes can leave the runner's own fd installed."""
    main_thread = threading.get_native_id()
    envs = aiovec.BlockingVectorEnv(
        [functools.partial(SignalsOnStep, main_thread)] * NUM_ENVS, backend="thread"
    )
    handler = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    before = signal.set_wakeup_fd(-1)
    try:
        envs.reset(seed=0)  # waits in the loop: the runner has its wakeup fd now
        own = envs._runner._wakeup._fd
        signal.set_wakeup_fd(own)  # as if the last restore had been cut short
        envs.step(actions_for(1))  # signals while it waits: forwarding to itself would spin
        assert signal.set_wakeup_fd(-1) == -1
    finally:
        envs.close()
        signal.set_wakeup_fd(before)
        signal.signal(signal.SIGUSR1, handler)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(), reason="signals: main thread"
)
def test_closing_the_signal_wakeup_uninstalls_its_own_fd_and_no_other():
    """A closed fd's number is soon reused: the signal handler must not write there."""
    from aiovec._runner import _SignalWakeup

    loop = asyncio.new_event_loop()
    before = signal.set_wakeup_fd(-1)
    other, spare = socket.socketpair()
    other.setblocking(False)  # as set_wakeup_fd requires
    try:
        wakeup = _SignalWakeup(loop)
        signal.set_wakeup_fd(wakeup._fd)  # left installed, as by a cut-short call
        wakeup.close()
        assert signal.set_wakeup_fd(other.fileno()) == -1
        wakeup = _SignalWakeup(loop)
        wakeup.close()
        assert signal.set_wakeup_fd(-1) == other.fileno()  # someone else's: left alone
    finally:
        signal.set_wakeup_fd(before)
        loop.close()
        other.close()
        spare.close()


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


@pytest.mark.parametrize(("backend", "flavour"), [("inline", "async"), ("thread", "sync")])
@pytest.mark.asyncio
async def test_an_env_whose_close_hangs_is_abandoned_after_the_close_timeout(
    backend, flavour, gate, monkeypatch
):
    """Every backend gives an env's ``close()`` the one `_drive.CLOSE_TIMEOUT`."""
    monkeypatch.setattr(_drive, "CLOSE_TIMEOUT", 0.2)
    cls = AsyncHangingEnv if flavour == "async" else HangingEnv
    fns = [plain, lambda: cls(space_env(LONG), gate, method="close")]
    venv = aiovec.AsyncioVectorEnv(fns, backend=backend)
    await venv.reset(seed=0)
    try:
        with pytest.raises(aiovec.EnvError, match=r"in close\(\)") as info:
            await venv.close()
    finally:
        gate.release()  # the abandoned close may end now
    assert set(info.value.errors) == {1}
    assert isinstance(info.value.errors[1], TimeoutError)
    assert "0.2 s" in str(info.value.errors[1])
    assert venv.closed
