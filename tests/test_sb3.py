"""``aiovec.compat.sb3``: an aiovec vector env as a Stable-Baselines3 ``VecEnv``.

The oracle is SB3's own ``DummyVecEnv`` over the same envs: with the same
seeds and actions, every observation, reward, done, info (with
``terminal_observation`` and ``TimeLimit.truncated``) and ``reset_infos`` entry
must be identical.  Skipped when Stable-Baselines3 is not installed (the extra
``sb3``); CI installs it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import sys

import gymnasium
import numpy as np
import pytest
from conftest import HAVE_RAY, shared_actors
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


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_indices_reach_the_envs_named_and_no_other(backend):
    """SB3's HER replay buffer calls ``env_method("compute_reward", ..., indices=[0])``."""
    venv = make_sb3_env([space_env("box-discrete")] * NUM_ENVS, backend=backend, num_workers=2)
    venv.reset()
    venv.set_attr("tag", "mine", indices=[2, 0])
    assert venv.get_attr("tag") == ["mine", "space-env", "mine"]
    assert venv.get_attr("tag", indices=1) == ["space-env"]
    assert venv.env_method("reset", indices=np.int64(1))[0][1]["reset"]
    assert venv.get_attr("episodes") == [1, 2, 1]  # only env 1 was reset again
    assert venv.env_method("add", 1, b=2, indices=[2, 1]) == [3, 3]
    assert venv.get_attr("tag", indices=[-1, 1]) == ["mine", "space-env"]  # as SB3's list
    assert venv.env_method("add", 1, indices=[]) == []  # as SB3: nothing to call
    assert venv.get_attr("tag", indices=[]) == []
    venv.set_attr("tag", "none", indices=[])
    assert venv.get_attr("tag") == ["mine", "space-env", "mine"]
    venv.close()


def test_env_is_wrapped():
    def make():
        return Monitor(gymnasium.make("CartPole-v1"))

    venv = make_sb3_env([make, lambda: gymnasium.make("CartPole-v1")])
    assert venv.env_is_wrapped(Monitor) == [True, False]
    assert venv.env_is_wrapped(Monitor, indices=1) == [False]
    venv.close()


def test_env_is_wrapped_asks_the_workers():
    """``evaluate_policy`` asks it of any VecEnv without ``VecMonitor`` (Ray: test_some_envs)."""

    def make():
        return Monitor(gymnasium.make("CartPole-v1"))

    venv = make_sb3_env(
        [make, lambda: gymnasium.make("CartPole-v1"), make], backend="process", num_workers=2
    )
    assert venv.env_is_wrapped(Monitor) == [True, False, True]
    assert venv.env_is_wrapped(Monitor, indices=[1, 2]) == [False, True]
    venv.close()


def test_options_are_used_once_by_the_next_reset():
    venv = build("blocking", "inline", "sync", space_env("box-discrete"))
    venv.set_options({"length": 2})  # SpaceEnv: episodes of exactly 2 steps
    venv.reset()
    actions = np.zeros(NUM_ENVS, np.int64)
    assert not venv.step(actions)[2].any()
    assert venv.step(actions)[2].all()
    venv.set_options([{"length": 2}, {"length": 3}, {"length": 2}])
    venv.reset()  # by groups of envs with the same options, each env once
    assert venv.get_attr("episodes") == [3, 3, 3]  # a reset, an autoreset, this reset
    assert venv.step(actions)[2].tolist() == [False, False, False]
    assert venv.step(actions)[2].tolist() == [True, False, True]
    assert venv.reset_infos[1]["reset"]  # env 1 still carries its reset's info
    venv.close()


def test_different_options_per_env_need_a_first_reset():
    venv = build("blocking", "inline", "sync", space_env("box-discrete"))
    venv.set_options([{"length": 2}, {"length": 3}, {"length": 2}])
    with pytest.raises(NotImplementedError, match=r"needs a first reset\(\).*NEEDS_RESET"):
        venv.reset()
    assert venv.get_attr("episodes") == [0, 0, 0]  # nothing was touched
    venv.close()


def test_reset_after_step_async_collects_the_step_in_flight():
    venv = build("blocking", "thread", "sync", space_env("box-discrete"))
    venv.reset()
    venv.step_async(np.zeros(NUM_ENVS, np.int64))
    obs = venv.reset()
    assert obs.shape == (NUM_ENVS, 3)
    assert len(venv.step(np.zeros(NUM_ENVS, np.int64))[3]) == NUM_ENVS
    venv.close()


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
def test_a_second_step_async_is_refused_and_the_first_step_still_collected(backend):
    """Inline keeps the actions for step_wait's step; the others send them: the same rules."""
    venv = build("blocking", backend, "sync", space_env("box-discrete"))
    theirs = DummyVecEnv([space_env("box-discrete")] * NUM_ENVS)
    try:
        venv.seed(3)
        theirs.seed(3)
        venv.reset()
        theirs.reset()
        venv.step_async(np.ones(NUM_ENVS, np.int64))
        with pytest.raises(aiovec.StateError, match=r"still in flight"):
            venv.step_async(np.zeros(NUM_ENVS, np.int64))
        assert_same(list(venv.step_wait()), list(theirs.step(np.ones(NUM_ENVS, np.int64))))
    finally:
        venv.close()
        theirs.close()


