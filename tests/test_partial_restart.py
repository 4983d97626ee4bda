"""Restarts under send/recv: a restart may overlap any other env's calls, on every backend.

Each env is a seeded `SpaceEnv` behind random delays; its first build fails in
one of its steps (drawn), and the env rebuilt by the restart resets after a delay
longer or shorter than its neighbours' steps.  Whatever the interleaving, every
env's rows must be that env's own trajectory (`Alone`, the env stepped by itself
with the same actions, a restart included), with the right ``env_ids``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from typing import Any

import numpy as np
import pytest
from conftest import HAVE_RAY, shared_actors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_partial import Front, row_info

import aiovec
from aiovec._core.lifecycle import State
from aiovec.testing import SpaceEnv

N = 4
SETUPS = [
    ("inline", "async"),
    ("thread", "sync"),
    ("process", "sync"),
    ("process", "async"),
    *([("ray", "async")] if HAVE_RAY else []),
]
RAY = pytest.mark.ray


def setups() -> list[Any]:
    return [
        pytest.param(backend, flavour, marks=[RAY] if backend == "ray" else [])
        for backend, flavour in SETUPS
    ]


def build_number(directory: str, env: int) -> int:
    """How many times env ``env`` was built before (across processes): 0, 1, ..."""
    k = 0
    while True:
        try:
            os.close(os.open(os.path.join(directory, f"env{env}-build{k}"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            k += 1
        else:
            return k


def seeded(env: int, build: int) -> SpaceEnv:
    """Env ``env``'s ``build``-th copy: its generator is seeded, so even ``reset()`` is known."""
    inner = SpaceEnv(min_len=1, max_len=4)
    inner.np_random = np.random.default_rng(1000 * env + build)
    return inner


class Scripted:
    """What a built env does: the first build fails at step ``fail_at``; delays per call."""

    def __init__(self, env: int, build: int, fail_at: int | None, delays: tuple[float, float]):
        self.inner = seeded(env, build)
        self.fail_at = fail_at if build == 0 else None
        self.step_delay, reset_delay = delays
        self.reset_delay = reset_delay if build > 0 else 0.0
        self.random = random.Random(7 * env + build)
        self.steps = 0

    def step_pause(self) -> float:
        """The delay before the next step: none before a failure (the server is gone)."""
        if self.steps + 1 == self.fail_at:
            return 0.0
        return self.random.uniform(self.step_delay / 5, self.step_delay)

    def step(self, action: Any) -> Any:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"server gone at step {self.steps}")
        return self.inner.step(action)


class AsyncScripted(aiovec.AsyncEnv[Any, Any]):
    def __init__(self, script: Scripted) -> None:
        self.script = script
        self.observation_space = script.inner.observation_space
        self.action_space = script.inner.action_space

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await asyncio.sleep(self.script.reset_delay)
        return self.script.inner.reset(seed=seed, options=options)

    async def step(self, action: Any) -> Any:
        await asyncio.sleep(self.script.step_pause())
        return self.script.step(action)


class SyncScripted(SpaceEnv):
    """The same in a plain gymnasium env whose calls block (thread and process backends)."""

    def __init__(self, script: Scripted) -> None:
        super().__init__()
        self.script = script
        self.observation_space = script.inner.observation_space
        self.action_space = script.inner.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        time.sleep(self.script.reset_delay)
        return self.script.inner.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        time.sleep(self.script.step_pause())
        return self.script.step(action)


def make(
    directory: str, env: int, fail_at: int | None, delays: tuple[float, float], flavour: str
) -> Any:
    script = Scripted(env, build_number(directory, env), fail_at, delays)
    return AsyncScripted(script) if flavour == "async" else SyncScripted(script)


class Alone:
    """One env stepped by itself with gymnasium's autoreset rules; a restart as aiovec's."""

    def __init__(self, env: int, fail_at: int | None, mode: str) -> None:
        self.env, self.fail_at, self.mode = env, fail_at, mode
        self.build, self.steps = 0, 0
        self.inner = seeded(env, 0)
        self.ended = False

    def reset(self, seed: int) -> Any:
        self.ended = False
        return self.inner.reset(seed=seed)[0]

    def step(self, action: Any) -> tuple[Any, float, bool, bool, bool]:
        """``(obs, reward, terminated, truncated, restarted)`` of the next row."""
        if self.mode == "NextStep" and self.ended:
            self.ended = False
            return self.inner.reset()[0], 0.0, False, False, False
        self.steps += 1
        if self.build == 0 and self.steps == self.fail_at:
            self.build = 1
            self.inner = seeded(self.env, 1)
            self.ended = self.mode == "NextStep"  # a restart is a truncation
            return self.inner.reset()[0], 0.0, False, True, True
        obs, reward, term, trunc, _ = self.inner.step(action)
        ended = term or trunc
        if self.mode == "SameStep" and ended:
            obs = self.inner.reset()[0]
        self.ended = ended and self.mode == "NextStep"
        return obs, float(reward), term, trunc, False


