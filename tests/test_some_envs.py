"""Calls on some envs, wrappers asked where the envs live, and one env object per factory.

Every test runs over backends x front ends x env flavours (``conftest.py``):
``call``/``get_attr``/``set_attr``/``env_is_wrapped`` with ``env_ids`` reach the
envs named and no others (process and Ray workers answer for their own envs),
bad ``env_ids`` are refused before any env is touched, and factories that
return one env object twice are refused naming both.
"""

from __future__ import annotations

import functools

import pytest
from conftest import counters, open_front_end, space_env_fns
from gymnasium.wrappers import RecordEpisodeStatistics

from aiovec.testing import AsyncTwin, SpaceEnv

NUM_ENVS = 3


@pytest.fixture
def venv(make_venv):
    """A reset aiovec vector env of ``NUM_ENVS`` SpaceEnvs (long episodes), one step in."""
    adapter = make_venv(space_env_fns(NUM_ENVS, min_len=50, max_len=50))
    adapter.reset(seed=3)
    adapter.step([0] * NUM_ENVS)
    return adapter


def test_set_attr_reaches_the_envs_named_and_no_other(venv):
    venv.set_attr("tag", ["for 2", "for 0"], env_ids=[2, 0])  # one value per env named
    assert venv.get_attr("tag") == ("for 0", "space-env", "for 2")
    venv.set_attr("tag", "one for all", env_ids=[1])
    assert venv.get_attr("tag") == ("for 0", "one for all", "for 2")


def test_get_attr_and_call_answer_in_the_order_of_env_ids(venv):
    venv.set_attr("tag", ["a", "b", "c"])
    assert venv.get_attr("tag", env_ids=[2, 0]) == ("c", "a")
    assert venv.call("add", 1, b=2, env_ids=[1]) == (4,)  # 1 + 2 + one step taken
    assert venv.call("tag", env_ids=(0,)) == ("a",)  # an attribute is read


def test_call_runs_only_on_the_envs_named(venv):
    steps = venv.get_attr("episode_steps")
    venv.call("reset", env_ids=[1])  # SpaceEnv.reset starts an episode: counters move
    assert venv.get_attr("episodes") == (1, 2, 1)
    assert venv.get_attr("episode_steps") == (steps[0], 0, steps[2])


BAD_ENV_IDS = [
    ([0, 3], ValueError, r"env_ids must be in range\(num_envs=3\), got \[3\]"),
    ([1, 1], ValueError, r"env_ids must be distinct"),
    ([], ValueError, r"env_ids must name at least one env"),
    ([[0]], TypeError, r"env_ids must be a 1-D sequence"),
    (["0"], TypeError, r"env_ids must be a 1-D sequence"),
]


def test_bad_env_ids_are_refused_before_any_env_is_touched(venv):
    before = counters(venv), venv.get_attr("tag")
    for env_ids, error, match in BAD_ENV_IDS:
        for name, call in {
            "call": lambda: venv.call("reset", env_ids=env_ids),  # noqa: B023  (called here)
            "get_attr": lambda: venv.get_attr("tag", env_ids=env_ids),  # noqa: B023
            "set_attr": lambda: venv.set_attr("tag", "x", env_ids=env_ids),  # noqa: B023
            "env_is_wrapped": lambda: venv.env_is_wrapped(SpaceEnv, env_ids=env_ids),  # noqa: B023
        }.items():
            with pytest.raises(error, match=match):
                call()
            assert (counters(venv), venv.get_attr("tag")) == before, (name, env_ids)
    venv.step([0] * NUM_ENVS)  # still usable


def test_set_attr_wants_one_value_per_env_named(venv):
    with pytest.raises(ValueError, match=r"len\(env_ids\)=2 values .* got length 3"):
        venv.set_attr("tag", ["a", "b", "c"], env_ids=[0, 2])
    assert venv.get_attr("tag") == ("space-env",) * NUM_ENVS


def recorded_space_env() -> RecordEpisodeStatistics:
    return RecordEpisodeStatistics(SpaceEnv())


@pytest.mark.parametrize("flavour", ["sync"])  # an AsyncTwin is no gymnasium wrapper of its env
def test_env_is_wrapped_asks_each_env_where_it_lives(make_venv, flavour):
    venv = make_venv([recorded_space_env, SpaceEnv, recorded_space_env])
    assert venv.env_is_wrapped(RecordEpisodeStatistics) == (True, False, True)
    assert venv.env_is_wrapped(RecordEpisodeStatistics, env_ids=[1, 0]) == (False, True)
    assert venv.env_is_wrapped(SpaceEnv) == (True,) * 3  # the env itself counts
    with pytest.raises(TypeError, match="wrapper_class must be a class, got"):
        venv.env_is_wrapped("RecordEpisodeStatistics")


def _same(holder: list[object]) -> object:
    return holder[0]


def test_factories_that_return_one_env_twice_are_refused(front_end, backend, flavour):
    """Caught where the envs are built: in this process, or by the worker hosting both."""
    make = SpaceEnv if flavour == "sync" else lambda: AsyncTwin(SpaceEnv())
    shared = [make()]  # process/ray: pickled once with the group's factories, so still one
    fns = [make, functools.partial(_same, shared), functools.partial(_same, shared)]
    with pytest.raises(
        ValueError, match=r"env_fns\[1\]\(\) and env_fns\[2\]\(\) returned the same"
    ):
        open_front_end(front_end, fns, backend=backend, num_workers=1)
