"""``max_concurrency`` is one rule on every backend (issue 25).

The envs themselves write when each call entered and left ``step()`` (a file
per env under ``tmp_path``), so the count does not trust aiovec: with
``max_concurrency=2`` at most 2 envs are ever inside at once, whichever
workers host them, and more than 1 are (so the check can fail).  A worker runs
its async envs' calls together, so without the limit all of them would be.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from pathlib import Path
from typing import Any

import anyio
import gymnasium
import numpy as np
import pytest
from conftest import HAVE_RAY, RAY_ACTORS
from faults.scenarios import Once

import aiovec
from aiovec.testing import AsyncHangingEnv, Gate, HangingEnv, KillingEnv, SpaceEnv

N = 8
SPACE = gymnasium.spaces.Box(-1e9, 1e9, (2,), np.float64)
WORK = 0.05  # seconds each step takes: a server's round trip (the env's work, no sync)


def _stamp(path: Path, enter: float) -> None:
    with open(path, "a") as file:  # one short line: an atomic append
        file.write(f"{enter} {time.time()}\n")


class StampingEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """A blocking client: each step writes (enter, exit) to its own file."""

    observation_space = action_space = SPACE

    def __init__(self, path: Path, index: int) -> None:
        self.path, self.index, self.count = path, index, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([self.index, 0.0]), {}

    def step(self, action):
        enter = time.time()
        time.sleep(WORK)
        self.count += 1
        _stamp(self.path, enter)
        obs = np.array([self.index, self.count + float(action[0])])
        return obs, float(self.index * self.count), False, False, {}


class AsyncStampingEnv(aiovec.AsyncEnv[np.ndarray, np.ndarray]):
    """An async client: each step awaits its round trip and writes (enter, exit)."""

    observation_space = action_space = SPACE

    def __init__(self, path: Path, index: int) -> None:
        self.path, self.index, self.count = path, index, 0

    async def reset(self, *, seed=None, options=None):
        self.count = 0
        return np.array([self.index, 0.0]), {}

    async def step(self, action):
        enter = time.time()
        await asyncio.sleep(WORK)
        self.count += 1
        _stamp(self.path, enter)
        obs = np.array([self.index, self.count + float(action[0])])
        return obs, float(self.index * self.count), False, False, {}


def _make(cls: type, directory: Path, index: int) -> Any:
    return cls(directory / f"env{index}.txt", index)


def _max_overlap(directory: Path) -> tuple[int, int]:
    """The most envs inside ``step()`` at once, from their own stamps; how many calls."""
    events = []
    for path in directory.glob("env*.txt"):
        for line in path.read_text().splitlines():
            enter, leave = map(float, line.split())
            events += [(enter, 1), (leave, -1)]
    inside = most = 0
    for _, change in sorted(events):  # at a tie, a leave (-1) comes before an enter
        inside += change
        most = max(most, inside)
    return most, len(events) // 2


CASES = [
    pytest.param("inline", AsyncStampingEnv, {}, id="inline-async"),
    pytest.param("thread", StampingEnv, {}, id="thread-sync"),
    pytest.param("process", AsyncStampingEnv, {"num_workers": 2}, id="process-async"),
    pytest.param("process", StampingEnv, {"num_workers": 4}, id="process-sync"),
    pytest.param(
        "ray", AsyncStampingEnv, {"num_workers": 2}, id="ray-async", marks=pytest.mark.ray
    ),
]


def _kwargs(backend: str, extra: dict[str, Any]) -> dict[str, Any]:
    if backend == "ray":
        if not HAVE_RAY:
            pytest.skip('needs the "ray" extra: pip install "aiovec[ray]"')
        if RAY_ACTORS:
            extra = {**extra, "backend_options": {"actor_pool": RAY_ACTORS[0]}}
    return {"backend": backend, **extra}


def _expected(step: int, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    index = np.arange(N, dtype=np.float64)
    return np.stack([index, step + actions[:, 0]], axis=1), index * step


@pytest.mark.parametrize("mode", ["step", "send-recv"])
@pytest.mark.parametrize(("backend", "cls", "extra"), CASES)
@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_at_most_k_envs_inside_step_on_every_backend(tmp_path, backend, cls, extra, mode):
    fns = [functools.partial(_make, cls, tmp_path, i) for i in range(N)]
    kwargs = _kwargs(backend, extra)
    async with aiovec.AsyncioVectorEnv(fns, max_concurrency=2, **kwargs) as venv:
        await venv.reset(seed=0)
        for step in range(1, 3):
            actions = np.full((N, 2), 0.5 * step)
            if mode == "step":
                obs, rewards, *_ = await venv.step(actions)
            else:
                venv.send(actions)
                rows: dict[int, tuple[Any, Any]] = {}
                while len(rows) < N:
                    got, got_rewards, *_, env_ids = await venv.recv(min_envs=1)
                    rows.update(
                        (int(i), (o, r)) for i, o, r in zip(env_ids, got, got_rewards, strict=True)
                    )
                obs = np.stack([rows[i][0] for i in range(N)])
                rewards = np.array([rows[i][1] for i in range(N)])
            want_obs, want_rewards = _expected(step, actions)
            np.testing.assert_array_equal(obs, want_obs)  # the limit never changes a result
            np.testing.assert_array_equal(rewards, want_rewards)
    most, calls = _max_overlap(tmp_path)
    assert calls == 2 * N
    assert most <= 2, f"{most} envs were inside step() at once"
    assert most == 2, "the envs never overlapped: this test could not have failed"


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=pytest.mark.ray)])
def test_a_shared_limiter_is_refused_where_envs_run_in_workers(tmp_path, backend):
    built = tmp_path / "built"

    def factory() -> Any:  # never called: the check comes first
        built.touch()
        return SpaceEnv()

    limiter = anyio.CapacityLimiter(2)
    with pytest.raises(ValueError, match="max_concurrency") as info:
        aiovec.AsyncioVectorEnv([factory] * 2, backend=backend, max_concurrency=limiter)
    text = str(info.value)
    assert "CapacityLimiter" in text
    assert f"backend={backend!r}" in text
    assert "workers" in text  # why
    assert "pass an int" in text  # the alternative
    assert not built.exists()
    assert limiter.borrowed_tokens == 0


@pytest.mark.parametrize("backend", ["inline", "thread"])
@pytest.mark.asyncio
async def test_a_shared_limiter_is_still_taken_where_calls_start_in_this_process(backend):
    limiter = anyio.CapacityLimiter(1)
    fns = [SpaceEnv] * 2
    async with aiovec.AsyncioVectorEnv(fns, backend=backend, max_concurrency=limiter) as venv:
        await venv.reset(seed=0)
        await venv.step(np.zeros(2, np.int64))
    assert limiter.borrowed_tokens == 0


def _hung(gate: Gate, flavour: str, index: int) -> Any:
    """Env 1 hangs in its first step; the others answer at once."""
    env = SpaceEnv(min_len=1000, max_len=1000)
    if flavour == "async":
        return AsyncHangingEnv(env, gate, at=1 if index == 1 else 1 << 30)
    if index != 1:
        return env
    return HangingEnv(env, gate, at=1, give_up_after=30.0)


GROUPED = [
    pytest.param("process", "sync", id="process-sync"),
    pytest.param("process", "async", id="process-async"),
    pytest.param("ray", "sync", id="ray-sync", marks=pytest.mark.ray),
    pytest.param("ray", "async", id="ray-async", marks=pytest.mark.ray),
]


@pytest.mark.parametrize(("backend", "flavour"), GROUPED)
@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_a_timed_out_envs_slot_comes_back(tmp_path, backend, flavour):
    """max_concurrency=1: env 1 hangs holding the only slot; at its deadline it gives it back.

    Env 3, whose turn comes after env 1's (slots go to the workers in turn:
    envs 0, 2, 1, 3), waits for the slot without its clock running, then
    answers: only env 1 fails.  Later steps do not wait for a slot that leaked.
    """
    gate = Gate(tmp_path)
    fns = [functools.partial(_hung, gate, flavour, i) for i in range(4)]
    kwargs = _kwargs(backend, {"num_workers": 2})
    venv = aiovec.AsyncioVectorEnv(
        fns, max_concurrency=1, step_timeout=0.5, reset_timeout=10.0, **kwargs
    )
    try:
        await venv.reset(seed=0)
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.step(np.zeros(4, np.int64))
        # env 0 had the slot first and answered, before env 1 blocked (a sync env) its worker
        assert set(info.value.errors) == {1}
        gate.release()
        await venv.reset(seed=1)
        for _ in range(3):
            await venv.step(np.zeros(4, np.int64))
        venv.send(np.zeros(4, np.int64))
        *_, env_ids = await venv.recv()
        assert sorted(env_ids.tolist()) == [0, 1, 2, 3]
    finally:
        gate.release()
        await venv.close()


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=pytest.mark.ray)])
@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_a_cancelled_step_gives_its_slots_back(tmp_path, backend):
    gate = Gate(tmp_path)
    fns = [functools.partial(_hung, gate, "async", i) for i in range(4)]
    kwargs = _kwargs(backend, {"num_workers": 2})
    venv = aiovec.AsyncioVectorEnv(fns, max_concurrency=1, **kwargs)
    try:
        await venv.reset(seed=0)
        task = asyncio.create_task(venv.step(np.zeros(4, np.int64)))
        await asyncio.sleep(0)  # the step starts: one env holds the slot, the others wait
        backend = venv._backend
        # (env 0 may have answered already, its worker quicker than this turn: then env 1,
        # which hangs, holds the slot)
        assert len(backend.pending) - len(backend.queued) == 1
        assert len(backend.queued) >= 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()  # env 1 (whose turn had not come) answers from now on
        await venv.reset(seed=1)
        for _ in range(3):
            await venv.step(np.zeros(4, np.int64))
    finally:
        gate.release()
        await venv.close()


def test_the_stamps_are_the_envs_own(tmp_path):
    """The overlap count reads only what the envs wrote (a check of the check)."""
    (tmp_path / "env0.txt").write_text("1.0 3.0\n4.0 5.0\n")
    (tmp_path / "env1.txt").write_text("2.0 4.0\n")
    (tmp_path / "env2.txt").write_text("2.5 2.6\n")
    assert _max_overlap(tmp_path) == (3, 4)
    assert os.path.exists(tmp_path / "env0.txt")


def _killing_once(once: Once, spare: int) -> Any:
    """Env 0: its first build kills its worker in its first step; a rebuilt one is healthy."""
    env = SpaceEnv(min_len=1000, max_len=1000)
    return KillingEnv(env, spare=spare) if once.take() else env


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=pytest.mark.ray)])
@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_a_dead_workers_slots_come_back(tmp_path, backend):
    """max_concurrency=1: env 0 kills its worker; env 1 (same worker) waits for the slot.

    Env 1 then fails at once as lost (it is never sent to a dead worker), envs 2
    and 3 answer, and ``reset()`` rebuilds the worker; nothing waits for a slot
    that a dead worker took with it.
    """
    fns: list[Any] = [functools.partial(_killing_once, Once(tmp_path), os.getpid())]
    fns += [functools.partial(SpaceEnv, min_len=1000, max_len=1000)] * 3
    kwargs = _kwargs(backend, {"num_workers": 2})
    async with aiovec.AsyncioVectorEnv(fns, max_concurrency=1, **kwargs) as venv:
        await venv.reset(seed=0)
        with pytest.raises(aiovec.WorkerDiedError) as info:
            await venv.step(np.zeros(4, np.int64))
        assert set(info.value.errors) == {0, 1}
        await venv.reset(seed=1)
        for _ in range(3):
            await venv.step(np.zeros(4, np.int64))
