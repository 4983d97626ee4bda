"""``BlockingVectorEnv`` as ``gymnasium.vector.AsyncVectorEnv``: its out-of-order errors, close.

The results of ``step_async``/``step_wait`` and ``reset_async``/``reset_wait``
are checked against gymnasium in ``test_conformance.py`` (every backend);
timeouts and ``close(terminate=True)`` with hung envs in
``faults/test_wait_timeouts.py``.  Here: the rules of the lifecycle table as the
blocking front end shows them, and bad input refused before anything is sent.
"""

from __future__ import annotations

import re

import gymnasium
import numpy as np
import pytest
from conftest import assert_results_equal, counters, space_env_fns

import aiovec
from aiovec._core.lifecycle import State
from aiovec.testing import FaultyEnv, SpaceEnv

N = 3
ACTIONS = np.array([0, 1, 2])


@pytest.fixture(params=["inline", "thread", "process"])
def envs(request):
    venv = aiovec.BlockingVectorEnv(space_env_fns(N), backend=request.param)
    yield venv
    venv.close()


def no_call(name: str) -> str:
    return re.escape(f"Calling `{name}_wait` without any prior call to `{name}_async`.")


def pending(call: str, name: str) -> str:
    return re.escape(f"Calling `{call}` while waiting for a pending call to `{name}` to complete")


def test_out_of_order_calls_raise_gymnasiums_errors_and_change_nothing(envs):
    with pytest.raises(gymnasium.error.NoAsyncCallError, match=no_call("reset")):
        envs.reset_wait()
    envs.reset_async(seed=3)
    with pytest.raises(
        gymnasium.error.AlreadyPendingCallError, match=pending("step_async", "reset")
    ):
        envs.step_async(ACTIONS)
    with pytest.raises(aiovec.NoAsyncCallError, match=no_call("step")):
        envs.step_wait()
    with pytest.raises(aiovec.StateError, match="reset_wait"):
        envs.recv()
    envs.reset_wait()
    envs.step_async(ACTIONS)
    with pytest.raises(aiovec.AlreadyPendingCallError, match=pending("reset_async", "step")) as e:
        envs.reset_async()
    assert e.value.name == "step"
    with pytest.raises(aiovec.AlreadyPendingCallError, match=pending("step_async", "step")):
        envs.step_async(ACTIONS)
    with pytest.raises(aiovec.NoAsyncCallError, match=no_call("reset")) as e:
        envs.reset_wait()
    assert e.value.name == "reset"
    got = envs.step_wait()
    assert envs.state is State.READY
    oracle = gymnasium.vector.SyncVectorEnv(space_env_fns(N))
    try:
        oracle.reset(seed=3)
        assert_results_equal(got, oracle.step(ACTIONS))  # the refused calls changed nothing
    finally:
        oracle.close()


def test_bad_arguments_are_refused_before_anything_is_sent(envs):
    envs.reset(seed=0)
    before = counters(envs)
    with pytest.raises(ValueError, match="seed"):
        envs.reset_async(seed=[1, 2])
    with pytest.raises(ValueError, match=re.escape("must have shape `(3,)`, got (2,)")):
        envs.reset_async(options={"reset_mask": np.array([True, False])})
    with pytest.raises(ValueError, match="actions"):
        envs.step_async(np.array([0, 1]))
    with pytest.raises(TypeError, match="got a scalar"):
        envs.step_async(0)
    assert envs.state is State.READY
    assert counters(envs) == before
    envs.step_async(ACTIONS)
    with pytest.raises(TypeError, match="timeout"):
        envs.step_wait(timeout="soon")
    assert envs.state is State.SENT  # still pending: collect it
    envs.step_wait()


def test_step_async_is_a_send_of_every_env(envs):
    envs.reset(seed=0)
    envs.step_async(ACTIONS)
    *_, env_ids = envs.recv()
    assert env_ids.tolist() == [0, 1, 2]
    envs.send(ACTIONS[:2], [0, 1])
    with pytest.raises(aiovec.StateError, match=r"env\(s\) \[2\] are not in flight"):
        envs.step_wait()
    envs.recv()


def test_a_masked_reset_async_needs_a_first_reset_but_all_true_does_not(envs):
    with pytest.raises(aiovec.StateError, match="not been reset yet"):
        envs.reset_async(options={"reset_mask": np.array([True, False, True])})
    envs.reset_async(seed=4, options={"reset_mask": np.ones(N, bool)})
    obs, _ = envs.reset_wait()
    assert obs.shape[0] == N


def test_a_scalar_action_is_a_type_error_as_in_gymnasium():
    with aiovec.BlockingVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4) as envs:
        envs.reset(seed=0)
        with pytest.raises(TypeError, match=re.escape("actions must be a batch of shape (4,)")):
            envs.step(0)
        envs.step(np.zeros(4, np.int64))


@pytest.mark.parametrize(("start", "name"), [("step", "step"), ("reset", "reset")])
def test_close_with_a_pending_call_warns_as_gymnasium_and_cancels_it(envs, start, name):
    envs.reset(seed=0)
    if start == "step":
        envs.step_async(ACTIONS)
    else:
        envs.reset_async(seed=1)
    message = f"Calling `close` while waiting for a pending call to `{name}` to complete."
    with pytest.warns(UserWarning, match=re.escape(message)):
        envs.close()
    assert envs.closed
    envs.close()  # nothing pending any more: no warning
    with pytest.raises(aiovec.ClosedError):
        envs.step_async(ACTIONS)


def test_close_terminate_releases_everything(envs):
    envs.reset(seed=0)
    with pytest.raises(TypeError, match="terminate must be a bool"):
        envs.close(terminate="yes")
    assert not envs.closed
    envs.close(terminate=True)
    assert envs.closed
    with pytest.raises(gymnasium.error.ClosedEnvironmentError):
        envs.reset_async()


@pytest.mark.parametrize("on_error", ["raise", "restart"])
def test_a_failing_env_in_step_wait_follows_steps_rules(on_error):
    fns = [SpaceEnv, lambda: FaultyEnv(SpaceEnv(), method="step", at=2), SpaceEnv]
    with aiovec.BlockingVectorEnv(fns, on_error=on_error) as envs:
        envs.reset(seed=0)
        envs.step(ACTIONS)
        envs.step_async(ACTIONS)
        if on_error == "raise":
            with pytest.raises(aiovec.EnvError) as caught:
                envs.step_wait()
            assert caught.value.env_index == 1
            assert envs.state is State.BROKEN
        else:
            _, _, _, truncations, infos = envs.step_wait()
            assert truncations[1]
            assert infos["_error"].tolist() == [False, True, False]
            assert envs.state is State.READY


def test_a_failing_env_in_reset_wait_raises_and_breaks():
    fns = [SpaceEnv, lambda: FaultyEnv(SpaceEnv(), method="reset", at=2), SpaceEnv]
    with aiovec.BlockingVectorEnv(fns, on_error="restart") as envs:
        envs.reset(seed=0)
        envs.reset_async(seed=1)
        with pytest.raises(aiovec.EnvError, match=r"env 1 failed in reset\(\)"):
            envs.reset_wait()
        assert envs.state is State.BROKEN
        envs.reset(seed=2)
