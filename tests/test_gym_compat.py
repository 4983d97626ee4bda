"""``BlockingVectorEnv`` is a drop-in ``SyncVectorEnv``: gymnasium's wrappers, scripts, ``make``."""

from __future__ import annotations

import asyncio
import copy
import functools
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import (
    BACKENDS,
    LOCAL_BACKENDS,
    Lockstep,
    assert_results_equal,
    assert_same,
    assert_spaces_equal,
    open_front_end,
    oracle_env,
    space_env_fns,
)
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import ClipAction, NormalizeReward, RecordEpisodeStatistics

import aiovec


@pytest.fixture
def make_blocking(backend, flavour):
    """Build a bare ``aiovec.BlockingVectorEnv`` (plain factories in); closed at teardown."""
    opened = []

    def make(env_fns, **kwargs):
        adapter = open_front_end("blocking", env_fns, flavour=flavour, backend=backend, **kwargs)
        opened.append(adapter)
        return adapter.venv

    yield make
    for adapter in opened:
        adapter.shutdown()


def test_blocking_vector_env_is_a_gymnasium_vector_env(make_blocking):
    envs = make_blocking(space_env_fns(2))
    assert isinstance(envs, gymnasium.vector.VectorEnv)
    assert envs.unwrapped is envs
    assert envs.closed is False
    envs.close()
    assert envs.closed is True


def _cleanrl_loop(envs, steps: int, seed: int = 1):
    """A CleanRL-style rollout; yields each step's result."""
    envs.action_space.seed(seed)
    obs, _ = envs.reset(seed=seed)
    yield obs
    for _ in range(steps):
        yield envs.step(envs.action_space.sample())


EPISODE_TIME = frozenset({("episode", "t")})  # wall-clock seconds: never equal


@pytest.mark.parametrize(
    "mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=["NextStep", "SameStep"]
)
def test_cleanrl_loop_with_record_episode_statistics(make_blocking, mode):
    fns = space_env_fns(4, "box-discrete", min_len=3, max_len=25)
    envs = RecordEpisodeStatistics(make_blocking(fns, autoreset_mode=mode))
    with oracle_env(fns, autoreset_mode=mode) as sync:
        oracle = RecordEpisodeStatistics(sync)
        episodes = 0
        for step, (actual, expected) in enumerate(
            zip(_cleanrl_loop(envs, 200), _cleanrl_loop(oracle, 200), strict=True)
        ):
            if step == 0:
                assert_same(actual, expected, ("obs",))
                continue
            assert_results_equal(actual, expected, ignore=EPISODE_TIME)
            infos, expected_infos = actual[4], expected[4]
            if "episode" in expected_infos:
                done = expected_infos["_episode"]
                episodes += int(done.sum())
                t = infos["episode"]["t"]
                assert t.shape == (4,)
                assert (t[done] >= 0).all()
                assert (t[~done] == 0).all()
        assert episodes > 10
        assert envs.episode_count == oracle.episode_count
        assert list(envs.return_queue) == list(oracle.return_queue)
        assert list(envs.length_queue) == list(oracle.length_queue)


def test_normalize_reward(make_blocking):
    fns = space_env_fns(3, "image-box", min_len=2, max_len=10)
    envs = NormalizeReward(make_blocking(fns), gamma=0.9)
    with oracle_env(fns) as sync:
        oracle = NormalizeReward(sync, gamma=0.9)
        for step, (actual, expected) in enumerate(
            zip(_cleanrl_loop(envs, 60, seed=3), _cleanrl_loop(oracle, 60, seed=3), strict=True)
        ):
            if step:
                assert_results_equal(actual, expected)
            else:
                assert_same(actual, expected)


def test_clip_action(make_blocking):
    fns = space_env_fns(3, "image-box", min_len=2, max_len=10)
    envs = ClipAction(make_blocking(fns))
    with oracle_env(fns) as sync:
        oracle = ClipAction(sync)
        rng = np.random.default_rng(0)
        assert_results_equal(envs.reset(seed=5), oracle.reset(seed=5), ("obs", "infos"))
        for _ in range(20):
            actions = (rng.normal(size=(3, 2)) * 5).astype(np.float32)  # mostly out of bounds
            assert_results_equal(envs.step(actions.copy()), oracle.step(actions.copy()))


