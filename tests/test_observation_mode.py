"""``observation_mode``: envs whose observation spaces differ in bounds, as gymnasium takes them.

Every backend and both front ends (and ``aiovec.make``) take gymnasium's
``observation_mode``: ``"same"``, ``"different"`` (one shape and dtype, bounds
of their own) or a tuple ``(observation_space, single_observation_space)``.
Results are compared with gymnasium's ``SyncVectorEnv`` built the same way.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import batch_differing_spaces

import aiovec
from aiovec.testing import FaultyEnv, SpaceEnv
from tests.conftest import BACKENDS, FRONT_ENDS, open_front_end, oracle_env

ACTIONS = spaces.Discrete(3)


def bounded_fns(num_envs: int = 3, dtype: Any = np.float32) -> list[Any]:
    """Envs whose Box observation spaces differ only in their upper bound."""
    return [
        functools.partial(SpaceEnv, spaces.Box(0.0, i + 1.0, (2,), dtype), ACTIONS, max_len=4)
        for i in range(num_envs)
    ]


def assert_same(ours: Any, theirs: Any) -> None:
    if isinstance(theirs, dict):
        assert set(ours) == set(theirs)
        for key in theirs:
            assert_same(ours[key], theirs[key])
    elif isinstance(theirs, tuple):
        assert len(ours) == len(theirs)
        for mine, other in zip(ours, theirs, strict=True):
            assert_same(mine, other)
    else:
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_different_bounds_step_as_gymnasium_does(backend: str, front_end: str) -> None:
    fns = bounded_fns()
    venv = open_front_end(front_end, fns, backend=backend, observation_mode="different")
    try:
        with oracle_env(fns, observation_mode="different") as oracle:
            assert venv.observation_space == oracle.observation_space
            assert venv.observation_space == batch_differing_spaces(
                [fn().observation_space for fn in fns]
            )
            assert venv.single_observation_space == oracle.single_observation_space
            assert_same(venv.reset(seed=5), oracle.reset(seed=5))
            for t in range(10):
                actions = np.array([(t + i) % 3 for i in range(3)])
                assert_same(venv.step(actions), oracle.step(actions))
    finally:
        venv.shutdown()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tuple_of_spaces_is_used_as_given(backend: str) -> None:
    fns = bounded_fns(2)
    single = spaces.Box(0.0, 9.0, (2,), np.float32)
    batched = spaces.Box(0.0, 9.0, (2, 2), np.float32)
    venv = open_front_end("blocking", fns, backend=backend, observation_mode=(batched, single))
    try:
        assert venv.observation_space is batched
        assert venv.single_observation_space is single
        obs, _ = venv.reset(seed=1)
        assert obs.shape == (2, 2)
    finally:
        venv.shutdown()


def test_make_takes_observation_mode() -> None:
    """(tests/test_options.py checks that every option reaches both of make's front ends.)"""
    with aiovec.make("CartPole-v1", 2, blocking=True, observation_mode="different") as venv:
        single = gymnasium.make("CartPole-v1").observation_space
        assert venv.observation_space == batch_differing_spaces([single, single])


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_restarted_env_keeps_its_own_bounds(backend: str) -> None:
    """A rebuilt env is checked against the space it had, not env 0's (one worker: one group)."""
    fns = bounded_fns(2)
    fns[1] = functools.partial(lambda fn: FaultyEnv(fn(), at=2), fns[1])
    with aiovec.BlockingVectorEnv(
        fns, backend=backend, num_workers=1, observation_mode="different", on_error="restart"
    ) as venv:
        venv.reset(seed=0)
        venv.step(np.zeros(2, np.int64))
        _, _, _, truncations, infos = venv.step(np.zeros(2, np.int64))
        assert infos["_error"].tolist() == [False, True]  # restarted at its second step
        assert truncations[1]
        obs, *_ = venv.step(np.zeros(2, np.int64))
        assert venv.observation_space.contains(obs)


# -- refusals -------------------------------------------------------------------------


def test_same_mode_refuses_other_bounds_and_says_what_to_use() -> None:
    with pytest.raises(ValueError, match="observation_mode='different'") as caught:
        aiovec.BlockingVectorEnv(bounded_fns())
    assert isinstance(caught.value, RuntimeError)  # as gymnasium's vector envs raise
    assert "env 1 has Box(0.0, 2.0" in str(caught.value)


@pytest.mark.parametrize(
    "mode", ["different", (spaces.Box(0, 1, (2, 3)), spaces.Box(0, 1, (3,)))], ids=str
)
def test_other_shapes_are_refused_naming_the_env(mode: Any) -> None:
    fns = [
        functools.partial(SpaceEnv, spaces.Box(0.0, 1.0, (3,), np.float32), ACTIONS),
        functools.partial(SpaceEnv, spaces.Box(0.0, 1.0, (4,), np.float32), ACTIONS),
    ]
    with pytest.raises(ValueError, match=r"one shape and dtype: env \d has Box") as caught:
        aiovec.BlockingVectorEnv(fns, observation_mode=mode)
    assert isinstance(caught.value, RuntimeError)


def test_other_dtypes_are_refused_under_different() -> None:
    fns = [bounded_fns(1)[0], bounded_fns(2, np.float64)[1]]
    with pytest.raises(ValueError, match=r"env 1 has Box.*float64"):
        aiovec.BlockingVectorEnv(fns, observation_mode="different")


def test_action_spaces_must_still_match() -> None:
    fns = [
        functools.partial(SpaceEnv, spaces.Box(0.0, i + 1.0, (2,)), spaces.Discrete(i + 2))
        for i in range(2)
    ]
    with pytest.raises(ValueError, match="share one action_space: env 1 has Discrete"):
        aiovec.BlockingVectorEnv(fns, observation_mode="different")


@pytest.mark.parametrize(
    ("mode", "error", "words"),
    [
        ("invalid", ValueError, "Invalid `observation_mode`.*actual got invalid"),
        (None, ValueError, "Invalid `observation_mode`"),
        ((spaces.Box(0, 1), "single"), TypeError, "two gymnasium Spaces"),
    ],
    ids=["word", "none", "tuple-of-other"],
)
def test_a_bad_mode_is_refused_before_any_env_is_built(
    mode: Any, error: type[Exception], words: str
) -> None:
    built: list[int] = []

    def factory() -> SpaceEnv:
        built.append(1)
        return SpaceEnv()

    with pytest.raises(error, match=words):
        aiovec.AsyncioVectorEnv([factory] * 2, observation_mode=mode)
    assert built == []
