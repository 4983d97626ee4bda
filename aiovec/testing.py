"""Fake envs for tests, examples and benchmarks (public, usable by third parties).

- :class:`SpaceEnv`: a deterministic sync env over any observation/action space,
  with random episode lengths, both kinds of episode end and varied infos.
- :class:`AsyncTwin`: runs a sync env as an :class:`~aiovec.AsyncEnv` that
  suspends a random number of times per call, so a batch finishes in random
  order while results stay those of the sync env.
- :class:`FaultyEnv`: a wrapper that raises on a chosen call.
- :class:`TrivialEnv` / :class:`AsyncTrivialEnv`: the cheapest possible envs,
  to measure a vector env's own overhead.
"""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.core import RenderFrame

from aiovec._env import AsyncEnv

__all__ = ("AsyncTrivialEnv", "AsyncTwin", "FaultyEnv", "SpaceEnv", "TrivialEnv")

_DEFAULT_OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
_DEFAULT_ACT = spaces.Discrete(3)


class SpaceEnv(gymnasium.Env[Any, Any]):
    """A deterministic env for any observation and action space.

    Observations are sampled from ``observation_space`` with a generator drawn
    from ``np_random``; the reward is a random float plus the sum of the
    flattened action (so a misrouted action changes the reward); episodes end
    after ``min_len``..``max_len`` steps, by termination or truncation at
    random.  Infos carry keys of several types, each present only sometimes,
    so the ``_key`` masks of vector infos are exercised.

    Args:
        observation_space: The single observation space (copied per instance).
        action_space: The single action space (copied per instance).
        min_len: Shortest episode, in steps.
        max_len: Longest episode, in steps.
        render_mode: ``None`` or ``"rgb_array"`` (a tiny frame holding the step count).
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}  # noqa: RUF012

    def __init__(
        self,
        observation_space: spaces.Space[Any] | None = None,
        action_space: spaces.Space[Any] | None = None,
        *,
        min_len: int = 1,
        max_len: int = 6,
        render_mode: str | None = None,
    ) -> None:
        # ``is None``, not ``or``: a space's truth is its length (empty Tuple/Dict are falsy)
        self.observation_space = copy.deepcopy(
            _DEFAULT_OBS if observation_space is None else observation_space
        )
        self.action_space = copy.deepcopy(_DEFAULT_ACT if action_space is None else action_space)
        self.min_len, self.max_len = min_len, max_len
        self.render_mode = render_mode
        self.episode_steps = 0
        self.episodes = 0
        self._length = max_len
        self.tag = "space-env"

    def _observe(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample()

    def _info(self) -> dict[str, Any]:
        rng = self.np_random
        info: dict[str, Any] = {}
        if rng.random() < 0.5:
            info["count"] = self.episode_steps
        if rng.random() < 0.5:
            info["value"] = float(rng.random())
        if rng.random() < 0.3:
            info["vec"] = rng.random(2).astype(np.float32)
        if rng.random() < 0.3:
            info["nested"] = {"flag": bool(rng.random() < 0.5), "episodes": self.episodes}
        if rng.random() < 0.2:
            info["label"] = f"ep{self.episodes}"
        return info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start an episode; ``options={"length": k}`` fixes its length."""
        super().reset(seed=seed)
        self.episode_steps = 0
        self.episodes += 1
        self._length = int(self.np_random.integers(self.min_len, self.max_len + 1))
        if options and "length" in options:
            self._length = int(options["length"])
        info = self._info()
        info["reset"] = True
        return self._observe(), info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Advance one step; the reward depends on the action."""
        self.episode_steps += 1
        flat = spaces.flatten(self.action_space, action)
        reward = float(self.np_random.random()) + float(np.sum(np.asarray(flat)))
        ended = self.episode_steps >= self._length
        truncate = ended and bool(self.np_random.random() < 0.4)
        return self._observe(), reward, ended and not truncate, truncate, self._info()

    def render(self) -> RenderFrame | list[RenderFrame] | None:
        """A 2x2 RGB frame whose value is the step count."""
        if self.render_mode != "rgb_array":
            return None
        return np.full((2, 2, 3), self.episode_steps % 256, dtype=np.uint8)

    def add(self, a: int, b: int = 0) -> int:
        """A method for ``call()`` tests: ``a + b + episode_steps``."""
        return a + b + self.episode_steps


class AsyncTwin(AsyncEnv[Any, Any]):
    """Run a synchronous env as an async env that suspends at random.

    Each call first suspends ``0..max_yields`` times (``asyncio.sleep(0)``) or,
    with ``max_delay > 0``, sleeps a random time up to ``max_delay`` seconds;
    then it calls the wrapped env.  Results are exactly the wrapped env's, so a
    batch of twins must give the same results as the sync envs whatever order
    they finish in.  Attribute reads fall through to the wrapped env.

    Args:
        env: The synchronous env to run.
        max_yields: Upper bound of scheduler yields per call.
        max_delay: Upper bound of a random sleep per call, in seconds.
        seed: Seed of the delay generator (never of the env).
    """

    def __init__(
        self,
        env: gymnasium.Env[Any, Any],
        *,
        max_yields: int = 3,
        max_delay: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.metadata = env.metadata
        self.render_mode = env.render_mode
        self.max_yields = max_yields
        self.max_delay = max_delay
        self._delays = random.Random(seed)
        self.calls = 0

    async def _pause(self) -> None:
        self.calls += 1
        if self.max_delay > 0:
            await asyncio.sleep(self._delays.uniform(0, self.max_delay))
        for _ in range(self._delays.randint(0, self.max_yields)):
            await asyncio.sleep(0)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the wrapped env after a random pause."""
        await self._pause()
        return self.env.reset(seed=seed, options=options)

    async def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the wrapped env after a random pause."""
        await self._pause()
        return self.env.step(action)

    async def render(self) -> RenderFrame | list[RenderFrame] | None:
        """Render the wrapped env after a random pause."""
        await self._pause()
        return self.env.render()

    async def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()

    @property
    def np_random(self) -> np.random.Generator:
        """The wrapped env's generator."""
        return self.env.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.env.np_random = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "env" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["env"], name)


