"""The Tianshou adapter (``aiovec.compat.tianshou``) against Tianshou's own vector envs.

Tianshou's ``Collector`` and ``AsyncCollector`` fill the same buffers through the
adapter as through ``DummyVectorEnv``; the adapter's own rules (float actions,
reset options, asynchronous mode, refusals) are checked one by one.  Tianshou's
own vector-env tests run against the adapter in CI too (``.ci/run``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

# Tianshou's buffers compile numba code on first use (tens of seconds on a loaded machine);
# the buffers here are tiny, so plain Python is faster.  Read when numba is imported.
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")
pytest.importorskip("tianshou", reason='needs the "tianshou" extra: pip install "aiovec[tianshou]"')

from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import AsyncCollector, Batch, Collector, VectorReplayBuffer
from tianshou.env import BaseVectorEnv, DummyVectorEnv

import aiovec
from aiovec.compat.tianshou import TianshouVectorEnv, make_tianshou_env
from aiovec.testing import AsyncHangingEnv, Gate, HangingEnv

BACKENDS = ["inline", "thread", "process"]
SIZES = (2, 3, 4)


class Walk(gymnasium.Env[np.ndarray, np.int64]):
    """Walk right to ``size``; the bounds of the observation space are the env's own.

    ``reset(options={"state": k})`` starts at ``k``, as Tianshou's test envs do
    (they read ``options["state"]`` whenever options is not ``None``); every
    reset's options are kept in ``resets``.  Rewards are random (seeded).
    """

    def __init__(self, size: int = 3, *, ma_rew: int = 0, raw_obs: bool = False) -> None:
        self.size, self.ma_rew, self.raw_obs = size, ma_rew, raw_obs
        self.observation_space = spaces.Box(0.0, float(size), (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.resets: list[dict[str, Any] | None] = []
        self.steps = 0
        self.pos = 0

    def _obs(self) -> Any:
        obs = np.array([self.pos], np.float32)
        return [float(self.pos)] * 2 if self.raw_obs else obs  # raw: not of the space's shape

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.resets.append(options)
        self.pos = 0 if options is None else options["state"]
        return self._obs(), {"size": self.size}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        self.steps += 1
        self.pos = self.pos + 1 if action == 1 else max(self.pos - 1, 0)
        terminated = self.pos >= self.size
        reward = float(terminated) + float(self.np_random.random())
        if self.ma_rew:
            return self._obs(), [reward] * self.ma_rew, terminated, False, {"pos": self.pos}
        return self._obs(), reward, terminated, False, {"pos": self.pos}


def walks(sizes: tuple[int, ...] = SIZES, **kwargs: Any) -> list[Any]:
    return [functools.partial(Walk, size, **kwargs) for size in sizes]


class Ones(Policy):
    """Always action 1, as a float array (Tianshou's test policies do so for Discrete)."""

    def __init__(self) -> None:
        super().__init__(action_space=spaces.Discrete(2))

    def forward(self, batch: Any, state: Any = None, **kwargs: Any) -> Batch:
        # a state, as Tianshou's test policy has (its AsyncCollector fails without one)
        state = np.zeros((len(batch.obs), 1)) if state is None else state
        return Batch(act=np.ones(len(batch.obs)), state=state)


def collect(venv: BaseVectorEnv, cls: type = Collector) -> Any:
    """Collect steps, episodes, then random steps; the buffer and the episode lengths.

    (Tianshou's ``AsyncCollector`` fails on random steps, on its own vector envs too.)
    """
    venv.seed(3)
    buffer = VectorReplayBuffer(total_size=60, buffer_num=len(venv))
    collector = cls(Ones(), venv, buffer)
    collector.reset()
    lens = [collector.collect(n_step=6).lens, collector.collect(n_episode=5).lens]
    if cls is Collector:
        lens.append(collector.collect(n_step=6, random=True).lens)
    return buffer, lens


def assert_same_buffer(ours: Any, theirs: Any) -> None:
    (buffer, lens), (reference, reference_lens) = ours, theirs
    for mine, other in zip(lens, reference_lens, strict=True):
        np.testing.assert_array_equal(mine, other)
    for key in ("obs", "obs_next", "act", "rew", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(buffer, key), getattr(reference, key))
    np.testing.assert_array_equal(buffer.info["env_id"], reference.info["env_id"])
    np.testing.assert_array_equal(buffer.info["pos"], reference.info["pos"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_collector_fills_the_buffer_dummy_vector_env_fills(backend: str) -> None:
    """Float actions, resets of the envs that ended, seeds, random actions: as Tianshou's."""
    venv = make_tianshou_env(walks(), backend=backend)
    try:
        assert isinstance(venv, BaseVectorEnv)
        assert_same_buffer(collect(venv), collect(DummyVectorEnv(walks())))
    finally:
        venv.close()


@pytest.mark.filterwarnings("ignore:Using async setting may collect extra transitions")
@pytest.mark.parametrize("backend", ["inline", "process"])
def test_async_collector_collects_whole_episodes_env_by_env(backend: str) -> None:
    """Tianshou's ``AsyncCollector`` over the asynchronous mode: each env's episodes intact.

    (Not compared with ``DummyVectorEnv(wait_num=...)``: it skips envs as it pops
    from the list it iterates, so which envs it returns is its own.)
    """
    venv = make_tianshou_env(walks(), backend=backend, wait_num=2)
    try:
        assert venv.is_async
        buffer = VectorReplayBuffer(total_size=3 * 40, buffer_num=3)
        collector = AsyncCollector(Ones(), venv, buffer)
        collector.reset()
        assert collector.collect(n_episode=6).n_collected_episodes >= 6
        for i, size in enumerate(SIZES):
            part = buffer.buffers[i]
            n = len(part) // size * size
            assert n >= size  # every env ended an episode
            assert part.obs[:n, 0].tolist() == list(range(size)) * (n // size)
            assert part.obs_next[:n, 0].tolist() == list(range(1, size + 1)) * (n // size)
            assert set(part.info.env_id[:n].tolist()) == {i}
    finally:
        venv.close()


@pytest.mark.parametrize("backend", ["inline", "process"])
@pytest.mark.parametrize("kwargs", [{"ma_rew": 3}, {"raw_obs": True}], ids=["ma-rew", "raw-obs"])
def test_results_the_spaces_do_not_describe_come_as_tianshou_stacks_them(
    backend: str, kwargs: dict[str, Any]
) -> None:
    """Multi-agent rewards and observations off their space, as DummyVectorEnv returns them."""
    venv = make_tianshou_env(walks(**kwargs), backend=backend)
    reference = DummyVectorEnv(walks(**kwargs))
    try:
        for v in (venv, reference):
            v.seed(1)
        ours, theirs = venv.reset(), reference.reset()
        np.testing.assert_array_equal(ours[0], theirs[0])
        for ids in ([0, 1, 2], [2, 0]):
            ours, theirs = venv.step(np.ones(len(ids)), ids), reference.step(np.ones(len(ids)), ids)
            for mine, other in zip(ours[:4], theirs[:4], strict=True):
                np.testing.assert_array_equal(mine, other)
            assert [i["env_id"] for i in ours[4]] == ids
    finally:
        venv.close()
        reference.close()


# -- the adapter's own rules -----------------------------------------------------------


def test_spaces_and_attributes_are_per_env() -> None:
    with make_tianshou_env(walks()) as venv:
        assert len(venv) == venv.env_num == 3
        assert venv.action_space == [spaces.Discrete(2)] * 3
        assert venv.action_space[0] is not venv.action_space[1]  # seeded one by one
        assert [s.high[0] for s in venv.observation_space] == [2.0, 3.0, 4.0]
        assert venv.get_env_attr("size", id=[2, 0]) == [4, 2]
        venv.set_env_attr("size", 9, id=1)
        assert venv.get_env_attr("size") == [2, 9, 4]


def test_whole_float_actions_are_cast_and_others_refused_before_any_env_steps() -> None:
    with make_tianshou_env(walks()) as venv:
        venv.reset()
        obs, *_ = venv.step(np.array([1.0, 0.0, 1.0]))
        assert obs[:, 0].tolist() == [1.0, 0.0, 1.0]
        with pytest.raises(ValueError, match=r"whole numbers: env 2 got 0\.5"):
            venv.step(np.array([1.0, 1.0, 0.5]))
        with pytest.raises(ValueError, match=r"whole numbers: env 0 got nan"):
            venv.step(np.array([np.nan]), [0])
        assert venv.get_env_attr("steps") == [1, 1, 1]
        venv.step(np.array([1, 1, 1]))  # still usable
        assert venv.get_env_attr("steps") == [2, 2, 2]


def test_a_reset_of_some_envs_gives_each_the_options_its_caller_gave() -> None:
    with make_tianshou_env(walks()) as venv:
        venv.reset()
        venv.reset(env_id=[1])
        obs, infos = venv.reset(env_id=[2, 0], options={"state": 1})
        assert obs[:, 0].tolist() == [1.0, 1.0]
        assert [info["size"] for info in infos] == [4, 2]
        assert venv.get_env_attr("resets") == [
            [None, {"state": 1}],
            [None, None],
            [None, {"state": 1}],
        ]


def test_reset_seeds_each_env_from_the_seed_given() -> None:
    with make_tianshou_env(walks()) as venv, make_tianshou_env(walks()) as other:
        venv.reset(seed=5)
        other.reset(env_id=[1], seed=5)  # env 1 of both: seed 5 + 1
        other.reset(env_id=[0, 2], seed=[5, 7])
        ours, theirs = venv.step(np.ones(3)), other.step(np.ones(3))
        np.testing.assert_array_equal(ours[1], theirs[1])


def _gated(gate: Gate, backend: str, i: int) -> Any:
    """Env 2 answers its first step once ``gate`` opens; the others at once."""
    env = Walk(SIZES[i] + 10)
    if i != 2:
        return env
    return AsyncHangingEnv(env, gate) if backend == "inline" else HangingEnv(env, gate)


@pytest.mark.parametrize("backend", ["inline", "process"])
@pytest.mark.parametrize("mode", ["wait_num", "timeout"])
def test_asynchronous_mode_returns_the_envs_done(backend: str, mode: str, tmp_path: Any) -> None:
    gate = Gate(tmp_path)
    fns = [functools.partial(_gated, gate, backend, i) for i in range(3)]
    kwargs = {"wait_num": 2} if mode == "wait_num" else {"timeout": 0.05}
    venv = make_tianshou_env(fns, backend=backend, **kwargs)
    try:
        venv.reset()
        _, _, _, _, infos = venv.step(np.ones(3), [0, 1, 2])
        assert sorted(info["env_id"] for info in infos) == [0, 1]
        assert venv.waiting_id == [2]
        obs, _ = venv.reset(env_id=[0], options={"state": 3})  # amid env 2's step
        assert obs[:, 0].tolist() == [3.0]
        with pytest.raises(aiovec.StateError, match=r"env\(s\) \[2\]"):
            venv.reset(env_id=[2])
        gate.release()
        seen: dict[int, float] = {}
        batch = venv.step(np.ones(1), [0])  # wait_num counts env 2, still in flight
        while True:
            seen.update((info["env_id"], o[0]) for o, info in zip(batch[0], batch[4], strict=True))
            if not venv.waiting_id:
                break
            batch = venv.step(None)
        assert seen == {0: 4.0, 2: 1.0}
        assert venv.waiting_id == []
    finally:
        gate.release()
        venv.close()


@pytest.mark.parametrize("backend", ["inline", "process"])
def test_close_cancels_the_steps_in_flight_quietly(backend: str, tmp_path: Any) -> None:
    """As Tianshou's vector envs drop them (no warning: the test suite makes warnings errors)."""
    gate = Gate(tmp_path)
    fns = [functools.partial(_gated, gate, backend, i) for i in range(3)]
    venv = make_tianshou_env(fns, backend=backend, wait_num=1)
    try:
        venv.reset()
        venv.step(np.ones(3))
        assert 2 in venv.waiting_id
        venv.close()
        assert venv.is_closed
    finally:
        gate.release()
        venv.close()


# -- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"wait_num": 0}, ValueError, r"wait_num must be an int in \[1, 3\]"),
        ({"wait_num": 4}, ValueError, r"wait_num must be an int in \[1, 3\]"),
        ({"timeout": -1.0}, ValueError, "timeout must be a positive number"),
        ({"autoreset_mode": "SameStep"}, TypeError, "sets autoreset_mode itself"),
        ({"reset_options": print}, TypeError, "sets reset_options itself"),
    ],
    ids=["wait-num-0", "wait-num-over", "timeout", "autoreset", "hook"],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        make_tianshou_env(walks(), **kwargs)


def test_only_a_blocking_vector_env_without_autoreset_is_wrapped() -> None:
    with pytest.raises(TypeError, match=r"wraps an aiovec\.BlockingVectorEnv"):
        TianshouVectorEnv(walks())  # type: ignore[arg-type]
    with (
        aiovec.BlockingVectorEnv(walks(), observation_mode="different") as venv,
        pytest.raises(ValueError, match=r"autoreset_mode=AutoresetMode\.DISABLED"),
    ):
        TianshouVectorEnv(venv)


def test_a_factory_error_is_raised_as_itself() -> None:
    def broken() -> Walk:
        raise KeyError("no such map")

    with pytest.raises(KeyError, match="no such map") as caught:
        make_tianshou_env([*walks(), broken])
    assert "env_fns[3]()" in "".join(caught.value.__notes__)


def test_reset_takes_only_seed_and_options() -> None:
    with make_tianshou_env(walks()) as venv, pytest.raises(TypeError, match="return_info"):
        venv.reset(return_info=True)
