"""Timeouts and restarts, over every backend: late envs never leak stale data, nothing lost."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import gymnasium
import numpy as np
import pytest

import aiovec
from aiovec._core.lifecycle import State
from aiovec.testing import AsyncTwin, FaultyEnv, SpaceEnv

# (backend, flavour): async envs run inline only; thread runs blocking sync envs
SETUPS = [("inline", "sync"), ("inline", "async"), ("thread", "sync")]
# A sync env that blocks on the inline backend blocks the loop itself: no timeout can
# fire (that is what backend="thread" is for), so hanging envs are tested on these:
HANG_SETUPS = [("inline", "async"), ("thread", "sync")]


class Hang(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Blocks its ``at``-th step until ``release`` is set (a server that stopped answering)."""

    def __init__(self, env: gymnasium.Env[Any, Any], at: int, release: threading.Event) -> None:
        super().__init__(env)
        self.at, self.release, self.steps = at, release, 0

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.at:
            self.release.wait(30)
        return self.env.step(action)


class AsyncHang(aiovec.AsyncEnv[Any, Any]):
    """The async twin of Hang: awaits an event on its ``at``-th step."""

    def __init__(self, env: gymnasium.Env[Any, Any], at: int, release: asyncio.Event) -> None:
        self.env, self.at, self.release, self.steps = env, at, release, 0
        self.observation_space, self.action_space = env.observation_space, env.action_space

    async def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    async def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            await self.release.wait()
        return self.env.step(action)


def hanging(flavour: str, at: int) -> tuple[Any, Any]:
    """An event that releases a hung env, and a factory of an env hanging on step ``at``."""
    if flavour == "async":
        release: Any = asyncio.Event()
        return release, lambda: AsyncHang(SpaceEnv(), at, release)
    release = threading.Event()
    return release, lambda: Hang(SpaceEnv(), at, release)


def flavoured(fn, flavour):
    return (lambda: AsyncTwin(fn())) if flavour == "async" else fn


def compare_rows(got, want, rows):
    for g, w in zip(got[:4], want[:4], strict=True):
        assert np.array_equal(np.asarray(g)[rows], np.asarray(w)[rows])


@pytest.mark.parametrize(("backend", "flavour"), HANG_SETUPS)
@pytest.mark.asyncio
async def test_a_late_env_times_out_and_never_leaks_stale_data(backend, flavour):
    """gymnasium's step_wait(timeout) returns the late step's data on the next call."""
    release, hang = hanging(flavour, at=3)
    fns = [flavoured(SpaceEnv, flavour), hang, flavoured(SpaceEnv, flavour)]
    oracle = gymnasium.vector.SyncVectorEnv([SpaceEnv] * 3)
    actions = np.array([0, 1, 2])
    async with aiovec.AsyncioVectorEnv(fns, backend=backend, step_timeout=0.2) as venv:
        await venv.reset(seed=5)
        for _ in range(2):
            await venv.step(actions)
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.step(actions)  # env 1's third step never answers in time
        assert info.value.env_index == 1
        assert set(info.value.errors) == {1}
        assert isinstance(info.value.errors[1], TimeoutError)
        assert venv.state is State.BROKEN
        release.set()  # the late call finishes now; its result must be dropped
        got = await venv.reset(seed=9)
        want = oracle.reset(seed=9)
        assert np.array_equal(got[0], want[0])
        for _ in range(4):
            compare_rows(await venv.step(actions), oracle.step(actions), slice(None))
    oracle.close()


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
@pytest.mark.asyncio
async def test_restart_rebuilds_the_failed_env_and_keeps_every_other_transition(backend, flavour):
    built = []

    def faulty():
        built.append(1)
        return FaultyEnv(SpaceEnv(), method="step", at=3)

    fns = [flavoured(SpaceEnv, flavour), flavoured(faulty, flavour), flavoured(SpaceEnv, flavour)]
    oracle = gymnasium.vector.SyncVectorEnv([SpaceEnv] * 3, autoreset_mode="SameStep")
    actions = np.array([1, 2, 0])
    async with aiovec.AsyncioVectorEnv(
        fns, backend=backend, on_error="restart", autoreset_mode="SameStep"
    ) as venv:
        assert np.array_equal((await venv.reset(seed=2))[0], oracle.reset(seed=2)[0])
        for _ in range(2):
            compare_rows(await venv.step(actions), oracle.step(actions), slice(None))
        obs, rewards, terminations, truncations, infos = await venv.step(actions)
        want = oracle.step(actions)
        compare_rows((obs, rewards, terminations, truncations), want, [0, 2])  # untouched
        assert (rewards[1], terminations[1], truncations[1]) == (0.0, False, True)
        assert venv.single_observation_space.contains(obs[1])
        assert infos["_error"].tolist() == [False, True, False]
        assert "RuntimeError" in infos["error"][1]
        assert "injected failure" in infos["error"][1]
        assert len(built) == 2  # the factory built a fresh env
        for _ in range(3):  # the others go on exactly as the oracle
            compare_rows(await venv.step(actions), oracle.step(actions), [0, 2])
        assert venv.state is State.READY
    oracle.close()


