"""CPU-bound envs on every core: ``backend="process"``.

``Swarm`` below is a pure-Python simulator (boids: every bird looks at every
other bird each step), so a step keeps a core busy instead of waiting.  One
event loop cannot run two of them at once; worker processes can.  The script
steps the same 16 envs with the same seeds and actions twice:

- ``backend="inline"``: every env in this process, one after another;
- ``backend="process"``: the envs split over ``num_workers`` worker processes
  (default: one per core), one request and one reply per worker per step;

prints env-steps per second for both, and checks that the results are
identical (the backend changes where envs run, never what they return).

Run it with ``python examples/process_backend.py`` (~10 s); ``--quick`` (or
``AIOVEC_EXAMPLES_QUICK=1``, which CI sets) takes a couple of seconds.  The
factory doubles as the input of the bench command, which also tries other
sizes and worker counts::

    python -m aiovec bench examples/process_backend.py:make_env

On a machine with few cores, a worker competes with this process and with
everything else running: the speed-up is at most the number of idle cores.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np

import aiovec

BIRDS = 48


class Swarm(gym.Env[np.ndarray, np.ndarray]):
    """Steer one bird of a flock towards a target; the flock moves in pure Python.

    Observation: the steered bird's position and velocity, and the target.
    Action: an acceleration in [-1, 1]^2.  Reward: minus the distance to the
    target.  Episodes last 200 steps.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        self.birds = [[rng.uniform(-1, 1), rng.uniform(-1, 1), 0.0, 0.0] for _ in range(BIRDS)]
        self.target = rng.uniform(-1, 1, 2)
        self.t = 0
        return self._observe(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.birds[0][2] += 0.05 * float(action[0])
        self.birds[0][3] += 0.05 * float(action[1])
        self._flock()
        self.t += 1
        distance = float(np.hypot(*(np.array(self.birds[0][:2]) - self.target)))
        return self._observe(), -distance, False, self.t >= 200, {}

    def _flock(self) -> None:
        """Each bird drifts towards the others' centre and away from close neighbours."""
        moved = []
        for x, y, old_vx, old_vy in self.birds:
            cx = cy = ax = ay = 0.0
            for ox, oy, _, _ in self.birds:
                cx, cy = cx + ox, cy + oy
                dx, dy = x - ox, y - oy
                d2 = dx * dx + dy * dy
                if 0 < d2 < 0.01:
                    ax, ay = ax + dx / d2, ay + dy / d2
            vx = 0.9 * old_vx + 0.01 * (cx / BIRDS - x) + 0.0001 * ax
            vy = 0.9 * old_vy + 0.01 * (cy / BIRDS - y) + 0.0001 * ay
            moved.append([x + vx, y + vy, vx, vy])
        self.birds = moved

    def _observe(self) -> np.ndarray:
        return np.array([*self.birds[0], *self.target])


def make_env() -> Swarm:
    """The env factory (``python -m aiovec bench examples/process_backend.py:make_env``)."""
    return Swarm()


def run(backend: str, actions: np.ndarray, num_workers: int | None) -> tuple[float, np.ndarray]:
    """Env-steps per second, and the last observations."""
    num_envs = actions.shape[1]
    with aiovec.BlockingVectorEnv(
        [make_env] * num_envs, backend=backend, num_workers=num_workers
    ) as envs:
        obs, _ = envs.reset(seed=0)
        start = time.perf_counter()
        for batch in actions:
            obs, _rewards, _terminations, _truncations, _infos = envs.step(batch)
        elapsed = time.perf_counter() - start
    return actions.shape[0] * num_envs / elapsed, obs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--num-workers", type=int, default=None, help="default: one per core")
    parser.add_argument("--quick", action="store_true", help="a few steps (a smoke test)")
    args = parser.parse_args()
    steps = 20 if args.quick or os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1" else args.steps
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, args.num_envs, 2)).astype(np.float32)

    inline, inline_obs = run("inline", actions, None)
    process, process_obs = run("process", actions, args.num_workers)
    workers = args.num_workers or min(os.cpu_count() or 1, args.num_envs)
    print(f"{args.num_envs} Swarm envs, {steps} steps, {os.cpu_count()} cores:")
    print(f"  backend='inline':               {inline:8,.0f} env-steps/s")
    print(f"  backend='process', {workers} workers: {process:8,.0f} env-steps/s")
    same = np.array_equal(inline_obs, process_obs)
    print(f"  speed-up {process / inline:.2f}x; identical results: {same}")
    assert same, "a backend must never change results"


if __name__ == "__main__":  # required: worker processes import this file
    main()