def open_front(front_end: str, backend: str, fns: list[Any], mode: str) -> Front:
    kwargs: dict[str, Any] = {"backend": backend, "autoreset_mode": mode, "on_error": "restart"}
    if backend in ("process", "ray"):
        kwargs["num_workers"] = 2
    kwargs.update(shared_actors(backend))
    return Front(front_end, fns, **kwargs)


def check_rows(got: tuple[Any, ...], alone: list[Alone], sent: dict[int, int]) -> None:
    obs, rewards, terms, truncs, infos, env_ids = got
    assert list(env_ids) == sorted(env_ids)
    for k, i in enumerate(env_ids.tolist()):
        want_obs, reward, term, trunc, restarted = alone[i].step(sent.pop(i))
        assert np.array_equal(obs[k], want_obs), f"env {i}"
        assert (rewards[k], terms[k], truncs[k]) == (reward, term, trunc), f"env {i}"
        error = row_info(infos, k).get("error")
        assert (error is not None) == restarted, f"env {i}: error info {error!r}"
        if restarted:
            assert "server gone" in error


@pytest.mark.timeout(120)
@pytest.mark.parametrize("front_end", ["await", "blocking"])
@pytest.mark.parametrize(("backend", "flavour"), setups())
def test_a_slow_restart_overlaps_the_other_envs_steps(front_end, backend, flavour, tmp_path):
    # env 0 fails at its first step and its rebuilt env takes 0.1 s to reset, while
    # envs 1-3 finish their steps meanwhile: each env's rows are still its own
    fns = [
        functools.partial(make, str(tmp_path), i, 1 if i == 0 else None, (0.01, 0.1), flavour)
        for i in range(N)
    ]
    alone = [Alone(i, 1 if i == 0 else None, "NextStep") for i in range(N)]
    front = open_front(front_end, backend, fns, "NextStep")
    try:
        front.call("reset", seed=10)
        for i in range(N):
            alone[i].reset(10 + i)
        for _ in range(3):
            sent = dict(enumerate([0, 1, 2, 1]))
            front.call("send", np.array(list(sent.values())))
            while sent:
                check_rows(front.call("recv", 1), alone, sent)
        assert front.venv.state is State.READY
        assert alone[0].build == 1  # the restart did happen
    finally:
        front.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("front_end", ["await", "blocking"])
@pytest.mark.parametrize(("backend", "flavour"), setups())
@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_restarts_in_any_interleaving_keep_every_envs_trajectory(
    front_end, backend, flavour, mode, tmp_path_factory, data
):
    directory = str(tmp_path_factory.mktemp("builds"))
    fail_at = data.draw(st.lists(st.none() | st.integers(1, 6), min_size=N, max_size=N))
    reset_delay = data.draw(st.sampled_from([0.0, 0.002, 0.03]))
    fns = [
        functools.partial(make, directory, i, fail_at[i], (0.01, reset_delay), flavour)
        for i in range(N)
    ]
    alone = [Alone(i, fail_at[i], mode) for i in range(N)]
    front = open_front(front_end, backend, fns, mode)
    try:
        front.call("reset", seed=10)
        for i in range(N):
            alone[i].reset(10 + i)
        sent: dict[int, int] = {}
        for _ in range(data.draw(st.integers(6, 16))):
            # the same draws whatever recv() returned (see test_partial.py)
            chosen = data.draw(st.sets(st.integers(0, N - 1), min_size=1))
            actions = data.draw(st.lists(st.integers(0, 2), min_size=N, max_size=N))
            wants_send = data.draw(st.booleans())
            least = data.draw(st.integers(1, N))
            ids = sorted(chosen - set(sent))
            if ids and (not sent or wants_send):
                front.call("send", np.array([actions[i] for i in ids]), ids)
                sent.update((i, actions[i]) for i in ids)
                continue
            check_rows(front.call("recv", min(least, len(sent))), alone, sent)
        while sent:
            check_rows(front.call("recv", 1), alone, sent)
        assert front.venv.state is State.READY
    finally:
        front.close()
