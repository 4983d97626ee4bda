"""Quickstart: step 64 network-bound envs at once, with ``await`` and without.

``PingEnv`` below stands in for an env that talks to a remote simulator: every
``reset`` and ``step`` waits 5 ms for a "round trip" (``asyncio.sleep``).
Stepped one after the other, as ``gymnasium.vector.SyncVectorEnv`` would, 64 of
them take 64 x 5 ms = 320 ms per vector step.  aiovec waits for all of them at
once, so a vector step costs about one round trip, through either front end:

- the await API, ``aiovec.AsyncioVectorEnv``, for code that runs an event loop;
- the blocking API, ``aiovec.BlockingVectorEnv``, a ``gymnasium.vector.VectorEnv``
  for plain synchronous scripts: same arguments, same results, no ``await``.

Run it with ``python examples/quickstart.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from gymnasium import spaces

import aiovec

NUM_ENVS = 64
STEPS = 20
ROUND_TRIP = 0.005  # seconds


class PingEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """A random walk on a remote server: push left (0) or right (1), stay within +-5."""

    observation_space = spaces.Box(-5.0, 5.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        await super().reset(seed=seed)  # seeds self.np_random, as gymnasium.Env does
        await asyncio.sleep(ROUND_TRIP)  # e.g. `await client.request("reset")`
        self.position = 0.0
        return np.array([self.position], np.float32), {}

    async def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(ROUND_TRIP)  # e.g. `await client.request("step", action)`
        self.position += (1.0 if action == 1 else -1.0) * self.np_random.uniform(0.5, 1.5)
        terminated = abs(self.position) >= 5.0
        obs = np.clip([self.position], -5.0, 5.0).astype(np.float32)
        return obs, 1.0, terminated, False, {}


async def with_await() -> tuple[float, int]:
    """The await API: seconds per vector step, and how many episodes ended."""
    ended = 0
    async with aiovec.AsyncioVectorEnv([PingEnv] * NUM_ENVS) as venv:
        venv.action_space.seed(0)
        _obs, _infos = await venv.reset(seed=42)
        start = time.perf_counter()
        for _ in range(STEPS):
            actions = venv.action_space.sample()
            _obs, _rewards, terminations, truncations, _infos = await venv.step(actions)
            ended += int(np.sum(terminations | truncations))
        return (time.perf_counter() - start) / STEPS, ended


def without_await() -> tuple[float, int]:
    """The blocking API, in plain synchronous code: the same loop, no ``await``."""
    ended = 0
    with aiovec.BlockingVectorEnv([PingEnv] * NUM_ENVS) as venv:  # or call venv.close()
        venv.action_space.seed(0)
        _obs, _infos = venv.reset(seed=42)
        start = time.perf_counter()
        for _ in range(STEPS):
            actions = venv.action_space.sample()
            _obs, _rewards, terminations, truncations, _infos = venv.step(actions)
            ended += int(np.sum(terminations | truncations))
        return (time.perf_counter() - start) / STEPS, ended


def main() -> None:
    print(f"{NUM_ENVS} envs, one {ROUND_TRIP * 1e3:.0f} ms round trip per step each")
    print(f"  one after the other (SyncVectorEnv): ~{NUM_ENVS * ROUND_TRIP * 1e3:.0f} ms/step")
    for name, (seconds, ended) in [
        ("await API:   ", asyncio.run(with_await())),
        ("blocking API:", without_await()),
    ]:
        print(f"  aiovec, {name} {seconds * 1e3:5.1f} ms/step ({ended} episodes ended)")


if __name__ == "__main__":
    main()
