"""backend="process": start methods, dead workers, and nothing left behind."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import aiovec
from aiovec.backends import process as process_backend
from aiovec.testing import SpaceEnv

START_METHODS = ["fork", "forkserver", "spawn"]


class Hang(gymnasium.Env[np.ndarray, int]):
    """Steps normally until told (via an attribute) to block in its next step."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.hang = False

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {"pid": os.getpid()}

    def step(self, action: int) -> Any:
        if self.hang:
            threading.Event().wait()  # blocks until the worker is killed
        return np.zeros(2, np.float32), 1.0, False, False, {}


class Boom(Exception):
    """An exception that pickles only halfway (its __init__ takes two arguments)."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"boom {a} {b}")


class Fails(Hang):
    def step(self, action: int) -> Any:
        raise Boom(1, 2)


def _children() -> list[Any]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("aiovec-worker")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(process_backend, "START_METHOD", request.param)
    return str(request.param)


def _cartpole() -> Any:
    return gymnasium.make("CartPole-v1")


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_same_results_as_inline_for_every_start_method(start_method: str, mode: Any) -> None:
    fns = [_cartpole] * 3
    actions = np.random.default_rng(0).integers(0, 2, size=(60, 3))
    outputs = []
    for backend in ("inline", "process"):
        with aiovec.BlockingVectorEnv(
            fns, backend=backend, num_workers=2, autoreset_mode=mode
        ) as venv:
            got = [venv.reset(seed=5)]
            got += [venv.step(a) for a in actions]
            outputs.append(got)
    inline, process = outputs
    for a, b in zip(inline, process, strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, dict):
                assert x.keys() == y.keys()
            else:
                np.testing.assert_array_equal(x, y)
    assert not _children()


def test_lambdas_and_closures_as_factories(start_method: str) -> None:
    size = 3
    fns = [lambda: SpaceEnv(spaces.Box(-1.0, 1.0, (size,)), spaces.Discrete(2))] * 2
    with aiovec.BlockingVectorEnv(fns, backend="process") as venv:
        obs, _ = venv.reset(seed=0)
        assert obs.shape == (2, size)


def _hang_fns(n: int) -> list[Any]:
    return [Hang] * n


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_killed_worker_fails_its_envs_promptly() -> None:
    venv = aiovec.AsyncioVectorEnv(_hang_fns(4), backend="process", num_workers=2)
    try:
        _, infos = await venv.reset(seed=0)
        pids = infos["pid"]
        assert pids[0] == pids[1] != pids[2] == pids[3]
        await venv.set_attr("hang", [True, True, False, False])
        step = asyncio.ensure_future(venv.step(np.zeros(4, np.int64)))
        await asyncio.sleep(0.2)
        assert not step.done()
        os.kill(int(pids[0]), signal.SIGKILL)
        with pytest.raises(aiovec.WorkerDiedError) as info:
            await asyncio.wait_for(step, 10)
        assert set(info.value.errors) == {0, 1}
        assert "SIGKILL" in str(info.value)
        assert not _alive(int(pids[0]))
    finally:
        await venv.close()
    assert not _children()
    assert not any(_alive(int(pid)) for pid in pids)


@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_killed_worker_is_replaced_under_restart() -> None:
    venv = aiovec.AsyncioVectorEnv(
        _hang_fns(4), backend="process", num_workers=2, on_error="restart"
    )
    async with venv:
        _, infos = await venv.reset(seed=0)
        old = infos["pid"]
        await venv.set_attr("hang", [False, True, False, False])
        step = asyncio.ensure_future(venv.step(np.zeros(4, np.int64)))
        await asyncio.sleep(0.2)
        os.kill(int(old[0]), signal.SIGKILL)
        _, rewards, _, truncations, infos = await asyncio.wait_for(step, 20)
        assert truncations.tolist() == [True, True, False, False]
        assert rewards.tolist() == [0.0, 0.0, 1.0, 1.0]
        assert infos["_error"].tolist() == [True, True, False, False]
        new = infos["pid"]
        assert new[0] == new[1] != old[0]
        _, rewards, *_ = await venv.step(np.zeros(4, np.int64))
        assert rewards.tolist() == [0.0, 0.0, 1.0, 1.0]  # NEXT_STEP resets the truncated
        for _ in range(3):
            _, rewards, *_ = await venv.step(np.zeros(4, np.int64))
            assert rewards.tolist() == [1.0] * 4
    assert not _children()


@pytest.mark.asyncio
async def test_stuck_env_is_timed_out_and_its_worker_replaced() -> None:
    venv = aiovec.AsyncioVectorEnv(
        _hang_fns(2), backend="process", num_workers=2, on_error="restart", step_timeout=0.5
    )
    async with venv:
        await venv.reset(seed=0)
        await venv.set_attr("hang", [True, False])
        _, rewards, _, truncations, infos = await venv.step(np.zeros(2, np.int64))
        assert truncations.tolist() == [True, False]
        assert "TimeoutError" in str(infos["error"][0])
        _, rewards, *_ = await venv.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [0.0, 1.0]  # NEXT_STEP resets the truncated env
        _, rewards, *_ = await venv.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [1.0, 1.0]
    assert not _children()


def test_unpicklable_exception_comes_back_as_runtime_error() -> None:
    with aiovec.BlockingVectorEnv([Fails, Hang], backend="process") as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.EnvError) as info:
            venv.step(np.zeros(2, np.int64))
    assert set(info.value.errors) == {0}
    error = info.value.errors[0]
    assert isinstance(error, RuntimeError)
    assert "boom 1 2" in str(error)


def test_nothing_left_after_an_env_error() -> None:
    with pytest.raises(aiovec.EnvError):
        aiovec.BlockingVectorEnv([Hang, Hang, _raise], backend="process", num_workers=2)
    assert not _children()


def _raise() -> Any:
    raise ValueError("no env today")


def test_workers_default_to_cores_but_never_more_than_envs() -> None:
    with aiovec.BlockingVectorEnv([Hang] * 1, backend="process") as venv:
        backend = venv.vector_env._backend
        assert isinstance(backend, process_backend.ProcessBackend)
        assert backend.num_workers == 1


def test_split_is_contiguous_and_even() -> None:
    assert process_backend.split(5, 2) == [range(3), range(3, 5)]
    assert process_backend.split(4, 4) == [range(i, i + 1) for i in range(4)]


class Marks(SpaceEnv):
    """Writes a file when closed (the parent cannot see a child's memory)."""

    def __init__(self, path: str, *args: Any) -> None:
        super().__init__(*args)
        self.path = path

    def close(self) -> None:
        with open(self.path, "a") as f:
            f.write("closed\n")


def test_envs_built_before_a_failed_construction_are_closed_in_workers(tmp_path: Any) -> None:
    path = str(tmp_path / "closed")
    box = spaces.Box(-1.0, 1.0, (2,))
    fns = [lambda: Marks(path, box, spaces.Discrete(2))] * 2
    fns.append(lambda: Marks(path, box, spaces.Discrete(3)))
    with pytest.raises(ValueError, match="action"):
        aiovec.BlockingVectorEnv(fns, backend="process", num_workers=2)
    with open(path) as f:
        assert f.read().count("closed") == 3
    assert not _children()
