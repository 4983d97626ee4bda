"""The oracle suite: aiovec gives exactly what ``gymnasium.vector.SyncVectorEnv`` gives.

Every test runs over backends x front ends (await, blocking) x env flavours
(sync envs, async twins finishing in random order); see ``conftest.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MODES, SPACES, Lockstep, assert_spaces_equal, space_env_fns
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec.testing import SpaceEnv

NUM_ENVS = 3


def drive(lock: Lockstep, steps: int, mode: AutoresetMode, *, reset_seed: object = None) -> int:
    """Step ``steps`` times; in DISABLED mode reset ended envs with a mask. Returns #ends."""
    ends = 0
    for _ in range(steps):
        lock.step()
        ended = lock.ended()
        ends += int(ended.sum())
        if mode is AutoresetMode.DISABLED and ended.any():
            lock.reset(seed=reset_seed, options={"reset_mask": ended})
    return ends


@pytest.mark.parametrize("space", list(SPACES))
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_episodes_match_oracle(make_lockstep, space, mode):
    fns = space_env_fns(NUM_ENVS, space, min_len=1, max_len=4)
    lock = make_lockstep(fns, autoreset_mode=mode, action_seed=11)
    assert_spaces_equal(lock.venv, lock.oracle)

    lock.reset(seed=123)
    ends = drive(lock, 10, mode)
    lock.reset(seed=[5, 900, 31])
    ends += drive(lock, 8, mode, reset_seed=[None, 2, None])
    lock.reset()  # None after a seeded reset: the generators carry on
    ends += drive(lock, 8, mode, reset_seed=77)
    assert ends > 0, "the scenario must include episode ends"


@pytest.mark.parametrize("front_end", ["split"])
@pytest.mark.parametrize("space", ["box-discrete", "dict-tuple", "image-box"])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_async_spellings_match_oracle(make_lockstep, space, mode):
    """step_async/step_wait and reset_async/reset_wait give exactly what step and reset give.

    The ``split`` front end (conftest.py) is a ``BlockingVectorEnv`` whose every
    reset and step goes through gymnasium's ``AsyncVectorEnv`` spellings; in
    ``DISABLED`` mode its masked resets do too.
    """
    fns = space_env_fns(NUM_ENVS, space, min_len=1, max_len=4)
    lock = make_lockstep(fns, autoreset_mode=mode, action_seed=13)
    assert_spaces_equal(lock.venv, lock.oracle)
    lock.reset(seed=123)
    ends = drive(lock, 10, mode)
    lock.reset(seed=[5, 900, 31], options={"length": 2})
    ends += drive(lock, 6, mode, reset_seed=[None, 2, None])
    assert ends > 0, "the scenario must include episode ends"


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_autoreset_mode_given_as_string(make_lockstep, mode):
    fns = space_env_fns(NUM_ENVS, "dict-tuple", min_len=1, max_len=3)
    lock = make_lockstep(fns, autoreset_mode=mode.value, action_seed=3)
    assert lock.venv.metadata["autoreset_mode"] is mode
    assert_spaces_equal(lock.venv, lock.oracle)
    lock.reset(seed=8)
    assert drive(lock, 12, mode) > 0


@pytest.mark.parametrize("num_envs", [1, 2, 5])
def test_num_envs_and_spaces(make_lockstep, num_envs):
    fns = space_env_fns(num_envs, "nested-dict-of-tuple", min_len=1, max_len=3)
    lock = make_lockstep(fns, action_seed=num_envs)
    assert_spaces_equal(lock.venv, lock.oracle)
    obs, _ = lock.reset(seed=0)
    assert lock.venv.observation_space.contains(obs)
    drive(lock, 6, AutoresetMode.NEXT_STEP)


def test_reset_mask_in_disabled_mode(make_lockstep):
    fns = space_env_fns(4, "multidiscrete-multibinary", min_len=2, max_len=5)
    lock = make_lockstep(fns, autoreset_mode=AutoresetMode.DISABLED, action_seed=1)
    lock.reset(seed=40)
    resets = 0
    for _ in range(25):
        lock.step()
        ended = lock.ended()
        if ended.any():
            resets += 1
            # Other options go to the masked envs' reset; seeds only to masked envs.
            options = {"reset_mask": ended.copy(), "length": 2 + resets % 3}
            lock.reset(seed=[100 + resets + i for i in range(4)], options=options)
    assert resets > 0
    # A masked reset of envs that have not ended (allowed, as in gymnasium).
    lock.reset(options={"reset_mask": np.array([False, True, False, True])})
    lock.step()


