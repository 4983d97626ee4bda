"""The collector (partial stepping) against lock-step ``step()`` and hand-written loops.

Run from the repository root::

    python benchmarks/collector.py            # every case, about a minute
    python benchmarks/collector.py --quick    # CI smoke test, a few seconds (rough numbers)

Cases (issue 26's speed targets; figures in docs/collector.md):

``heavy``
    256 async envs on the inline backend whose every step waits a time with a
    heavy tail: 95% uniform in 2-10 ms, 5% in 100-300 ms (seeded per env).
    ``aiovec.Collector`` with a policy returning zeros, against the bound
    (256 / the mean latency), lock-step ``step()`` and a hand-written
    ``send``/``recv(min_envs=1)`` loop over the same envs.
``trivial``
    256 async envs whose step is ``await asyncio.sleep(0)``: the collector's
    time per env-step against a hand-written ``send``/``recv(min_envs=1)`` loop
    (zeros for actions, nothing stored) over the same envs.
``process``
    CartPole, 64 envs, ``backend="process"`` with 2 workers: the collector
    against lock-step ``step()``.

Each candidate runs for a fixed time once per repetition, the order rotating;
reported: medians of env-steps per second.  The machine's load is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

import aiovec


class HeavyTailEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """A remote env: each step waits 2-10 ms (95%) or 100-300 ms (5%)."""

    def __init__(self, seed: int, *, trivial: bool = False) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._delays = random.Random(seed)
        self._trivial = trivial
        self._obs = np.zeros(4, np.float32)

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self._obs, {}

    async def step(self, action: Any) -> Any:
        if self._trivial:
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(heavy_tail(self._delays))
        return self._obs, 1.0, False, False, {}


def heavy_tail(rng: random.Random) -> float:
    """Seconds of one step: 95% in 2-10 ms, 5% in 100-300 ms (mean 15.7 ms)."""
    return rng.uniform(0.1, 0.3) if rng.random() < 0.05 else rng.uniform(0.002, 0.010)


MEAN_LATENCY = 0.95 * 0.006 + 0.05 * 0.2


def zeros(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    return np.zeros(len(env_ids), np.int64)


async def collector_rate(venv: Any, seconds: float, **kwargs: Any) -> float:
    kwargs.setdefault("segment_length", 16)
    kwargs.setdefault("batch_size", max(1, venv.num_envs // 4))
    steps, start = -1, 0.0
    async with aiovec.Collector(venv, zeros, seed=0, **kwargs) as collector:
        async for batch in collector:
            if steps < 0:  # from the first batch on: in steady state, the steps of the
                steps, start = 0, time.perf_counter()  # segments in progress at the start
                continue  # and at the end (uncounted) are alike
            steps += batch.rewards.size
            if time.perf_counter() - start > seconds:
                break
        return steps / (time.perf_counter() - start)


async def lockstep_rate(venv: Any, seconds: float) -> float:
    await venv.reset(seed=0)
    actions = np.zeros(venv.num_envs, np.int64)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        await venv.step(actions)
        steps += venv.num_envs
    return steps / (time.perf_counter() - start)


async def send_recv_rate(venv: Any, seconds: float) -> float:
    """The hand-written loop: resend every env received, zeros for actions."""
    await venv.reset(seed=0)
    venv.send(np.zeros(venv.num_envs, np.int64))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        *_, ids = await venv.recv(min_envs=1)
        steps += len(ids)
        venv.send(zeros(None, ids), ids)
    rate = steps / (time.perf_counter() - start)
    await venv.recv()
    return rate


Candidate = Callable[[Any, float], Awaitable[float]]


async def measure(
    make: Callable[[], Any], candidates: dict[str, Candidate], reps: int, seconds: float
) -> dict[str, float]:
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            venv = await make()
            try:
                rates[name].append(await candidates[name](venv, seconds))
            finally:
                await venv.close()
    return {name: statistics.median(r) for name, r in rates.items()}


def heavy_envs(n: int, *, trivial: bool = False) -> Callable[[], Any]:
    async def make() -> Any:
        return aiovec.AsyncioVectorEnv(
            [lambda i=i: HeavyTailEnv(i, trivial=trivial) for i in range(n)]
        )

    return make


def cartpole(n: int) -> Callable[[], Any]:
    async def make() -> Any:
        fns = [lambda: gymnasium.make("CartPole-v1")] * n
        return await aiovec.AsyncioVectorEnv.create(fns, backend="process", num_workers=2)

    return make


async def main(args: argparse.Namespace) -> None:
    quick = args.quick
    reps, seconds = (1, 0.3) if quick else (args.reps, args.seconds)
    n = 64 if quick else 256
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs; reps={reps}, {seconds} s each")
    if "heavy" in args.only:
        candidates = {
            "collector": collector_rate,
            "send/recv": send_recv_rate,
            "step": lockstep_rate,
        }
        got = await measure(heavy_envs(n), candidates, reps, seconds)
        bound = n / MEAN_LATENCY
        print(
            f"heavy-tailed, {n} envs inline: collector {got['collector']:,.0f} env-steps/s "
            f"({got['collector'] / bound:.2f}x the bound {bound:,.0f}), lock-step step() "
            f"{got['step']:,.0f} ({got['collector'] / got['step']:.1f}x), hand-written "
            f"send/recv(min_envs=1) {got['send/recv']:,.0f} ({got['send/recv'] / bound:.2f}x)"
        )
    if "trivial" in args.only:
        got = await measure(
            heavy_envs(n, trivial=True),
            {"collector": collector_rate, "send/recv": send_recv_rate},
            reps,
            seconds,
        )
        cost = got["send/recv"] / got["collector"]
        print(
            f"trivial async, {n} envs: collector {got['collector']:,.0f} env-steps/s, "
            f"hand-written send/recv {got['send/recv']:,.0f}: cost per env-step {cost:.2f}x"
        )
    if "process" in args.only:
        m = 8 if quick else 64
        got = await measure(
            cartpole(m), {"collector": collector_rate, "step": lockstep_rate}, reps, seconds
        )
        print(
            f"CartPole, {m} envs, process W=2: collector {got['collector']:,.0f} env-steps/s, "
            f"lock-step step() {got['step']:,.0f} ({got['collector'] / got['step']:.2f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test: tiny and rough")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--only",
        nargs="+",
        default=["heavy", "trivial", "process"],
        choices=["heavy", "trivial", "process"],
    )
    asyncio.run(main(parser.parse_args()))