def test_sync_vector_env_script_runs_by_swapping_the_constructor(make_blocking):
    """Plain-Python actions and the usual attribute reads, as scripts use SyncVectorEnv."""
    fns = space_env_fns(3, "box-discrete", min_len=2, max_len=6)
    envs = make_blocking(fns)
    with oracle_env(fns) as oracle:
        assert_spaces_equal(envs, oracle)
        assert_results_equal(envs.reset(seed=2), oracle.reset(seed=2), ("obs", "infos"))
        for i in range(10):
            actions = [i % 3, (i + 1) % 3, (i + 2) % 3]  # a list, not an array
            assert_results_equal(envs.step(list(actions)), oracle.step(list(actions)))


@pytest.mark.asyncio
@pytest.mark.async_envs
@pytest.mark.parametrize("backend", BACKENDS)
async def test_blocking_works_inside_a_running_event_loop(backend):
    """As in Jupyter: blocking calls made from code that runs on an event loop."""
    fns = space_env_fns(3, "dict-tuple", min_len=1, max_len=4)
    envs = open_front_end("blocking", fns, flavour="async", backend=backend)
    try:
        with oracle_env(fns) as oracle:
            lock = Lockstep(envs, oracle, action_seed=4)
            lock.reset(seed=9)
            for _ in range(8):
                lock.step()
            lock.get_attr("tag")
    finally:
        envs.shutdown()
    await asyncio.sleep(0)


# --------------------------------------------------------------------------- aiovec.make


def _drive_pair(actual_env, oracle, steps: int, seed: int) -> None:
    space = copy.deepcopy(oracle.action_space)
    space.seed(seed)
    assert_results_equal(actual_env.reset(seed=seed), oracle.reset(seed=seed), ("obs", "infos"))
    for _ in range(steps):
        actions = space.sample()
        assert_results_equal(actual_env.step(actions.copy()), oracle.step(actions.copy()))


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)  # a registry id: built here
def test_make_blocking_cartpole_matches_make_vec(backend):
    envs = aiovec.make("CartPole-v1", num_envs=4, blocking=True, backend=backend)
    try:
        assert isinstance(envs, aiovec.BlockingVectorEnv)
        oracle = gymnasium.make_vec("CartPole-v1", 4, vectorization_mode="sync")
        try:
            assert_spaces_equal(envs, oracle)
            _drive_pair(envs, oracle, 300, seed=42)
        finally:
            oracle.close()
    finally:
        envs.close()


@pytest.mark.parametrize("backend", LOCAL_BACKENDS)  # a registry id: built here
def test_make_passes_env_kwargs_and_wrappers(backend):
    wrappers = [functools.partial(gymnasium.wrappers.TimeLimit, max_episode_steps=7)]
    kwargs = {"sutton_barto_reward": True}
    envs = aiovec.make(
        "CartPole-v1", num_envs=3, blocking=True, backend=backend, wrappers=wrappers, **kwargs
    )
    try:
        oracle = gymnasium.make_vec(
            "CartPole-v1", 3, vectorization_mode="sync", wrappers=wrappers, **kwargs
        )
        try:
            _drive_pair(envs, oracle, 40, seed=3)
        finally:
            oracle.close()
    finally:
        envs.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", LOCAL_BACKENDS)  # a registry id: built here
async def test_make_await_returns_an_asyncio_vector_env(backend):
    venv = aiovec.make("CartPole-v1", num_envs=2, blocking=False, backend=backend)
    assert isinstance(venv, aiovec.AsyncioVectorEnv)
    oracle = gymnasium.make_vec("CartPole-v1", 2, vectorization_mode="sync")
    async with venv:
        try:
            space = copy.deepcopy(oracle.action_space)
            space.seed(0)
            assert_results_equal(await venv.reset(seed=1), oracle.reset(seed=1), ("obs", "infos"))
            for _ in range(50):
                actions = space.sample()
                assert_results_equal(await venv.step(actions.copy()), oracle.step(actions.copy()))
        finally:
            oracle.close()
    assert venv.closed


def test_make_default_is_a_gymnasium_vector_env():
    """``obs, infos = envs.reset()`` as after ``gymnasium.make_vec`` (issue 35)."""
    with aiovec.make("CartPole-v1", 2) as envs:
        assert isinstance(envs, aiovec.BlockingVectorEnv)
        assert isinstance(envs, gymnasium.vector.VectorEnv)
        obs, _infos = envs.reset(seed=0)
        assert obs.shape == (2, 4)