def test_reset_options_reach_the_envs(make_lockstep):
    fns = space_env_fns(NUM_ENVS, "box-discrete", min_len=5, max_len=9)
    lock = make_lockstep(fns, action_seed=2)
    lock.reset(seed=3, options={"length": 1})
    lock.step()
    assert lock.ended().all(), "options={'length': 1} must reach every env"
    lock.step()


def test_render(make_lockstep):
    fns = space_env_fns(NUM_ENVS, "image-box", min_len=1, max_len=3, render_mode="rgb_array")
    lock = make_lockstep(fns, action_seed=4)
    assert lock.venv.render_mode == "rgb_array"
    lock.reset(seed=1)
    frames = lock.render()
    assert len(frames) == NUM_ENVS
    for _ in range(4):
        lock.step()
        lock.render()


def test_render_without_render_mode(make_lockstep):
    lock = make_lockstep(space_env_fns(2), action_seed=4)
    assert lock.venv.render_mode is None
    lock.reset(seed=1)
    assert lock.render() == (None, None)


def test_call_get_attr_set_attr(make_lockstep):
    fns = space_env_fns(NUM_ENVS, "box-discrete", min_len=3, max_len=6)
    lock = make_lockstep(fns, action_seed=5)
    lock.reset(seed=9)
    lock.step()
    lock.step()
    lock.call("add", 1, b=2)  # a method with args and kwargs
    lock.call("episode_steps")  # a non-callable attribute is returned as is
    lock.get_attr("tag")
    lock.get_attr("max_len")
    assert lock.set_attr("tag", ["a", "b", "c"]) is None
    assert lock.get_attr("tag") == ("a", "b", "c")
    lock.set_attr("tag", "same")  # one value for every env
    assert lock.get_attr("tag") == ("same",) * NUM_ENVS
    if lock.venv.flavour == "sync":  # (AsyncTwin keeps attributes set on it to itself)
        # set_attr reaches the envs: max_len=1 ends the next episodes at once
        lock.set_attr("max_len", 1)
        lock.set_attr("min_len", 1)
        lock.reset(seed=2)
        lock.step()
        assert lock.ended().all()


def test_call_awaits_coroutine_methods(make_lockstep):
    """``call`` on an async env's coroutine method returns its result, not a coroutine."""
    fns = space_env_fns(2, "image-box", render_mode="rgb_array")
    lock = make_lockstep(fns, action_seed=6)
    lock.reset(seed=0)
    lock.step()
    lock.call("render")


def test_set_attr_rejects_wrong_number_of_values(make_lockstep):
    lock = make_lockstep(space_env_fns(NUM_ENVS))
    with pytest.raises(ValueError, match=r"values|num_envs|length"):
        lock.venv.set_attr("tag", ["a", "b"])


def test_same_step_final_obs_and_final_info(make_lockstep):
    """SAME_STEP carries the last obs/info in object arrays under final_obs/final_info."""
    fns = space_env_fns(4, "dict-tuple", min_len=1, max_len=3)
    lock = make_lockstep(fns, autoreset_mode=AutoresetMode.SAME_STEP, action_seed=8)
    lock.reset(seed=21)
    seen = 0
    for _ in range(12):
        _, _, _, _, infos = lock.step()
        if lock.ended().any():
            seen += 1
            np.testing.assert_array_equal(infos["_final_obs"], lock.ended())
            assert infos["final_obs"].dtype == object
    assert seen > 0


@pytest.mark.parametrize(
    "space",
    [
        pytest.param(spaces.MultiDiscrete([[2, 3], [4, 5]]), id="multidiscrete-2d"),
        pytest.param(spaces.Tuple(()), id="empty-tuple"),
        pytest.param(spaces.Dict({}), id="empty-dict"),
    ],
)
def test_space_env_keeps_the_space_it_is_given(space):
    """aiovec.testing.SpaceEnv must accept any space (a falsy one is still given)."""
    env = SpaceEnv(space, space)
    assert env.observation_space == space
    assert env.action_space == space


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_max_concurrency_changes_no_result(make_lockstep, mode, limit):
    """Envs that wait for a slot (every backend hands them out) give the oracle's results."""
    fns = space_env_fns(NUM_ENVS, "dict-tuple", min_len=1, max_len=4)
    lock = make_lockstep(fns, autoreset_mode=mode, action_seed=17, max_concurrency=limit)
    lock.reset(seed=123)
    ends = drive(lock, 8, mode)
    lock.reset(seed=[5, 900, 31])
    ends += drive(lock, 6, mode, reset_seed=[None, 2, None])
    lock.call("add", 1, b=2)
    lock.get_attr("tag")
    assert ends > 0, "the scenario must include episode ends"
