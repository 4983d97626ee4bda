"""What follows a restart, on every backend and front end.

- Every clean step ends an outage.  An outage is said as it starts and as it
  ends (`aiovec._restarter.Restarter`); it ends after a few steps in a row in
  which no env failed.  Those steps may be answered at once (sync envs driven
  where the call is made) or after a wait: either way the step is the same
  route and ends the outage the same way.
- A restarted env's reset is bounded by ``reset_timeout``, never by
  ``step_timeout``: the restart's own reset, and the autoreset that follows a
  restarted row under ``NEXT_STEP``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import gymnasium
import numpy as np
import pytest

import aiovec
from aiovec.testing import AsyncTwin, FaultyEnv
from faults.scenarios import Once, space_env

pytestmark = pytest.mark.timeout(60)


def _fails_once(once: Once, at: int) -> Any:
    """A sync env that fails its ``at``-th step, if it takes the token (the first build)."""
    env = space_env((50, 50))
    return FaultyEnv(env, method="step", at=at) if once.take() else env


def test_each_outage_of_sync_envs_ends_and_the_next_one_is_said(open_venv, gates, caplog) -> None:
    """Three sync envs: env 1 fails at step 2, env 2 at step 7, clean steps between.

    Two outages, each said as it starts and as it ends: 4 lines, on every backend.
    """
    caplog.set_level(logging.WARNING, logger="aiovec")
    fns = [
        functools.partial(space_env, (50, 50)),
        functools.partial(_fails_once, gates.once(), 2),
        functools.partial(_fails_once, gates.once(), 7),
    ]
    policy = aiovec.RestartPolicy(backoff=0.0)
    venv = open_venv(fns, on_error=policy)
    venv.reset(seed=0)
    for _ in range(12):
        venv.step(np.zeros(3, np.int64))
    messages = [r.getMessage() for r in caplog.records if r.name == "aiovec"]
    starts = ("env 1 failed in step()", "env 1 back after", "env 2 failed in step()")
    assert len(messages) == 4, messages
    for message, start in zip(messages, (*starts, "env 2 back after"), strict=True):
        assert message.startswith(start), messages


# --------------------------------------------------------------------------- slow resets

STEP_TIMEOUT = 0.4
SLOW_RESET = 2 * STEP_TIMEOUT  # a sandbox that takes longer to start than to step


class SlowReset(AsyncTwin):
    """An async env whose every reset takes `SLOW_RESET` s (it awaits: the loop runs on)."""

    async def reset(self, *, seed=None, options=None):
        await asyncio.sleep(SLOW_RESET)
        return await super().reset(seed=seed, options=options)


class BlockingSlowReset(gymnasium.Wrapper):
    """The sync twin of `SlowReset`, for the thread backend (its reset blocks a thread)."""

    def reset(self, *, seed=None, options=None):
        time.sleep(SLOW_RESET)  # the scenario: a slow env, not synchronisation
        return super().reset(seed=seed, options=options)


def _slow_reset(once: Once, sync: bool, *, first_too: bool) -> Any:
    """Env 1: its first build fails its 2nd step; every reset is slow (the first's with
    ``first_too``)."""
    env: Any = space_env((50, 50))
    if once.take():
        env = FaultyEnv(env, method="step", at=2)
        if not first_too:
            return env if sync else AsyncTwin(env)
    return BlockingSlowReset(env) if sync else SlowReset(env)


def _fns(backend: str, gates: Any, *, first_too: bool) -> list[Any]:
    """Three envs, env 1 the slow resetter: sync on thread (which runs only those), else async."""
    sync = backend == "thread"
    plain = functools.partial(space_env, (50, 50))
    fast = plain if sync else functools.partial(_twin, plain)
    slow = functools.partial(_slow_reset, gates.once(), sync, first_too=first_too)
    return [fast, slow, fast]


def _twin(fn: Any) -> AsyncTwin:
    return AsyncTwin(fn())


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_a_restarted_env_whose_reset_outlasts_step_timeout_restarts_once(
    open_venv, backend, gates, mode
) -> None:
    """Its reset (and, under NEXT_STEP, the autoreset after its restarted row) is a reset."""
    venv = open_venv(
        _fns(backend, gates, first_too=True),
        autoreset_mode=mode,
        step_timeout=STEP_TIMEOUT,
        reset_timeout=30 * STEP_TIMEOUT,
        on_error=aiovec.RestartPolicy(backoff=0.0),
    )
    venv.reset(seed=0)
    restarted = []
    for _ in range(5):
        infos = venv.step(np.zeros(3, np.int64))[4]
        restarted.append(bool(infos.get("_error", np.zeros(3, bool))[1]))
    assert restarted == [False, True, False, False, False]


def test_an_env_whose_reset_always_outlasts_reset_timeout_ends_in_an_error_naming_it(
    open_venv, backend, gates
) -> None:
    venv = open_venv(
        _fns(backend, gates, first_too=False),
        step_timeout=30 * STEP_TIMEOUT,
        reset_timeout=STEP_TIMEOUT,
        on_error=aiovec.RestartPolicy(backoff=0.0, attempts=2),
    )
    venv.reset(seed=0)
    venv.step(np.zeros(3, np.int64))
    with pytest.raises(aiovec.EnvError) as info:
        venv.step(np.zeros(3, np.int64))  # env 1 fails; its rebuilt env never resets in time
    assert info.value.env_index == 1
    assert set(info.value.errors) == {1}
    assert "restart failed after 2 attempts" in str(info.value)
    assert str(info.value.errors[1]) == f"env 1 did not answer reset() within {STEP_TIMEOUT} s"