@pytest.mark.parametrize(("backend", "flavour"), HANG_SETUPS)
@pytest.mark.asyncio
async def test_a_timed_out_env_is_restarted(backend, flavour):
    release, hang = hanging(flavour, at=2)
    fns = [hang, flavoured(SpaceEnv, flavour)]
    async with aiovec.AsyncioVectorEnv(
        fns, backend=backend, step_timeout=0.2, on_error="restart"
    ) as venv:
        await venv.reset(seed=0)
        await venv.step(np.zeros(2, np.int64))
        _, _, _, truncations, infos = await venv.step(np.zeros(2, np.int64))
        release.set()
        assert truncations[0]
        assert "TimeoutError" in infos["error"][0]
        await venv.step(np.zeros(2, np.int64))  # goes on


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
@pytest.mark.asyncio
async def test_a_crash_looping_env_hits_the_restart_limit(backend, flavour):
    def always_failing():
        return FaultyEnv(SpaceEnv(min_len=50, max_len=50), method="step", at=1)

    policy = aiovec.RestartPolicy(max_restarts=3, backoff=0)
    fns = [flavoured(SpaceEnv, flavour), flavoured(always_failing, flavour)]
    async with aiovec.AsyncioVectorEnv(
        fns, backend=backend, on_error=policy, autoreset_mode="SameStep"
    ) as venv:
        await venv.reset(seed=0)
        for _ in range(3):
            _, _, _, truncations, _ = await venv.step(np.zeros(2, np.int64))
            assert truncations.tolist() == [False, True]
        with pytest.raises(aiovec.EnvError, match="restart limit") as info:
            await venv.step(np.zeros(2, np.int64))
        assert info.value.env_index == 1
        assert venv.state is State.BROKEN


class FlakyFactory:
    """Builds envs, but refuses (like a server that is down) while ``down`` > 0."""

    def __init__(self, down: int, flavour: str) -> None:
        self.down, self.flavour, self.calls = down, flavour, 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.calls > 1 and self.down > 0:
            self.down -= 1
            raise ConnectionRefusedError("game server unreachable")
        env = FaultyEnv(SpaceEnv(min_len=50, max_len=50), method="step", at=2)
        return AsyncTwin(env) if self.flavour == "async" else env


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
@pytest.mark.asyncio
async def test_rebuilding_retries_with_backoff_then_succeeds(backend, flavour):
    factory = FlakyFactory(down=2, flavour=flavour)
    policy = aiovec.RestartPolicy(attempts=3, backoff=0.001)
    async with aiovec.AsyncioVectorEnv([factory], backend=backend, on_error=policy) as venv:
        await venv.reset(seed=0)
        await venv.step(np.zeros(1, np.int64))
        _, _, _, truncations, _ = await venv.step(np.zeros(1, np.int64))
        assert truncations.tolist() == [True]
        assert factory.calls == 4  # the first build, two refusals, one success


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
@pytest.mark.asyncio
async def test_a_dead_server_fails_loudly(backend, flavour):
    factory = FlakyFactory(down=10, flavour=flavour)
    policy = aiovec.RestartPolicy(attempts=2, backoff=0.001)
    async with aiovec.AsyncioVectorEnv([factory], backend=backend, on_error=policy) as venv:
        await venv.reset(seed=0)
        await venv.step(np.zeros(1, np.int64))
        with pytest.raises(aiovec.EnvError, match="restart failed after 2 attempts") as info:
            await venv.step(np.zeros(1, np.int64))
        assert isinstance(info.value.errors[0], ConnectionRefusedError)


