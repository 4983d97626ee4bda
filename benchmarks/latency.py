"""What `latency_stats()` says of envs whose server answers in a fixed time.

N async envs await ``--rtt`` seconds per step (their server's own time) on one
loop.  For each N the script prints the step's wall time and, from
`latency_stats()`, the median of the envs' own time and of their queue wait:
the own time should stay near the server's while the queue wait grows with N.

    python benchmarks/latency.py                 # N = 64, 1,000, 5,000
    python benchmarks/latency.py --envs 5000 --steps 20
    python benchmarks/latency.py --quick         # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import asyncio
import time

import gymnasium
import numpy as np
from _common import machine_info, positive_ints

import aiovec


class ServerEnv(aiovec.AsyncEnv[int, int]):
    """Each step waits ``rtt`` seconds for its server."""

    observation_space = action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, rtt: float) -> None:
        self.rtt = rtt

    async def reset(self, *, seed=None, options=None):
        return 0, {}

    async def step(self, action):
        await asyncio.sleep(self.rtt)
        return 0, 0.0, False, False, {}


async def measure(num_envs: int, steps: int, rtt: float) -> tuple[float, float, float]:
    """Milliseconds: the step's wall time, the envs' own p50 and their queue wait's p50."""
    async with aiovec.AsyncioVectorEnv([lambda: ServerEnv(rtt)] * num_envs) as venv:
        await venv.reset()
        actions = np.zeros(num_envs, np.int64)
        start = time.perf_counter()
        for _ in range(steps):
            await venv.step(actions)
        wall = (time.perf_counter() - start) / steps
        stats = venv.latency_stats()
    assert stats.queue is not None
    return wall * 1e3, stats.overall_p50 * 1e3, stats.queue.overall_p50 * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=positive_ints, default=[64, 1000, 5000])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rtt", type=float, default=0.006, help="the server's time, s")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small N, 3 steps")
    args = parser.parse_args()
    if args.quick:
        args.envs, args.steps = [64, 500], 3
    print(machine_info())
    print(f"server time {args.rtt * 1e3:g} ms; medians over every env's last {args.steps} steps")
    print(f"{'envs':>6} {'step ms':>9} {'own p50 ms':>11} {'queue p50 ms':>13}")
    for n in args.envs:
        wall, own, queued = asyncio.run(measure(n, args.steps, args.rtt))
        print(f"{n:>6} {wall:>9.1f} {own:>11.1f} {queued:>13.1f}")


if __name__ == "__main__":
    main()