@pytest.mark.parametrize("backend", ["inline", "thread"])
def test_reset_after_step_async_drops_or_collects_the_step(backend):
    venv = build("blocking", backend, "sync", space_env("box-discrete"))
    venv.reset()
    venv.step_async(np.zeros(NUM_ENVS, np.int64))
    obs = venv.reset()
    assert obs.shape == (NUM_ENVS, 3)
    with pytest.raises(aiovec.StateError, match="no env is in flight"):  # nothing to collect
        venv.step_wait()
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


class HeldObsEnv(gymnasium.Env):
    """Ends every step; returns its own ``obs`` array and its own ``held`` info object."""

    observation_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self):
        self.obs = np.zeros(2, np.float32)
        self.held = {"items": [1, 2]}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.obs, {}

    def step(self, action):
        return self.obs, 0.0, True, False, {"held": self.held}


@pytest.mark.parametrize("backend", ["inline", "thread", "process"])
def test_the_infos_returned_are_never_the_envs_own_objects(backend):
    """SB3's ``VecFrameStack`` edits ``terminal_observation`` in place, as DummyVecEnv allows."""
    venv = make_sb3_env([HeldObsEnv] * 2, backend=backend)
    venv.reset()
    _obs, _rewards, dones, infos = venv.step(np.zeros(2, np.int64))
    assert dones.all()
    infos[0]["terminal_observation"][0] = 7.0
    infos[0]["held"]["items"].append(3)
    assert venv.get_attr("obs")[0].tolist() == [0.0, 0.0]
    assert venv.get_attr("held")[0] == {"items": [1, 2]}
    venv.close()


COMPOSITE_ACTIONS = {
    "dict": spaces.Dict({"move": spaces.Discrete(3), "aim": spaces.Box(-1.0, 1.0, (2,))}),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))),
}


@pytest.mark.parametrize("kind", sorted(COMPOSITE_ACTIONS))
@pytest.mark.parametrize("form", [list, tuple])
def test_a_list_of_per_env_actions_steps_as_on_dummy_vec_env(kind, form):
    make = functools.partial(
        SpaceEnv, spaces.Box(-1.0, 1.0, (3,), np.float32), COMPOSITE_ACTIONS[kind], max_len=3
    )
    ours = make_sb3_env([make] * NUM_ENVS)
    theirs = DummyVecEnv([make] * NUM_ENVS)
    space = ours.action_space
    space.seed(4)
    try:
        for venv in (ours, theirs):
            venv.seed(2)
            venv.reset()
        for t in range(6):
            actions = form(space.sample() for _ in range(NUM_ENVS))
            assert_same(list(ours.step(actions)), list(theirs.step(actions)), f"step {t}")
        with pytest.raises(ValueError, match=r"one action per env \(num_envs=3\), got 2"):
            ours.step(form(space.sample() for _ in range(2)))
    finally:
        ours.close()
        theirs.close()


def test_factories_that_return_one_env_twice_are_refused():
    env = SpaceEnv()
    with pytest.raises(ValueError, match=r"env_fns\[0\]\(\) and env_fns\[1\]\(\)"):
        make_sb3_env([lambda: env] * 2)
    # make_vec_env(lambda: env) wraps one env in a new Monitor each time: still one env
    with pytest.raises(ValueError, match=r"env_fns\[1\]\(\) and env_fns\[2\]\(\).*SpaceEnv"):
        make_sb3_env([SpaceEnv, lambda: Monitor(env), lambda: Monitor(env)])


def deprecated(message):
    raise gymnasium.error.DeprecatedEnv(message)


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_factory_error_is_raised_as_itself(backend):
    """SB3's tests fall back from CliffWalking-v0 on ``except gym.error.DeprecatedEnv``."""
    fns = [SpaceEnv, functools.partial(deprecated, "use v1")]
    with pytest.raises(gymnasium.error.DeprecatedEnv, match="use v1") as raised:
        make_sb3_env(fns, backend=backend, num_workers=1)
    assert "(raised by env_fns[1](), as make_sb3_env built env 1)" in raised.value.__notes__


