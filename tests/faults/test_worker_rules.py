"""Rules a worker applies must be the parent's own: a second copy in a worker cannot drift.

A worker process writes a step's results straight into shared rows when their
types are the ones the parent's step-result check takes at once; a reward of any
other type travels to the parent and is checked there.  Each reward below goes
through every backend: it is accepted or refused as ``validate.is_reward`` says
(gymnasium's rule: "a float, int, np.integer or np.floating"; never a bool).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import shared_actors
from gymnasium import spaces

import aiovec
from aiovec._core import validate

pytestmark = pytest.mark.timeout(120)

REWARDS = [
    1.0,
    1,
    np.float32(1.0),
    np.float16(1.0),
    np.int32(1),
    np.uint8(1),
    np.array(1.0),
    True,
    np.bool_(True),
    np.array(True),
]


class RewardEnv(gymnasium.Env[np.ndarray, int]):
    """Steps with the reward it was given."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, reward: Any) -> None:
        self.reward = reward

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> Any:
        return np.zeros(2, np.float32), self.reward, False, False, {}


def test_a_bool_is_not_a_reward() -> None:
    assert not validate.is_reward(True)
    assert not validate.is_reward(np.bool_(False))
    assert not validate.is_reward(np.array(True))
    assert validate.is_reward(np.float16(0.5))
    assert validate.is_reward(np.array(2, np.int8))
    assert not validate.is_reward(np.ones(1))


@pytest.mark.parametrize("reward", REWARDS, ids=repr)
def test_every_backend_takes_the_rewards_the_check_takes(backend: str, reward: Any) -> None:
    fn = functools.partial(RewardEnv, reward)
    # ray: in the session's actors (a new actor costs a second; what a worker checks does not
    # depend on whether it hosted envs before)
    options = shared_actors(backend)
    with aiovec.BlockingVectorEnv([fn] * 2, backend=backend, num_workers=1, **options) as envs:
        envs.reset(seed=0)
        if validate.is_reward(reward):
            _, rewards, *_ = envs.step(np.zeros(2, np.int64))
            assert rewards.tolist() == [1.0, 1.0]
        else:
            with pytest.raises(aiovec.EnvError, match="reward must be a real number") as info:
                envs.step(np.zeros(2, np.int64))
            assert set(info.value.errors) == {0, 1}