class FaultyEnv(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Raise ``error`` on the ``at``-th call (1-based) of ``method``.

    Args:
        env: The env to wrap.
        method: ``"step"``, ``"reset"``, ``"render"`` or ``"close"``.
        at: Which call fails (1 = the first); later calls work again.
        error: The exception to raise (a fresh ``RuntimeError`` by default).
    """

    def __init__(
        self,
        env: gymnasium.Env[Any, Any],
        *,
        method: str = "step",
        at: int = 1,
        error: BaseException | None = None,
    ) -> None:
        super().__init__(env)
        self.fail_method, self.fail_at = method, at
        self.error = error
        self.counts: dict[str, int] = {}

    def _tick(self, method: str) -> None:
        self.counts[method] = self.counts.get(method, 0) + 1
        if method == self.fail_method and self.counts[method] == self.fail_at:
            raise self.error or RuntimeError(f"injected failure in {method} #{self.fail_at}")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset, failing on the chosen call."""
        self._tick("reset")
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step, failing on the chosen call."""
        self._tick("step")
        return self.env.step(action)

    def render(self) -> RenderFrame | list[RenderFrame] | None:
        """Render, failing on the chosen call."""
        self._tick("render")
        return self.env.render()

    def close(self) -> None:
        """Close, failing on the chosen call."""
        self._tick("close")
        self.env.close()


_TRIVIAL_OBS = np.zeros(4, dtype=np.float32)


class TrivialEnv(gymnasium.Env[np.ndarray, np.int64]):
    """The cheapest sync env: fixed float32 obs of shape (4,), reward 1, never ends."""

    observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Return the fixed observation."""
        super().reset(seed=seed)
        return _TRIVIAL_OBS, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Return the fixed observation, reward 1, never ending."""
        return _TRIVIAL_OBS, 1.0, False, False, {}


class AsyncTrivialEnv(AsyncEnv[np.ndarray, np.int64]):
    """The async twin of :class:`TrivialEnv`; its coroutines never suspend."""

    observation_space = TrivialEnv.observation_space
    action_space = TrivialEnv.action_space

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Return the fixed observation."""
        await super().reset(seed=seed)
        return _TRIVIAL_OBS, {}

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Return the fixed observation, reward 1, never ending."""
        return _TRIVIAL_OBS, 1.0, False, False, {}
