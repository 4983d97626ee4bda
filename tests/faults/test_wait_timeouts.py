"""gymnasium's ``step_wait(timeout=)``/``reset_wait(timeout=)`` and ``close(terminate=True)``.

``gymnasium.vector.AsyncVectorEnv`` raises ``multiprocessing.TimeoutError`` when
a wait times out and leaves the late replies in its pipes, where the next call
reads them.  aiovec raises `aiovec.EnvTimeoutError` (also that error), cancels
the late envs and asks for a full reset: nothing of a late call reaches a later
one.  Every test runs under the fault suite's leak check; envs wait on a
:class:`~aiovec.testing.Gate`, released before the vector env is closed.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import assert_results_equal
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec._core.lifecycle import State
from aiovec.testing import AsyncHangingEnv, Gate, HangingEnv, SpaceEnv
from faults.conftest import Gates, skip_unless_available

pytestmark = pytest.mark.timeout(60)

# (backend, flavour) where an env can wait on a gate without blocking the event loop
SETUPS = [("inline", "async"), ("thread", "sync"), ("process", "sync"), ("ray", "sync")]
N = 3
HUNG = 1  # the env that stops answering
ACTIONS = np.array([0, 1, 2])


def _hanging(gate: Gate, flavour: str, method: str, at: int) -> Any:
    cls = AsyncHangingEnv if flavour == "async" else HangingEnv
    return cls(SpaceEnv(), gate, method=method, at=at)


@pytest.fixture
def blocking(gates: Gates) -> Iterator[Any]:
    """Build BlockingVectorEnvs whose env ``HUNG`` waits on a gate; gates released, all closed."""
    opened: list[aiovec.BlockingVectorEnv] = []

    def make(backend: str, flavour: str, method: str, at: int, **kwargs: Any) -> Any:
        skip_unless_available(backend)
        if backend == "ray":
            kwargs.setdefault("num_workers", 2)
        fns: list[Any] = [SpaceEnv] * N
        fns[HUNG] = functools.partial(_hanging, gates(), flavour, method, at)
        envs = aiovec.BlockingVectorEnv(fns, backend=backend, **kwargs)
        opened.append(envs)
        return envs

    yield make
    gates.release_all()
    for envs in opened:
        envs.close()


def assert_wait_timed_out(caught: pytest.ExceptionInfo[Any], call: str) -> None:
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert isinstance(error, multiprocessing.TimeoutError)  # what AsyncVectorEnv raises
    # the hung env is named (with envs answering only together with it: one process worker)
    assert HUNG in error.errors
    for late in error.errors.values():
        assert f"did not answer {call} within 0.2 s" in str(late)


# infos that count the episodes an env had (its history, not the seeded run)
EPISODE_COUNTS = frozenset({("label",), ("nested", "episodes")})


def assert_fresh_after_reset(envs: Any) -> None:
    """A full reset and steps give exactly the oracle's: no late result comes through."""
    oracle = SyncVectorEnv([SpaceEnv] * N)
    try:
        got, want = envs.reset(seed=5), oracle.reset(seed=5)
        assert_results_equal(got, want, ("obs", "infos"), ignore=EPISODE_COUNTS)
        for _ in range(4):
            assert_results_equal(envs.step(ACTIONS), oracle.step(ACTIONS), ignore=EPISODE_COUNTS)
    finally:
        oracle.close()


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
def test_step_wait_timeout_cancels_the_late_envs(blocking, gates, backend, flavour):
    envs = blocking(backend, flavour, "step", at=2)
    envs.reset(seed=1)
    envs.step_async(ACTIONS)
    envs.step_wait(timeout=30)  # the first step answers
    envs.step_async(ACTIONS)
    with pytest.raises(aiovec.EnvTimeoutError) as caught:
        envs.step_wait(timeout=0.2)
    assert_wait_timed_out(caught, "step_wait()")
    assert envs.state is State.BROKEN
    with pytest.raises(aiovec.NoAsyncCallError):
        envs.step_wait()
    with pytest.raises(aiovec.StateError, match="only a full reset"):
        envs.step_async(ACTIONS)
    gates.release_all()  # the late step may now finish: its result must go nowhere
    assert_fresh_after_reset(envs)


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
def test_reset_wait_timeout_cancels_the_late_envs(blocking, gates, backend, flavour):
    envs = blocking(backend, flavour, "reset", at=2)
    envs.reset_async(seed=1)
    envs.reset_wait(timeout=30)
    envs.reset_async(seed=2)
    with pytest.raises(aiovec.EnvTimeoutError) as caught:
        envs.reset_wait(timeout=0.2)
    assert_wait_timed_out(caught, "reset_wait()")
    assert envs.state is State.BROKEN
    with pytest.raises(aiovec.NoAsyncCallError):
        envs.reset_wait()
    gates.release_all()
    assert_fresh_after_reset(envs)


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
def test_a_wait_that_ends_in_time_returns_everything(blocking, gates, backend, flavour):
    """The env answers within the wait's timeout: nothing is cancelled."""
    envs = blocking(backend, flavour, "step", at=1)
    envs.reset(seed=1)
    envs.step_async(ACTIONS)
    gates.release_all()
    _, rewards, *_ = envs.step_wait(timeout=30)
    assert rewards.shape == (N,)
    assert envs.state is State.READY


@pytest.mark.parametrize(("backend", "flavour"), [s for s in SETUPS if s[0] != "thread"])
def test_close_terminate_does_not_wait_for_a_hung_call(blocking, backend, flavour):
    """Closing with a call pending warns as AsyncVectorEnv does; the hung env is not waited for.

    (A thread cannot be stopped: on the thread backend close waits for a hung
    call, up to its close timeout, with or without ``terminate``.)
    """
    envs = blocking(backend, flavour, "step", at=1)
    envs.reset(seed=1)
    envs.step_async(ACTIONS)
    with pytest.warns(UserWarning, match="pending call to `step` to complete"):
        envs.close(terminate=True)
    assert envs.closed


def test_close_cancels_a_call_handed_to_its_lane_just_before(blocking):
    """An async env's call that suspended in step_async is cancelled by close, not lost.

    Its lane task has not run yet when close cancels it (no loop iteration ran
    in between): the call must still unwind, be reported, and close must end.
    """
    envs = blocking("inline", "async", "step", at=1)
    envs.reset(seed=1)
    envs.step_async(ACTIONS)
    hung = envs.envs[HUNG]
    with pytest.warns(UserWarning, match="pending call to `step` to complete"):
        envs.close()
    assert hung.cancelled == 1
