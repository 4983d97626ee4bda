"""``aiovec.compat.sb3``: an aiovec vector env as a Stable-Baselines3 ``VecEnv``.

The oracle is SB3's own ``DummyVecEnv`` over the same envs: with the same
seeds and actions, every observation, reward, done, info (with
``terminal_observation`` and ``TimeLimit.truncated``) and ``reset_infos`` entry
must be identical.  Skipped when Stable-Baselines3 is not installed (the extra
``sb3``); CI installs it.
"""

from __future__ import annotations

import functools
import importlib
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.testing import AsyncTwin, FaultyEnv, SpaceEnv

pytest.importorskip("stable_baselines3", reason='needs the "sb3" extra: pip install "aiovec[sb3]"')

from stable_baselines3 import PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from aiovec.compat.sb3 import SB3VecEnv, make_sb3_env, unbatch_infos

NUM_ENVS = 3
SPACES = {
    "box-discrete": (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3)),
    "dict-box": (
        spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (2,), np.float64), "id": spaces.Discrete(4)}),
        spaces.Box(-2.0, 2.0, (2,), np.float32),
    ),
}


def space_env(name):
    obs_space, act_space = SPACES[name]
    return functools.partial(SpaceEnv, obs_space, act_space, min_len=1, max_len=4)


def async_twin(make):
    return lambda: AsyncTwin(make(), seed=0)


def build(front, backend, flavour, make, **kwargs):
    fns = [make if flavour == "sync" else async_twin(make)] * NUM_ENVS
    cls = aiovec.BlockingVectorEnv if front == "blocking" else aiovec.AsyncioVectorEnv
    return SB3VecEnv(cls(fns, backend=backend, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs))


def assert_same(ours, theirs, where=""):
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        assert sorted(ours) == sorted(theirs), where
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, list | tuple):
        assert len(ours) == len(theirs), where
        for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{k}]")
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=where)
        assert np.asarray(ours).dtype == np.asarray(theirs).dtype or np.isscalar(theirs), where


CASES = [
    ("blocking", "inline", "sync"),
    ("blocking", "thread", "sync"),
    ("blocking", "process", "sync"),
    ("blocking", "inline", "async"),
    ("await", "inline", "sync"),
    ("await", "inline", "async"),
]


@pytest.mark.parametrize("space", sorted(SPACES))
@pytest.mark.parametrize(("front", "backend", "flavour"), CASES)
def test_every_result_matches_dummy_vec_env(space, front, backend, flavour):
    make = space_env(space)
    ours = build(front, backend, flavour, make)
    theirs = DummyVecEnv([make] * NUM_ENVS)
    rng = np.random.default_rng(0)
    ours.action_space.seed(1)
    try:
        for seed in (7, None):  # a seeded reset, then one that goes on from the generators
            ours.seed(seed) if seed is not None else None
            theirs.seed(seed) if seed is not None else None
            assert_same(ours.reset(), theirs.reset(), "reset obs")
            assert_same(ours.reset_infos, theirs.reset_infos, "reset_infos")
            for t in range(12):
                actions = np.stack([ours.action_space.sample() for _ in range(NUM_ENVS)])
                if rng.random() < 0.5:  # both ways SB3 steps
                    got = ours.step(actions)
                else:
                    ours.step_async(actions)
                    got = ours.step_wait()
                want = theirs.step(actions)
                assert_same(list(got), list(want), f"step {t}")
                assert_same(ours.reset_infos, theirs.reset_infos, f"reset_infos after step {t}")
    finally:
        ours.close()
        theirs.close()


def test_the_episode_ends_travel_as_sb3_wants_them():
    ours = build("blocking", "inline", "sync", space_env("box-discrete"))
    ours.seed(0)
    ours.reset()
    ended = {"terminated": 0, "truncated": 0}
    for _ in range(20):
        _obs, _rewards, dones, infos = ours.step(np.zeros(NUM_ENVS, np.int64))
        assert dones.dtype == np.bool_
        for i in np.flatnonzero(dones):
            assert infos[i]["terminal_observation"].shape == (3,)
            assert ours.reset_infos[i]["reset"]  # SpaceEnv's reset info
            ended["truncated" if infos[i]["TimeLimit.truncated"] else "terminated"] += 1
    ours.close()
    assert ended["terminated"] > 0
    assert ended["truncated"] > 0


