"""Envs grouped on workers keep the promises of one loop (issue 15).

- ``recv(min_envs=k)`` returns as soon as any k envs have finished, whichever
  workers they are on: a finished env is never held back by a slower env of its
  worker (only a sync env cannot *start* before the sync env ahead of it ends);
- an async env past its timeout is cancelled inside its worker, which goes on;
- ``close()`` after a timeout, a Ctrl-C or a killed worker is prompt, and raises
  nothing for envs whose failure was reported already.

Gates (``aiovec.testing.Gate``) hold an env in its call until the test
releases it; nothing here waits on a sleep.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import HAVE_RAY, RAY_ACTORS
from faults.scenarios import Once

import aiovec
from aiovec._core.calls import RENDER
from aiovec._core.ops import CallOp
from aiovec.backends.process import child
from aiovec.testing import AsyncHangingEnv, FaultyEnv, Gate, HangingEnv, KillingEnv, SpaceEnv

N = 4  # on 2 workers: envs 0-1 and 2-3
ACTIONS = np.zeros(N, np.int64)


def _env(gate: Gate | None, flavour: str) -> Any:
    """A long-episode env; its first step waits on ``gate`` (if any)."""
    env = SpaceEnv(min_len=1000, max_len=1000)
    if flavour == "async":  # every env async; one that never waits has an unused gate
        return AsyncHangingEnv(env, gate or _NEVER, at=1 if gate else 1 << 30)
    if gate is None:
        return env
    return HangingEnv(env, gate, at=1, give_up_after=30.0)


def _fns(hanging: dict[int, Gate], flavour: str) -> list[Any]:
    return [functools.partial(_env, hanging.get(i), flavour) for i in range(N)]


class _Unused(Gate):
    def __init__(self) -> None:  # no pipe: never waited on
        pass


_NEVER = _Unused()


GROUPED = ["process", pytest.param("ray", marks=pytest.mark.ray)]


def _grouped(backend: str) -> dict[str, Any]:
    """The arguments of a vector env on ``backend`` (2 workers; ray: the test pool)."""
    if backend == "ray" and not HAVE_RAY:
        pytest.skip('needs the "ray" extra: pip install "aiovec[ray]"')
    kwargs: dict[str, Any] = {"backend": backend, "num_workers": 2}
    if backend == "ray" and RAY_ACTORS:
        kwargs["backend_options"] = {"actor_pool": RAY_ACTORS[0]}
    return kwargs


def _children() -> list[Any]:
    import multiprocessing

    return multiprocessing.active_children()


@pytest.mark.parametrize(
    ("slow", "flavour", "first", "then"),
    [
        # env 3 waits; env 2, before it in the same worker, is not held back
        pytest.param(3, "sync", [0, 1, 2], [3], id="sync-env-after-it"),
        pytest.param(3, "async", [0, 1, 2], [3], id="async-env-after-it"),
        # env 2 waits; env 3 after it is async: it runs meanwhile
        pytest.param(2, "async", [0, 1, 3], [2], id="async-env-before-it"),
        # the one inherent limit: a sync env cannot start before the sync env ahead of it
        pytest.param(2, "sync", [0, 1], [2, 3], id="sync-env-before-it"),
    ],
)
@pytest.mark.parametrize("backend", GROUPED)
@pytest.mark.asyncio
async def test_recv_takes_each_env_as_it_finishes(tmp_path, backend, slow, flavour, first, then):
    gate = Gate(tmp_path)
    venv = aiovec.AsyncioVectorEnv(_fns({slow: gate}, flavour), **_grouped(backend))
    try:
        await venv.reset(seed=0)
        venv.send(ACTIONS)
        *_, ids = await venv.recv(min_envs=3, timeout=None if len(first) == 3 else 0.5)
        assert ids.tolist() == first
        gate.release()
        *_, ids = await venv.recv()
        assert ids.tolist() == then
    finally:
        gate.release()
        await venv.close()
    assert not _children()


def test_recv_takes_a_finished_env_before_the_slower_one_blocking(tmp_path):
    gate = Gate(tmp_path)
    with aiovec.BlockingVectorEnv(
        _fns({3: gate}, "sync"), backend="process", num_workers=2
    ) as venv:
        try:
            venv.reset(seed=0)
            venv.send(ACTIONS)
            *_, ids = venv.recv(min_envs=3)
            assert ids.tolist() == [0, 1, 2]
            gate.release()
            *_, ids = venv.recv()
            assert ids.tolist() == [3]
        finally:
            gate.release()
    assert not _children()


@pytest.mark.parametrize("backend", GROUPED)
@pytest.mark.asyncio
async def test_rows_and_env_ids_match_what_each_env_returned(tmp_path, backend):
    """Rows streamed from both workers, in any order, are each env's own transition."""
    gate = Gate(tmp_path)
    fns = [functools.partial(_Echo, i, gate if i == 1 else None) for i in range(N)]
    venv = aiovec.AsyncioVectorEnv(fns, **_grouped(backend))
    try:
        await venv.reset(seed=0)
        venv.send(np.array([5, 7], np.int64), env_ids=[1, 3])
        obs, rewards, _, _, infos, ids = await venv.recv(min_envs=1)
        assert ids.tolist() == [3]
        assert infos["odd"].tolist() == [3]
        assert infos["_odd"].tolist() == [True]
        assert obs.tolist() == [[3, 7]]
        assert rewards.tolist() == [7.0]
        venv.send(np.array([2, 4], np.int64), env_ids=[3, 2])
        obs, rewards, _, _, infos, ids = await venv.recv(min_envs=2)
        assert ids.tolist() == [2, 3]
        assert "odd" not in infos
        assert obs.tolist() == [[2, 4], [3, 2]]
        assert rewards.tolist() == [4.0, 2.0]
        gate.release()
        obs, rewards, _, _, infos, ids = await venv.recv()
        assert ids.tolist() == [1]
        assert infos["odd"].tolist() == [1]
        assert obs.tolist() == [[1, 5]]
        assert rewards.tolist() == [5.0]
    finally:
        gate.release()
        await venv.close()


