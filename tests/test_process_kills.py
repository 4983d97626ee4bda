"""A worker process killed at any instant: its envs fail with `WorkerDiedError`, never a hang.

No lock is shared with a worker, and the parent's one wait watches every
worker's death besides the doorbell: whatever a worker was doing when it died
(stepping, writing its rows, marking them done, ringing, idle between calls),
the parent hears of it at once and fails the envs it can no longer answer for.
First a kill at a random moment, again and again, on both front ends; then
kills at the two instants that matter most to the completion table.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aiovec
from aiovec.backends import process as process_backend
from aiovec.backends.process.table import CompletionTable
from aiovec.testing import TrivialEnv

KILLS = 100
DEATH_BOUND = 5.0
"""Seconds from a kill to the error naming the worker's envs (a death is seen at once:
this bounds a loaded CI machine's scheduling, and tells a hang from a slow run)."""
NUM_ENVS, WORKERS = 6, 2


def _groups(venv: Any) -> list[range]:
    backend = venv.vector_env._backend if hasattr(venv, "vector_env") else venv._backend
    return list(backend.groups)


def _pids(venv: Any) -> tuple[int, ...]:
    backend = venv.vector_env._backend if hasattr(venv, "vector_env") else venv._backend
    return tuple(pid for pid in backend.pids if pid is not None)


class _Killer:
    """Kills a worker, in a thread of its own, at a random moment after `arm`."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.killed_at = 0.0
        self._thread: threading.Thread | None = None

    def arm(self, pid: int) -> None:
        delay = self.random.uniform(0.0, 0.004)  # within a step or two of CartPole-sized envs

        def kill() -> None:
            deadline = time.perf_counter() + delay
            while time.perf_counter() < deadline:  # a precise instant, not a scheduler's
                pass
            self.killed_at = time.perf_counter()
            os.kill(pid, signal.SIGKILL)

        self._thread = threading.Thread(target=kill)
        self._thread.start()

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join()


def _check(error: aiovec.WorkerDiedError, group: range, killed_at: float) -> None:
    assert time.perf_counter() - killed_at < DEATH_BOUND
    assert error.errors, "the error names no env"
    assert set(error.errors) <= set(group)  # only the killed worker's envs
    assert all(isinstance(e, ChildProcessError) for e in error.errors.values())


@pytest.mark.timeout(180)
def test_a_worker_killed_at_random_moments_blocking() -> None:
    killer = _Killer(seed=1)
    actions = np.zeros(NUM_ENVS, np.int64)
    with aiovec.BlockingVectorEnv(
        [TrivialEnv] * NUM_ENVS, backend="process", num_workers=WORKERS
    ) as venv:
        venv.reset(seed=0)
        groups = _groups(venv)
        for kill in range(KILLS):
            w = kill % WORKERS
            killer.arm(_pids(venv)[w])
            try:
                for _ in range(10_000):  # until the death shows (it must, and soon)
                    venv.step(actions)
            except aiovec.WorkerDiedError as error:
                killer.join()
                _check(error, groups[w], killer.killed_at)
            else:
                raise AssertionError(f"kill {kill}: no WorkerDiedError")
            venv.reset(seed=kill)  # a new worker for the group
        _, rewards, *_ = venv.step(actions)
        assert rewards.tolist() == [1.0] * NUM_ENVS


@pytest.mark.timeout(180)
def test_a_worker_killed_at_random_moments_await() -> None:
    killer = _Killer(seed=2)
    actions = np.zeros(NUM_ENVS, np.int64)

    async def main() -> None:
        async with aiovec.AsyncioVectorEnv(
            [TrivialEnv] * NUM_ENVS, backend="process", num_workers=WORKERS
        ) as venv:
            await venv.reset(seed=0)
            groups = _groups(venv)
            for kill in range(KILLS):
                w = kill % WORKERS
                killer.arm(_pids(venv)[w])
                try:
                    for _ in range(10_000):
                        if kill % 2:  # half the time, partial stepping
                            venv.send(actions)
                            await venv.recv(min_envs=NUM_ENVS)
                        else:
                            await venv.step(actions)
                except aiovec.WorkerDiedError as error:
                    killer.join()
                    _check(error, groups[w], killer.killed_at)
                else:
                    raise AssertionError(f"kill {kill}: no WorkerDiedError")
                await venv.reset(seed=kill)
            _, rewards, *_ = await venv.step(actions)
            assert rewards.tolist() == [1.0] * NUM_ENVS

    asyncio.run(main())


# -- the two instants of a publication -------------------------------------------------


def _kill_while_publishing(monkeypatch: pytest.MonkeyPatch, flag: str, before_marks: bool) -> None:
    """While file ``flag`` exists, worker 0 dies as it publishes, its rows written.

    ``before_marks``: before it marks its envs done; else after, before it counts
    them and rings.  The workers are forked: they inherit the patched table.
    """
    parent = os.getpid()
    real = CompletionTable.publish

    def publish(self: CompletionTable, w: int, rows: Any, marks: Any, count: int) -> bool:
        if os.getpid() != parent and w == 0 and os.path.exists(flag):
            if not before_marks:
                self.done[rows] = marks
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, w, rows, marks, count)

    monkeypatch.setattr(process_backend, "START_METHOD", "fork")
    monkeypatch.setattr(CompletionTable, "publish", publish)


@pytest.mark.parametrize("front_end", ["blocking", "await"])
@pytest.mark.parametrize("before_marks", [True, False], ids=["before-marks", "before-ring"])
def test_a_worker_killed_while_publishing(
    front_end: str, before_marks: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Killed after writing its rows: before marking its envs done, they fail with it;
    after, before it counts them and rings, they are done: nothing rings, the parent
    wakes on the death and takes them (this step succeeds), and they fail on their
    next call, lost with their worker."""
    flag = str(tmp_path / "armed")
    _kill_while_publishing(monkeypatch, flag, before_marks)
    actions = np.zeros(NUM_ENVS, np.int64)
    venv = aiovec.BlockingVectorEnv([TrivialEnv] * NUM_ENVS, backend="process", num_workers=2)
    run = _runner(venv, front_end)
    try:
        run("reset")
        open(flag, "w").close()
        if before_marks:
            with pytest.raises(aiovec.WorkerDiedError) as info:
                run("step", actions)
        else:
            _, rewards, *_ = run("step", actions)
            assert rewards.tolist() == [1.0] * NUM_ENVS  # every result came in time
        os.remove(flag)
        if not before_marks:
            with pytest.raises(aiovec.WorkerDiedError) as info:
                run("step", actions)
        assert set(info.value.errors) == set(_groups(venv)[0])
        run("reset")
        _, rewards, *_ = run("step", actions)
        assert rewards.tolist() == [1.0] * NUM_ENVS
    finally:
        venv.close()


def _runner(venv: aiovec.BlockingVectorEnv, front_end: str) -> Callable[..., Any]:
    """``run(name, *args)``: the call through the blocking front end, or awaited on a loop."""
    if front_end == "blocking":
        return lambda name, *args: getattr(venv, name)(*args)

    def run(name: str, *args: Any) -> Any:
        async def call() -> Any:
            return await getattr(venv.vector_env, name)(*args)

        return venv._runner.run(_on_a_running_loop(call()))

    return run


async def _on_a_running_loop(coro: Any) -> Any:
    """``coro`` as a task of the loop, which then really runs (the await API's waiting)."""
    return await asyncio.ensure_future(coro)