def test_a_first_step_without_reset_resets_the_envs_first():
    """SB3's vec envs pass such a step to the envs; aiovec's need a reset first."""
    venv = make_sb3_env([space_env("box-discrete")] * 2)
    venv.seed(5)
    _obs, _rewards, _dones, _infos = venv.step(np.zeros(2, np.int64))
    assert venv.get_attr("episodes") == [1, 1]
    assert venv.get_attr("episode_steps") == [1, 1]
    assert venv.reset_infos[0]["reset"]
    venv.close()


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_her_trains_with_four_envs(backend):
    """HER's replay buffer calls ``env_method("compute_reward", ..., indices=[i])``."""
    pytest.importorskip("torch")
    from stable_baselines3 import DQN, HerReplayBuffer
    from stable_baselines3.common.envs import BitFlippingEnv

    def make():
        return BitFlippingEnv(n_bits=4, continuous=False)

    venv = make_sb3_env([make] * 4, backend=backend, num_workers=2)
    model = DQN(
        "MultiInputPolicy",
        venv,
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs={"n_sampled_goal": 2, "goal_selection_strategy": "future"},
        learning_starts=40,
        train_freq=4,
        gradient_steps=1,
        buffer_size=2000,
        policy_kwargs={"net_arch": [16]},
        device="cpu",
        seed=0,
    )
    model.learn(total_timesteps=200)
    assert model.num_timesteps >= 200
    assert model.replay_buffer.size() > 0
    venv.close()


def failing_env(method, index):
    """Env ``index`` of three raises its own ``ConnectionResetError`` on its 2nd ``method``."""
    if index != 1:
        return space_env("box-discrete")()
    error = ConnectionResetError("simulator went away")
    return FaultyEnv(space_env("box-discrete")(), method=method, at=2, error=error)


def fail(venv, method):
    """The calls that reach ``method`` a 2nd time: a step, or a reset."""
    venv.reset()
    if method == "reset":
        venv.reset()
    else:
        venv.step_async(np.zeros(NUM_ENVS, np.int64))
        venv.step_wait()
        venv.step_async(np.zeros(NUM_ENVS, np.int64))
        venv.step_wait()


ERROR_CASES = [
    ("blocking", "inline"),
    ("blocking", "thread"),
    ("blocking", "process"),
    ("await", "inline"),
    pytest.param("blocking", "ray", marks=pytest.mark.skipif(not HAVE_RAY, reason="no ray")),
]


@pytest.mark.parametrize("method", ["step", "reset"])
@pytest.mark.parametrize(("front", "backend"), ERROR_CASES)
def test_an_envs_error_is_raised_as_itself_as_on_dummy_vec_env(front, backend, method):
    """Code written for DummyVecEnv catches the env's own exception type (issue 35)."""
    fns = [functools.partial(failing_env, method, i) for i in range(NUM_ENVS)]
    dummy = DummyVecEnv(fns)
    with pytest.raises(ConnectionResetError, match="simulator went away"):
        fail(dummy, method)
    dummy.close()
    kwargs = {"num_workers": 1, **shared_actors(backend)} if backend in ("process", "ray") else {}
    ours = SB3VecEnv(
        (aiovec.BlockingVectorEnv if front == "blocking" else aiovec.AsyncioVectorEnv)(
            fns, backend=backend, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs
        )
    )
    try:
        with pytest.raises(ConnectionResetError, match="simulator went away") as raised:
            fail(ours, method)
        assert type(raised.value) is ConnectionResetError
        assert f"(raised by env 1 in {method}()" in raised.value.__notes__[-1]
    finally:
        ours.close()


class Hanging(aiovec.AsyncEnv):
    observation_space = action_space = spaces.Discrete(2)

    async def reset(self, *, seed=None, options=None):
        return 0, {}

    async def step(self, action):
        await asyncio.Event().wait()


def test_aiovecs_own_failures_stay_aiovec_errors():
    """A timeout is aiovec's, not an exception of the env's: it is not unwrapped."""
    venv = make_sb3_env([Hanging, Hanging], step_timeout=0.01)
    venv.reset()
    with pytest.raises(aiovec.EnvTimeoutError, match="did not answer step"):
        venv.step(np.zeros(2, np.int64))
    venv.close()


class _OutOfBounds(gymnasium.Env):
    """Observations outside the declared Box, as SB3's own VecNormalize test env has."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([3.0], np.float32), {}

    def step(self, action):
        return np.array([3.0], np.float32), 0.0, False, False, {}


@pytest.mark.timeout(60)
def test_observations_outside_their_space_pass_as_in_dummy_vec_env() -> None:
    venv = make_sb3_env([_OutOfBounds] * 2)
    try:
        assert venv.reset()[0, 0] == 3.0
        venv.step(np.zeros(2, np.int64))
    finally:
        venv.close()
    checked = make_sb3_env([_OutOfBounds] * 2, check_observations=True)
    try:
        with pytest.raises(ValueError, match="above its high bound"):
            checked.reset()
    finally:
        checked.close()