@pytest.mark.parametrize(
    "call",
    [
        {"id": "CartPole-v1"},
        {"id": "CartPole-v1", "num_envs": 3, "vectorization_mode": "sync"},
        {"id": "CartPole-v1", "num_envs": 2, "vectorization_mode": gymnasium.VectorizeMode.SYNC},
        {
            "id": "CartPole-v1",
            "num_envs": 2,
            "vectorization_mode": "async",
            "vector_kwargs": {"shared_memory": False, "context": "spawn", "daemon": True},
        },
        {
            "id": gymnasium.spec("CartPole-v1"),
            "num_envs": 2,
            "vectorization_mode": "sync",
            "vector_kwargs": {"copy": False, "autoreset_mode": AutoresetMode.SAME_STEP},
            "wrappers": [functools.partial(gymnasium.wrappers.TimeLimit, max_episode_steps=5)],
            "sutton_barto_reward": True,
            "render_mode": "rgb_array",
        },
    ],
    ids=["id-only", "sync", "enum", "async-transport-kwargs", "everything"],
)
def test_any_make_vec_call_works_unchanged_and_is_a_vector_env(call):
    """Each of make_vec's arguments, by keyword, as gymnasium.make_vec takes them."""
    envs = aiovec.make(**call)
    try:
        assert isinstance(envs, gymnasium.vector.VectorEnv)
        transport = ("shared_memory", "context", "daemon")  # AsyncVectorEnv's own
        kept = {k: v for k, v in call.get("vector_kwargs", {}).items() if k not in transport}
        oracle = gymnasium.make_vec(**{**call, "vectorization_mode": "sync", "vector_kwargs": kept})
        try:
            assert envs.num_envs == oracle.num_envs
            assert envs.render_mode == oracle.render_mode
            assert_spaces_equal(envs, oracle)
            _drive_pair(envs, oracle, 12, seed=2)
        finally:
            oracle.close()
    finally:
        envs.close()


@pytest.mark.asyncio
async def test_make_blocking_false_is_the_await_api():
    async with aiovec.make("CartPole-v1", num_envs=2, blocking=False) as venv:
        assert isinstance(venv, aiovec.AsyncioVectorEnv)
        obs, _infos = await venv.reset(seed=0)
        assert obs.shape == (2, 4)


@pytest.mark.parametrize(
    ("mode", "backend"),
    [("sync", "inline"), ("async", "process"), (gymnasium.VectorizeMode.ASYNC, "process")],
)
def test_make_takes_make_vecs_arguments_in_its_order(mode, backend):
    """A gymnasium.make_vec call works as an aiovec.make call: sync -> inline, async -> process."""
    wrappers = [functools.partial(gymnasium.wrappers.TimeLimit, max_episode_steps=9)]
    args = ("CartPole-v1", 3, mode, {"autoreset_mode": AutoresetMode.SAME_STEP}, wrappers)
    envs = aiovec.make(*args, sutton_barto_reward=True)
    try:
        assert isinstance(envs, aiovec.BlockingVectorEnv)
        assert envs.vector_env.backend == backend
        oracle = gymnasium.make_vec(*args, sutton_barto_reward=True)
        try:
            assert_spaces_equal(envs, oracle)
            _drive_pair(envs, oracle, 30, seed=5)
        finally:
            oracle.close()
    finally:
        envs.close()


def test_make_an_explicit_backend_wins_over_the_mode():
    with aiovec.make("CartPole-v1", 2, vectorization_mode="async", backend="thread") as envs:
        assert envs.vector_env.backend == "thread"
    kwargs = {"backend": "inline", "copy": False}
    with aiovec.make("CartPole-v1", 2, "async", vector_kwargs=kwargs) as envs:
        assert (envs.vector_env.backend, envs.copy) == ("inline", False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"vectorization_mode": "vector_entry_point"}, ValueError, "needs a registry id"),
        ({"vectorization_mode": "threads"}, ValueError, "vectorization_mode must be"),
        ({"vectorization_mode": "sync", "blocking": False}, ValueError, "blocking=False"),
        ({"vector_kwargs": {"worker": print}}, TypeError, r"vector_kwargs\['worker'\]"),
        ({"vector_kwargs": {"shared_memory": True, "spam": 1}}, TypeError, "'spam'"),
        ({"id": "CartPole-v1"}, TypeError, "got the env twice"),
        ({"vector_kwargs": [("copy", False)]}, TypeError, "vector_kwargs must be a dict"),
        ({"vector_kwargs": {"copy": False}, "copy": True}, ValueError, "given both"),
        ({"vector_kwargs": {"backend": "thread"}, "backend": "inline"}, ValueError, "given both"),
    ],
)
def test_make_refuses_conflicting_arguments_before_building_anything(kwargs, error, match):
    built = []

    def factory():
        built.append(1)
        return gymnasium.make("CartPole-v1")

    with pytest.raises(error, match=match):
        aiovec.make(factory, 2, **kwargs)
    assert not built