def test_ppo_learns_exactly_what_it_learns_on_dummy_vec_env():
    torch = pytest.importorskip(
        "torch", reason='needs the "sb3" extra (torch): pip install "aiovec[sb3]"'
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic, in the same order, for both runs

    def make():
        return gymnasium.make("CartPole-v1")

    def train(venv):
        model = PPO(
            "MlpPolicy",
            VecMonitor(venv),
            n_steps=256,
            batch_size=256,
            n_epochs=2,
            seed=0,
            device="cpu",
        )
        model.learn(total_timesteps=4 * 1024)
        episodes = [info["r"] for info in model.ep_info_buffer]
        weights = {k: v.clone() for k, v in model.policy.state_dict().items()}
        venv.close()
        return episodes, weights, model.num_timesteps

    try:
        ours = train(make_sb3_env([make] * 4))
        theirs = train(DummyVecEnv([make] * 4))
    finally:
        torch.set_num_threads(threads)
    assert ours[2] == theirs[2] == 4 * 1024
    assert len(ours[0]) > 0
    assert ours[0] == theirs[0]  # the same episodes...
    for name, value in theirs[1].items():  # ...and bit for bit the same policy
        assert torch.equal(ours[1][name], value), name


def test_get_attr_set_attr_and_env_method():
    venv = build("blocking", "inline", "sync", space_env("box-discrete"))
    venv.reset()
    assert venv.get_attr("tag") == ["space-env"] * NUM_ENVS
    assert venv.get_attr("episodes", indices=[2, 0]) == [1, 1]
    assert venv.get_attr("episodes", indices=np.int64(1)) == [1]
    assert venv.has_attr("tag")
    assert not venv.has_attr("no_such_attribute")
    with pytest.raises(AttributeError, match="no_such_attribute"):
        venv.get_attr("no_such_attribute")
    venv.set_attr("tag", [1, 2, 3])  # one value for every env, even a list of num_envs items
    assert venv.get_attr("tag") == [[1, 2, 3]] * NUM_ENVS
    assert venv.env_method("add", 1, b=2) == [3] * NUM_ENVS
    assert venv.env_method("add", 1, indices=[0, 1, 2]) == [1] * NUM_ENVS
    venv.close()


@pytest.mark.parametrize("method", ["set_attr", "env_method"])
def test_writes_to_a_subset_of_envs_are_refused(method):
    venv = build("blocking", "inline", "sync", space_env("box-discrete"))
    with pytest.raises(NotImplementedError, match=r"indices=\[0\]"):
        getattr(venv, method)("tag", 1, indices=[0])
    assert venv.get_attr("tag") == ["space-env"] * NUM_ENVS  # nothing was touched
    venv.close()


def test_env_is_wrapped():
    def make():
        return Monitor(gymnasium.make("CartPole-v1"))

    venv = make_sb3_env([make, lambda: gymnasium.make("CartPole-v1")])
    assert venv.env_is_wrapped(Monitor) == [True, False]
    assert venv.env_is_wrapped(Monitor, indices=1) == [False]
    venv.close()


def test_env_is_wrapped_on_the_process_backend_says_what_to_do():
    venv = make_sb3_env([lambda: gymnasium.make("CartPole-v1")], backend="process")
    with pytest.raises(NotImplementedError, match="VecMonitor"):
        venv.env_is_wrapped(Monitor)
    venv.close()


def test_options_are_used_once_by_the_next_reset():
    venv = build("blocking", "inline", "sync", space_env("box-discrete"))
    venv.set_options({"length": 2})  # SpaceEnv: episodes of exactly 2 steps
    venv.reset()
    actions = np.zeros(NUM_ENVS, np.int64)
    assert not venv.step(actions)[2].any()
    assert venv.step(actions)[2].all()
    venv.set_options([{"length": 2}, {"length": 3}, {"length": 2}])
    with pytest.raises(NotImplementedError, match="same options"):
        venv.reset()
    venv.close()


def test_reset_after_step_async_collects_the_step_in_flight():
    venv = build("blocking", "thread", "sync", space_env("box-discrete"))
    venv.reset()
    venv.step_async(np.zeros(NUM_ENVS, np.int64))
    obs = venv.reset()
    assert obs.shape == (NUM_ENVS, 3)
    assert len(venv.step(np.zeros(NUM_ENVS, np.int64))[3]) == NUM_ENVS
    venv.close()


def test_a_restarted_env_is_a_truncation_without_terminal_observation():
    def make():
        return FaultyEnv(SpaceEnv(min_len=50, max_len=50), method="step", at=2)

    venv = make_sb3_env([make] * 2, on_error="restart")
    venv.reset()
    venv.step(np.zeros(2, np.int64))
    _obs, rewards, dones, infos = venv.step(np.zeros(2, np.int64))  # every env fails once
    assert dones.all()
    assert (rewards == 0).all()
    for info in infos:
        assert info["TimeLimit.truncated"]
        assert "terminal_observation" not in info
    venv.close()


def test_only_same_step_vector_envs_are_accepted():
    next_step = aiovec.BlockingVectorEnv([SpaceEnv])
    with pytest.raises(ValueError, match="SAME_STEP"):
        SB3VecEnv(next_step)
    next_step.close()
    sync = gymnasium.vector.SyncVectorEnv([SpaceEnv])
    with pytest.raises(TypeError, match="got SyncVectorEnv"):
        SB3VecEnv(sync)
    sync.close()
    with pytest.raises(TypeError, match="autoreset_mode"):
        make_sb3_env([SpaceEnv], autoreset_mode="same-step")


def test_unbatch_infos():
    infos = {
        "a": np.array([1, 2, 3]),
        "_a": np.array([True, False, True]),
        "b": np.array([7, 8, 9]),  # no mask: every env's
        "n": {"x": np.array([0.5, 0.0, 0.0]), "_x": np.array([True, False, False])},
        "_n": np.array([True, False, False]),
    }
    assert unbatch_infos(infos, 3) == [
        {"a": 1, "b": 7, "n": {"x": 0.5}},
        {"b": 8},
        {"a": 3, "b": 9},
    ]


def test_import_without_sb3_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m.split(".")[0] == "stable_baselines3"]:
        monkeypatch.setitem(sys.modules, name, None)  # None: "not importable"
    monkeypatch.delitem(sys.modules, "aiovec.compat.sb3")
    with pytest.raises(ImportError, match=r'pip install "aiovec\[sb3\]"'):
        importlib.import_module("aiovec.compat.sb3")