class _Echo(gymnasium.Env[np.ndarray, int]):
    """Observes (its index, the last action), rewarded the action; env 1 may wait on a gate."""

    observation_space = gymnasium.spaces.Box(0, 100, (2,), np.int64)
    action_space = gymnasium.spaces.Discrete(10)

    def __init__(self, index: int, gate: Gate | None) -> None:
        self.index, self.gate = index, gate

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([self.index, 0]), {}

    def step(self, action):
        if self.gate is not None:
            self.gate.wait(30.0)
        info = {"odd": self.index} if action % 2 else {}  # infos travel beside the rows
        return np.array([self.index, int(action)]), float(action), False, False, info


def _workers(venv: Any) -> list[Any]:
    """The worker processes of ``venv`` (a replaced one is a new object)."""
    return list(venv._backend.workers)


@pytest.mark.parametrize("backend", GROUPED)
@pytest.mark.asyncio
async def test_an_async_env_past_its_timeout_is_cancelled_in_its_worker(tmp_path, backend):
    gate = Gate(tmp_path)  # never released before the end: only a cancel ends env 1's step
    venv = aiovec.AsyncioVectorEnv(
        _fns({1: gate}, "async"), step_timeout=0.5, reset_timeout=10.0, **_grouped(backend)
    )
    try:
        await venv.reset(seed=0)
        workers = _workers(venv)
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.step(ACTIONS)
        # env 0, on the same worker, answered in time: its result is not held back
        assert set(info.value.errors) == {1}
        # the worker cancelled env 1's step and is healthy: reset goes to it
        await venv.reset(seed=1)
        assert _workers(venv) == workers
        assert await venv.get_attr("cancelled") == (0, 1, 0, 0)
        await venv.step(ACTIONS)
    finally:
        gate.release()
        await venv.close()


@pytest.mark.parametrize("backend", GROUPED)
@pytest.mark.asyncio
async def test_a_sent_async_env_past_its_timeout_is_cancelled_in_its_worker(tmp_path, backend):
    gate = Gate(tmp_path)  # never released before the end: only a cancel ends env 1's step
    venv = aiovec.AsyncioVectorEnv(_fns({1: gate}, "async"), step_timeout=0.5, **_grouped(backend))
    try:
        await venv.reset(seed=0)
        workers = _workers(venv)
        venv.send(ACTIONS)
        *_, env_ids = await venv.recv(min_envs=3)  # env 0 is not held back by env 1
        assert env_ids.tolist() == [0, 2, 3]
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.recv()
        assert set(info.value.errors) == {1}
        # cancelled in its worker, which goes on: nothing replaced, env 1 steps again
        await venv.reset(seed=1)
        assert _workers(venv) == workers
        assert await venv.get_attr("cancelled") == (0, 1, 0, 0)
        venv.send(ACTIONS[:2], [0, 1])
        *_, env_ids = await venv.recv()
        assert env_ids.tolist() == [0, 1]
    finally:
        gate.release()
        await venv.close()


def _sync_then_async(first: Once, gate: Gate) -> Any:
    """A sync env whose first step raises; rebuilt, an async env whose first step waits."""
    env = SpaceEnv(min_len=1000, max_len=1000)
    if first.take():
        return FaultyEnv(env, method="step", at=1)
    return AsyncHangingEnv(env, gate, at=1)


