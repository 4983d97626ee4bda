"""Fake envs for tests, examples and benchmarks (public, usable by third parties).

- `SpaceEnv`: a deterministic sync env over any observation/action space,
  with random episode lengths, both kinds of episode end and varied infos.
- `AsyncTwin`: runs a sync env as an `AsyncEnv` that
  suspends a random number of times per call, so a batch finishes in random
  order while results stay those of the sync env.
- `FaultyEnv`: a wrapper that raises on a chosen call.
- Fault injection for reliability tests: `HangingEnv` /
  `AsyncHangingEnv` (a call that never answers until a `Gate`
  opens), `MalformedEnv` (a step result of the wrong shape or type),
  `KillingEnv` (the worker process dies mid-step), `FlakyEnv`
  (steps fail at random at a given rate).
- `TrivialEnv` / `AsyncTrivialEnv`: the cheapest possible envs,
  to measure a vector env's own overhead.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import os
import random
import select
import signal
import uuid
from collections.abc import Iterator
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.core import RenderFrame

from aiovec._env import AsyncEnv

__all__ = (
    "MALFORMED",
    "AsyncHangingEnv",
    "AsyncTrivialEnv",
    "AsyncTwin",
    "FaultyEnv",
    "FlakyEnv",
    "Gate",
    "HangingEnv",
    "KillingEnv",
    "MalformedEnv",
    "SpaceEnv",
    "TrivialEnv",
)

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
    """The async twin of `TrivialEnv`; its coroutines never suspend."""

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


# --------------------------------------------------------------------------- fault injection


class Gate:
    """A switch that envs wait on, from any thread or process, until it is released.

    A test makes a gate, hands it to envs (it pickles: it is two paths, so an
    env in a worker process can wait on it) and calls `release` when the
    "server" should answer again.  It is a named pipe and a marker file in
    ``directory``: a waiter opens the pipe without blocking and waits until the
    pipe hangs up, which happens when `release` opens and closes its
    write end; the marker makes a wait that starts after the release return at
    once.  No thread, no polling.  POSIX only (``os.mkfifo``).

    Args:
        directory: An existing directory for the pipe and the marker (e.g.
            pytest's ``tmp_path``).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        base = os.path.join(os.fspath(directory), f"gate-{uuid.uuid4().hex}")
        self._fifo, self._marker = base + ".fifo", base + ".released"
        os.mkfifo(self._fifo)

    @property
    def released(self) -> bool:
        """Whether `release` was called."""
        return os.path.exists(self._marker)

    @contextlib.contextmanager
    def _listening(self) -> Iterator[int]:
        fd = os.open(self._fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            yield fd
        finally:
            os.close(fd)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the gate is released; ``False`` if ``timeout`` seconds passed first."""
        with self._listening() as fd:
            if self.released:
                return True
            return bool(select.select([fd], [], [], timeout)[0])

    async def wait_async(self) -> None:
        """Wait, through the running event loop, until the gate is released (cancellable)."""
        loop = asyncio.get_running_loop()
        with self._listening() as fd:
            if self.released:
                return
            opened: asyncio.Future[None] = loop.create_future()

            def hung_up() -> None:
                if not opened.done():
                    opened.set_result(None)

            loop.add_reader(fd, hung_up)
            try:
                await opened
            finally:
                loop.remove_reader(fd)

    def release(self) -> None:
        """Let every waiter go on, now and from now on (idempotent)."""
        with open(self._marker, "a"):
            pass
        try:
            fd = os.open(self._fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nobody is waiting right now
                return
            raise
        os.close(fd)


def _count(counts: dict[str, int], method: str) -> int:
    counts[method] = counts.get(method, 0) + 1
    return counts[method]


class HangingEnv(gymnasium.Wrapper[Any, Any, Any, Any]):
    """The ``at``-th call of ``method`` blocks until ``gate`` opens (a server gone silent).

    The blocked call then goes on normally; every other call works.  Run it on
    the thread or process backend: on the inline backend a blocked sync env
    blocks the event loop itself (use `AsyncHangingEnv` there).

    Args:
        env: The env to wrap.
        gate: What the blocked call waits for.
        method: ``"step"``, ``"reset"`` or ``"close"``.
        at: Which call blocks (1 = the first).
        give_up_after: Seconds after which the blocked call raises
            ``TimeoutError`` anyway, so a forgotten gate never hangs a test run.
    """

    def __init__(
        self,
        env: gymnasium.Env[Any, Any],
        gate: Gate,
        *,
        method: str = "step",
        at: int = 1,
        give_up_after: float = 60.0,
    ) -> None:
        super().__init__(env)
        self.gate, self.hang_method, self.hang_at = gate, method, at
        self.give_up_after = give_up_after
        self.counts: dict[str, int] = {}

    def _maybe_hang(self, method: str) -> None:
        chosen = _count(self.counts, method) == self.hang_at and method == self.hang_method
        if chosen and not self.gate.wait(self.give_up_after):
            raise TimeoutError(f"HangingEnv's gate stayed shut for {self.give_up_after} s")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset, blocking on the chosen call."""
        self._maybe_hang("reset")
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step, blocking on the chosen call."""
        self._maybe_hang("step")
        return self.env.step(action)

    def close(self) -> None:
        """Close, blocking on the chosen call."""
        self._maybe_hang("close")
        self.env.close()


class AsyncHangingEnv(AsyncEnv[Any, Any]):
    """The async `HangingEnv`: the chosen call awaits ``gate`` (and can be cancelled).

    Other calls run the wrapped sync env at once, so results are the wrapped
    env's.  Attribute reads fall through to the wrapped env.

    Args:
        env: The synchronous env to run.
        gate: What the chosen call awaits.
        method: ``"step"``, ``"reset"`` or ``"close"``.
        at: Which call waits (1 = the first).
    """

    def __init__(
        self, env: gymnasium.Env[Any, Any], gate: Gate, *, method: str = "step", at: int = 1
    ) -> None:
        self.env, self.gate, self.hang_method, self.hang_at = env, gate, method, at
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.metadata, self.render_mode = env.metadata, env.render_mode
        self.counts: dict[str, int] = {}
        self.cancelled = 0

    async def _maybe_hang(self, method: str) -> None:
        if _count(self.counts, method) == self.hang_at and method == self.hang_method:
            try:
                await self.gate.wait_async()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the wrapped env, waiting on the chosen call."""
        await self._maybe_hang("reset")
        return self.env.reset(seed=seed, options=options)

    async def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the wrapped env, waiting on the chosen call."""
        await self._maybe_hang("step")
        return self.env.step(action)

    async def close(self) -> None:
        """Close the wrapped env, waiting on the chosen call."""
        await self._maybe_hang("close")
        self.env.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "env" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["env"], name)

    def get_wrapper_attr(self, name: str) -> Any:
        """Its own attribute (``cancelled``, ``counts``), else the wrapped env's, as a Wrapper's."""
        if name in self.__dict__:
            return self.__dict__[name]
        return self.env.get_wrapper_attr(name)


MALFORMED = ("obs-shape", "obs-dtype", "reward", "flag", "info", "arity")
"""The kinds of broken step result `MalformedEnv` returns."""


def _malformed(kind: str, result: tuple[Any, ...]) -> Any:
    obs, reward, terminated, truncated, info = result
    if kind == "obs-shape":  # one axis too many
        return np.zeros((*np.shape(obs), 2), dtype=np.asarray(obs).dtype), *result[1:]
    if kind == "obs-dtype":  # text where numbers belong
        return np.full(np.shape(obs), "x"), *result[1:]
    if kind == "reward":
        return obs, None, terminated, truncated, info
    if kind == "flag":  # a truthy string, not a bool
        return obs, reward, "no", truncated, info
    if kind == "info":
        return obs, reward, terminated, truncated, list(info.items())
    if kind == "arity":  # the old gym API: four values
        return obs, reward, terminated or truncated, info
    raise ValueError(f"kind must be one of {MALFORMED}, got {kind!r}")


class MalformedEnv(gymnasium.Wrapper[Any, Any, Any, Any]):
    """The ``at``-th step returns a malformed result (a buggy env or a garbled reply).

    Kinds (`MALFORMED`): ``"obs-shape"`` (an observation with one axis
    too many), ``"obs-dtype"`` (text where numbers belong), ``"reward"``
    (``None``), ``"flag"`` (``terminated`` is the string ``"no"``), ``"info"``
    (a list of pairs instead of a dict), ``"arity"`` (four values, the old gym
    API).  The wrapped env is stepped as usual; other steps are untouched.

    Args:
        env: The env to wrap.
        kind: What is wrong with the result.
        at: Which step is malformed (1 = the first).
    """

    def __init__(self, env: gymnasium.Env[Any, Any], kind: str, *, at: int = 1) -> None:
        if kind not in MALFORMED:
            raise ValueError(f"kind must be one of {MALFORMED}, got {kind!r}")
        super().__init__(env)
        self.kind, self.malformed_at, self.steps = kind, at, 0

    def step(self, action: Any) -> Any:
        """Step the wrapped env; garble the chosen step's result."""
        result = self.env.step(action)
        self.steps += 1
        return _malformed(self.kind, result) if self.steps == self.malformed_at else result


class KillingEnv(gymnasium.Wrapper[Any, Any, Any, Any]):
    """The ``at``-th step kills the process it runs in with SIGKILL (a segfault, the OOM killer).

    Meant for worker processes: in the process whose id is ``spare`` (pass
    the test's own ``os.getpid()``) it raises ``RuntimeError`` instead.

    Args:
        env: The env to wrap.
        spare: A process id that must never be killed.
        at: Which step kills (1 = the first).
    """

    def __init__(self, env: gymnasium.Env[Any, Any], *, spare: int, at: int = 1) -> None:
        super().__init__(env)
        self.spare, self.kill_at, self.steps = spare, at, 0

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step, or die on the chosen step."""
        self.steps += 1
        if self.steps == self.kill_at:
            if os.getpid() == self.spare:
                raise RuntimeError("KillingEnv refuses to kill the process it was told to spare")
            os.kill(os.getpid(), signal.SIGKILL)
        return self.env.step(action)


class FlakyEnv(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Each step fails (``RuntimeError``, before stepping) with probability ``rate``.

    The draws come from a generator of the wrapper's own, seeded with ``seed``,
    so the env's results and its failures are both reproducible.

    Args:
        env: The env to wrap.
        rate: Probability that a step fails.
        seed: Seed of the failure draws.
    """

    def __init__(self, env: gymnasium.Env[Any, Any], rate: float, *, seed: int | None = None):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be within [0, 1], got {rate!r}")
        super().__init__(env)
        self.rate = rate
        self._draws = random.Random(seed)
        self.failures = 0

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step, or fail at random."""
        if self._draws.random() < self.rate:
            self.failures += 1
            raise RuntimeError(f"injected random failure #{self.failures}")
        return self.env.step(action)
