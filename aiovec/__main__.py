"""``python -m aiovec demo``: why aiovec exists, in one command.

It builds N envs whose every step waits on a (simulated) remote server for
``--latency`` seconds, and steps them three ways: one after another as
``gymnasium.vector.SyncVectorEnv`` does, through ``aiovec.BlockingVectorEnv``,
and through ``aiovec.AsyncioVectorEnv`` with ``await``.  It prints env-steps
per second and the speed-up.  Nothing to set up: the "server" is a sleep.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np

import aiovec

_OBS = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
_ACT = gymnasium.spaces.Discrete(2)


class RemoteEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """Stands in for an env whose every call is a round trip to a server."""

    observation_space = _OBS
    action_space = _ACT

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.t = 0

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Wait for the server, start an episode."""
        await super().reset(seed=seed)
        await asyncio.sleep(self.latency)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Wait for the server, advance one step; episodes last 50 steps."""
        await asyncio.sleep(self.latency)
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, float(action), False, self.t >= 50, {}


class BlockingRemoteEnv(gymnasium.Env[np.ndarray, np.int64]):
    """The same env with a blocking client, as gymnasium's SyncVectorEnv would run it."""

    observation_space = _OBS
    action_space = _ACT

    def __init__(self, latency: float) -> None:
        self.latency = latency

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Block for the server, start an episode."""
        super().reset(seed=seed)
        time.sleep(self.latency)
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Block for the server, advance one step."""
        time.sleep(self.latency)
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), float(action), False, False, {}


def _time_blocking(envs: gymnasium.vector.VectorEnv[Any, Any, Any], steps: int) -> float:
    actions = np.zeros(envs.num_envs, dtype=np.int64)
    envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps):
        envs.step(actions)
    elapsed = time.perf_counter() - start
    envs.close()
    return elapsed


async def _time_await(fns: Sequence[Callable[[], Any]], steps: int) -> float:
    actions = np.zeros(len(fns), dtype=np.int64)
    venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv(fns)
    async with venv:
        await venv.reset(seed=0)
        start = time.perf_counter()
        for _ in range(steps):
            await venv.step(actions)
        return time.perf_counter() - start


def demo(num_envs: int, latency: float, steps: int) -> list[tuple[str, float]]:
    """Time the three ways; returns ``(name, env-steps per second)`` rows."""
    blocking_fns = [lambda: BlockingRemoteEnv(latency)] * num_envs
    async_fns = [lambda: RemoteEnv(latency)] * num_envs
    sync_steps = max(1, steps // 10)  # it is slow: time fewer steps
    sync = _time_blocking(gymnasium.vector.SyncVectorEnv(blocking_fns), sync_steps)
    blocking = _time_blocking(aiovec.BlockingVectorEnv(async_fns), steps)
    awaited = asyncio.run(_time_await(async_fns, steps))
    return [
        ("gymnasium SyncVectorEnv (one env after another)", num_envs * sync_steps / sync),
        ("aiovec.BlockingVectorEnv", num_envs * steps / blocking),
        ("aiovec.AsyncioVectorEnv (await)", num_envs * steps / awaited),
    ]


def _print_table(rows: list[tuple[str, float]], num_envs: int, latency: float) -> None:
    base = rows[0][1]
    print(f"\n{num_envs} envs, each step waits {latency * 1000:g} ms on its 'server'\n")
    print(f"{'how':52} {'env-steps/s':>12} {'speed-up':>9}")
    for name, rate in rows:
        print(f"{name:52} {rate:12,.0f} {rate / base:8.1f}x")
    best = max(rows[1:], key=lambda row: row[1])
    print(
        f"\naiovec stepped {num_envs} waiting envs {best[1] / base:.0f}x faster: "
        "one round trip per vector step instead of one per env."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m aiovec", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help="step waiting envs three ways and compare")
    run.add_argument("--num-envs", type=int, default=64)
    run.add_argument("--latency", type=float, default=0.005, help="seconds per step")
    run.add_argument("--steps", type=int, default=100)
    args = parser.parse_args(argv)
    rows = demo(args.num_envs, args.latency, args.steps)
    _print_table(rows, args.num_envs, args.latency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