@pytest.mark.asyncio
async def test_an_env_rebuilt_async_is_cancelled_in_its_worker(tmp_path, caplog):
    # The worker says which envs it rebuilt are async: a timeout of the async env
    # then cancels it in its worker, instead of blocking (and replacing) the worker.
    # (A Ray actor answers a whole step once: its sync env 0 would time out with
    # env 1, and a restart replaces an actor whose sync env it abandoned.)
    gate = Gate(tmp_path)
    fns = _fns({}, "sync")
    fns[1] = functools.partial(_sync_then_async, Once(tmp_path), gate)
    venv = aiovec.AsyncioVectorEnv(fns, step_timeout=0.5, on_error="restart", **_grouped("process"))
    try:
        await venv.reset(seed=0)
        workers = _workers(venv)
        await venv.step(ACTIONS)  # env 1 raises: rebuilt in its worker, now async
        await venv.step(ACTIONS)  # env 1's restarted row ended its episode: it resets
        *_, infos = await venv.step(ACTIONS)  # env 1 waits past its timeout: cancelled, rebuilt
        assert "did not answer step() within 0.5 s" in infos["error"][1]
        assert _workers(venv) == workers
        assert "replacing" not in caplog.text
    finally:
        gate.release()
        await venv.close()


@pytest.mark.parametrize("backend", GROUPED)
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.asyncio
async def test_close_after_a_step_timeout_is_prompt_and_raises_nothing(tmp_path, backend, flavour):
    gate = Gate(tmp_path)
    venv = aiovec.AsyncioVectorEnv(_fns({1: gate}, flavour), step_timeout=0.5, **_grouped(backend))
    try:
        await venv.reset(seed=0)
        with pytest.raises(aiovec.EnvTimeoutError):
            await venv.step(ACTIONS)
        started = time.perf_counter()
        await venv.close()  # env 0 was healthy; env 1's failure was reported
        assert time.perf_counter() - started < 5.0  # was 10 s and an EnvError
    finally:
        gate.release()
    assert not _children()


@pytest.mark.asyncio
async def test_a_call_on_a_worker_blocked_in_a_sync_env_fails_at_once(tmp_path):
    gate = Gate(tmp_path)
    venv = aiovec.AsyncioVectorEnv(
        _fns({1: gate}, "sync"), backend="process", num_workers=2, step_timeout=0.5
    )
    try:
        await venv.reset(seed=0)
        pids = venv._backend.pids  # type: ignore[union-attr]
        venv.send(ACTIONS)
        with pytest.raises(aiovec.EnvTimeoutError):
            await venv.recv()
        backend: Any = venv._backend
        backend.launch([0, 2], CallOp([RENDER] * 2, "render"))  # env 0 shares env 1's worker
        _, errors = backend.take()  # no wait: env 0 failed at once
        assert list(errors) == [0]
        assert isinstance(errors[0], TimeoutError)
        assert "still runs the step() call of env 1, abandoned" in str(errors[0])
        await backend.collect(1)  # env 2's render, on the other worker
        assert backend.lost == frozenset({0, 1})
        await venv.reset(seed=1)  # replaces the blocked worker, as a dead one
        assert venv._backend.pids[0] != pids[0]  # type: ignore[union-attr]
        assert venv._backend.pids[1] == pids[1]  # type: ignore[union-attr]
        gate.release()  # the rebuilt env 1 waits on the same gate
        venv.send(ACTIONS[:2], env_ids=[0, 1])
        *_, ids = await venv.recv()
        assert ids.tolist() == [0, 1]
    finally:
        gate.release()
        await venv.close()
    assert not _children()


@pytest.mark.parametrize("backend", GROUPED)
def test_close_after_ctrl_c_mid_step_is_prompt_and_raises_nothing(tmp_path, backend):
    gate = Gate(tmp_path)
    fns = _fns({1: gate}, "sync")
    fns[2] = functools.partial(_Interrupting, SpaceEnv(min_len=1000, max_len=1000), os.getpid())
    venv = aiovec.BlockingVectorEnv(fns, **_grouped(backend))
    try:
        venv.reset(seed=0)
        with pytest.raises(KeyboardInterrupt):
            venv.step(ACTIONS)
        started = time.perf_counter()
        venv.close()
        assert time.perf_counter() - started < 5.0
    finally:
        gate.release()
        venv.close()
    assert not _children()


class _Interrupting(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Its first step presses Ctrl-C for the parent process (from a worker)."""

    def __init__(self, env: Any, parent: int) -> None:
        super().__init__(env)
        self.parent, self.pressed = parent, False

    def step(self, action: Any) -> Any:
        if not self.pressed:
            self.pressed = True
            os.kill(self.parent, signal.SIGINT)
        return super().step(action)


@pytest.mark.parametrize("backend", GROUPED)
@pytest.mark.asyncio
async def test_close_after_a_worker_was_killed_raises_nothing(tmp_path, backend):
    fns = _fns({}, "sync")
    fns[1] = functools.partial(KillingEnv, SpaceEnv(min_len=1000, max_len=1000), spare=os.getpid())
    venv = aiovec.AsyncioVectorEnv(fns, **_grouped(backend))
    try:
        await venv.reset(seed=0)
        with pytest.raises(aiovec.WorkerDiedError):
            await venv.step(ACTIONS)
    finally:
        await venv.close()
    assert not _children()


def test_a_worker_runs_its_envs_on_uvloop_where_it_is_installed():
    uvloop = pytest.importorskip(
        "uvloop", reason='needs the "uvloop" extra: pip install "aiovec[uvloop]"'
    )
    loop = child.new_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
