"""Malformed step results: each env's result is checked, and only the bad ones fail.

``test_env_faults.py`` runs every kind of :class:`~aiovec.testing.MalformedEnv`
through ``step()`` on every backend; here the checker itself is tested (what
it accepts, as the batcher does, and what it refuses, with which error), and
so is the partial stepping path (``send``/``recv``).
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import aiovec
from aiovec._core.validate import step_result_checker
from aiovec.testing import MalformedEnv
from faults.scenarios import LONG, NUM_ENVS, actions_for, space_env

pytestmark = pytest.mark.timeout(60)

BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)
DICT = spaces.Dict({"a": BOX, "b": spaces.Discrete(4)})
TUPLE = spaces.Tuple((BOX, spaces.Discrete(4)))
GOOD_OBS = np.zeros(3, np.float32)


def result(obs: Any = GOOD_OBS, reward: Any = 1.0, terminated: Any = False, **kw: Any) -> Any:
    return (obs, reward, terminated, kw.get("truncated", False), kw.get("info", {}), None)


ACCEPTED = [
    (BOX, result()),
    (BOX, result(obs=[0.0, 0.5, 1.0])),  # a list of the right shape
    (BOX, result(obs=np.zeros(3, np.float64))),  # cast like the batcher casts
    (BOX, result(obs=np.zeros(3, np.int64))),
    (spaces.Discrete(4), result(obs=2)),
    (spaces.Discrete(4), result(obs=np.int32(2))),
    (spaces.Discrete(4), result(obs=np.array(2))),
    (DICT, result(obs={"a": GOOD_OBS, "b": 1})),
    (DICT, result(obs=collections.OrderedDict(b=np.int64(1), a=[0.0, 0.0, 0.0]))),
    (TUPLE, result(obs=(GOOD_OBS, 1))),
    (TUPLE, result(obs=[GOOD_OBS, np.int64(1)])),
    (spaces.Text(4), result(obs="abc")),  # batched by gymnasium's own rules
    (BOX, result(reward=np.float16(0.5))),
    (BOX, result(reward=np.array(0.5))),
    (BOX, result(reward=np.uint8(3))),
    (BOX, result(terminated=np.bool_(True))),
    (BOX, result(info=collections.defaultdict(int))),
]


@pytest.mark.parametrize(("space", "transition"), ACCEPTED)
def test_results_the_batcher_accepts_pass(space, transition):
    check = step_result_checker(space)
    assert check({0: transition}) == {}
    # next to a malformed result, every env is looked at closely: still accepted
    assert list(check({0: transition, 1: result(obs=space.sample(), info=None)})) == [1]


REFUSED = [
    (BOX, result(obs=np.zeros(4, np.float32)), ValueError, r"observation must have shape \(3,\)"),
    (BOX, result(obs=np.full(3, "x")), TypeError, "observation must have a dtype that casts"),
    (BOX, result(obs=[[0.0], [0.0, 1.0]]), ValueError, "observation is not an array"),
    (spaces.Discrete(4), result(obs=1.5), TypeError, "dtype that casts to int64"),
    (spaces.Discrete(4), result(obs=[1]), ValueError, r"must have shape \(\)"),
    (DICT, result(obs={"a": GOOD_OBS}), TypeError, r"keys \['a', 'b'\]"),
    (DICT, result(obs={"a": np.zeros(2), "b": 1}), ValueError, r"observation\['a'\]"),
    (TUPLE, result(obs=(GOOD_OBS,)), TypeError, "must be a tuple of 2"),
    (TUPLE, result(obs=(GOOD_OBS, 0.5)), TypeError, r"observation\[1\]"),
    (BOX, result(reward=None), TypeError, "reward must be a real number, got NoneType"),
    (BOX, result(reward="1"), TypeError, "reward must be a real number"),
    (BOX, result(reward=np.ones(1)), TypeError, "reward must be a real number"),
    (BOX, result(terminated="no"), TypeError, "terminated must be a bool, got str 'no'"),
    (BOX, result(truncated=0), TypeError, "truncated must be a bool, got int 0"),
    (BOX, result(info=[("a", 1)]), TypeError, "info must be a dict, got list"),
]


@pytest.mark.parametrize(("space", "transition", "error", "match"), REFUSED)
def test_a_malformed_result_is_refused_with_what_is_wrong(space, transition, error, match):
    bad = step_result_checker(space)({0: result(obs=space.sample()), 1: transition})
    assert list(bad) == [1]
    with pytest.raises(error, match=match):
        raise bad[1]


def test_only_the_malformed_results_of_a_batch_are_refused():
    check = step_result_checker(BOX)
    transitions = {0: result(), 1: result(info=None), 2: result(), 3: result(obs=[0.0])}
    assert sorted(check(transitions)) == [1, 3]


def malformed_fns(kind: str) -> list[Any]:
    fns: list[Any] = [functools.partial(space_env, LONG)] * NUM_ENVS
    fns[2] = functools.partial(_malformed_env, kind)
    return fns


def _malformed_env(kind: str) -> Any:
    return MalformedEnv(space_env(LONG), kind, at=1)


BACKENDS = ["inline", "thread", "process"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_names_the_env_whose_result_is_malformed(backend):
    with aiovec.BlockingVectorEnv(malformed_fns("flag"), backend=backend) as envs:
        envs.reset(seed=0)
        envs.send(actions_for(1))
        with pytest.raises(aiovec.EnvError, match="env 2 failed in step") as info:
            envs.recv()
        assert set(info.value.errors) == {2}
        assert isinstance(info.value.errors[2], TypeError)
        assert "terminated must be a bool" in str(info.value.errors[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_restarts_the_env_whose_result_is_malformed(backend):
    policy = aiovec.RestartPolicy(backoff=0.0)
    with aiovec.BlockingVectorEnv(malformed_fns("info"), backend=backend, on_error=policy) as envs:
        envs.reset(seed=0)
        envs.send(actions_for(1))
        _, rewards, _, truncations, infos, env_ids = envs.recv()
        assert env_ids.tolist() == list(range(NUM_ENVS))
        assert truncations.tolist() == [False, False, True, False]
        assert rewards[2] == 0.0
        assert "info must be a dict" in infos["error"][2]