def test_under_next_step_a_restarted_row_is_a_truncation_like_any_other():
    """The next step autoresets the env (reward 0, flags False), as after any truncation."""
    fns = [SpaceEnv, lambda: FaultyEnv(SpaceEnv(min_len=50, max_len=50), method="step", at=1)]
    with aiovec.BlockingVectorEnv(fns, on_error="restart") as envs:
        envs.reset(seed=1)
        _, rewards, terminations, truncations, infos = envs.step(np.zeros(2, np.int64))
        assert (rewards[1], terminations[1], truncations[1]) == (0.0, False, True)
        assert infos["_error"].tolist() == [False, True]
        _, rewards, terminations, truncations, infos = envs.step(np.zeros(2, np.int64))
        assert (rewards[1], terminations[1], truncations[1]) == (0.0, False, False)
        assert "_error" not in infos


def test_restart_works_through_the_blocking_front_end():
    fns = [SpaceEnv, lambda: FaultyEnv(SpaceEnv(), method="step", at=2)]
    with aiovec.BlockingVectorEnv(fns, on_error="restart") as envs:
        envs.reset(seed=1)
        envs.step(np.zeros(2, np.int64))
        _, _, _, truncations, infos = envs.step(np.zeros(2, np.int64))
        assert truncations[1]
        assert infos["_error"].tolist() == [False, True]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"max_restarts": 0},
        {"backoff": -1},
        {"backoff": float("nan")},
        {"clean_steps": 0},
        {"clean_steps": 2.5},
        {"attempts": 1.5},
        {"max_downtime": 0},
        {"max_downtime": -1.0},
        {"max_downtime": float("inf")},
        {"max_downtime": float("nan")},
        {"max_downtime": "30"},
        {"max_downtime": True},
    ],
)
def test_bad_restart_policies_are_refused(kwargs):
    (name,) = kwargs
    with pytest.raises(ValueError, match=f"RestartPolicy.{name} must be") as info:
        aiovec.RestartPolicy(**kwargs)
    assert repr(kwargs[name]) in str(info.value)


def waits(policy, elapsed=lambda tried: 0.0):
    """The waits a policy asks for, try after try, until it gives up (at most 100)."""
    out = []
    for tried in range(100):
        wait = policy.wait_before(tried, elapsed(tried))
        if wait is None:
            return out
        out.append(wait)
    return out


def test_restart_policy_backoff_doubles_up_to_its_bound():
    policy = aiovec.RestartPolicy(attempts=5, backoff=0.5, max_backoff=1.5)
    assert waits(policy) == [0.0, 0.5, 1.0, 1.5, 1.5]
    assert waits(aiovec.RestartPolicy()) == [0.0, 0.1, 0.2]  # attempts=None: 3 tries


def test_max_downtime_retries_until_the_downtime_is_spent_and_no_longer():
    policy = aiovec.RestartPolicy(max_downtime=10.0, backoff=1.0, max_backoff=2.0)
    # Each try fails at once, so the time elapsed is the sum of the waits so far.
    clock = [0.0]
    got = []
    for tried in range(100):
        wait = policy.wait_before(tried, clock[0])
        if wait is None:
            break
        got.append(wait)
        clock[0] += wait
    # 0, 1, 2, 2, 2 (t = 7), 2 (t = 9), then cut to 1 so the last try starts at t = 10.
    assert got == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 1.0]
    assert policy.max_attempts == float("inf")
    assert policy.wait_before(3, 10.0) is None  # the downtime is spent: give up


def test_attempts_and_max_downtime_together_stop_at_whichever_comes_first():
    policy = aiovec.RestartPolicy(attempts=2, max_downtime=60.0, backoff=1.0)
    assert waits(policy) == [0.0, 1.0]  # attempts first
    policy = aiovec.RestartPolicy(attempts=50, max_downtime=0.5, backoff=1.0)
    assert policy.wait_before(1, 0.2) == pytest.approx(0.3)  # downtime first
    assert policy.wait_before(2, 0.5) is None


def test_bad_timeouts_are_refused():
    with pytest.raises(ValueError, match="reset_timeout"):
        aiovec.AsyncioVectorEnv([SpaceEnv], reset_timeout=0)
    with pytest.raises(ValueError, match="on_error"):
        aiovec.AsyncioVectorEnv([SpaceEnv], on_error="retry")