# --------------------------------------------------------------------------- vector entry points


@pytest.fixture
def counted_id():
    """A registered id with a vector entry point that records each vector env it builds."""
    built: list[dict[str, Any]] = []

    def vector_entry_point(**kwargs: Any) -> Any:
        built.append(dict(kwargs))
        kwargs.pop("max_episode_steps", None)  # what make_vec adds from the spec
        return CartPoleVectorEnv(**kwargs)

    gymnasium.register(
        "AiovecCounted-v0",
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        vector_entry_point=vector_entry_point,
        max_episode_steps=20,
    )
    try:
        yield "AiovecCounted-v0", built
    finally:
        del gymnasium.registry["AiovecCounted-v0"]


@pytest.mark.parametrize("mode", ["vector_entry_point", gymnasium.VectorizeMode.VECTOR_ENTRY_POINT])
def test_make_with_the_vector_entry_point_is_gymnasiums_own_vector_env(mode):
    """As ``gymnasium.make_vec`` builds it: the same class, spec and results."""
    kwargs = {"sutton_barto_reward": True, "render_mode": "rgb_array"}
    envs = aiovec.make("CartPole-v1", 5, mode, **kwargs)
    oracle = gymnasium.make_vec("CartPole-v1", 5, "vector_entry_point", **kwargs)
    try:
        assert type(envs) is type(oracle) is CartPoleVectorEnv
        assert not isinstance(envs, aiovec.BlockingVectorEnv)
        assert envs.spec == oracle.spec
        assert envs.spec.kwargs["vectorization_mode"] == "vector_entry_point"
        assert envs.render_mode == "rgb_array"
        _drive_pair(envs, oracle, 100, seed=4)
    finally:
        envs.close()
        oracle.close()


def test_make_hands_num_envs_and_the_env_kwargs_to_the_vector_entry_point(counted_id):
    env_id, built = counted_id
    envs = aiovec.make(env_id, 3, "vector_entry_point", sutton_barto_reward=True)
    assert envs.num_envs == 3
    envs.close()
    assert built == [{"num_envs": 3, "sutton_barto_reward": True, "max_episode_steps": 20}]


def test_without_a_mode_make_still_builds_aiovecs_vector_env(counted_id):
    """Unlike make_vec, no mode is not the vector entry point (docs/migrating.md says why)."""
    env_id, built = counted_id
    with aiovec.make(env_id, 2) as envs:
        assert isinstance(envs, aiovec.BlockingVectorEnv)
    assert built == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"blocking": False}, r"returns a gymnasium vector env \(gymnasium's own\), but blocking"),
        ({"backend": "process"}, "takes none of aiovec's options: leave out backend,"),
        ({"step_timeout": 1.0, "copy": False}, "leave out copy, step_timeout,"),
        ({"vector_kwargs": {"copy": False}}, "leave out vector_kwargs,"),
        ({"wrappers": [gymnasium.wrappers.RecordEpisodeStatistics]}, "leave out wrappers,"),
    ],
)
def test_make_refuses_aiovecs_options_with_the_vector_entry_point(counted_id, kwargs, match):
    env_id, built = counted_id
    with pytest.raises(ValueError, match=match):
        aiovec.make(env_id, 2, "vector_entry_point", **kwargs)
    assert built == []


def test_make_refuses_the_vector_entry_point_of_an_id_that_has_none():
    with pytest.raises(ValueError, match="Acrobot-v1 has no vector entry point"):
        aiovec.make("Acrobot-v1", 2, vectorization_mode="vector_entry_point")
