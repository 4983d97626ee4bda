"""Whole episodes in groups: the EpisodeCollector against gather-all.

Run from the repository root::

    python benchmarks/episodes.py            # about a minute
    python benchmarks/episodes.py --quick    # CI smoke test, a few seconds (rough numbers)

The case (issue 33's target; figure in docs/collector.md): 8 async envs on the
inline backend, each step waits 5 ms, and an episode's length is
heavy-tailed (log-normal, median 8 steps, p99/p50 = 20; drawn by the env at
its reset from a generator of its own: it stands for the policy's sampling,
so the members of a group differ in length).  Groups of 4 episodes, 24
groups (tasks):

``episodes``
    ``aiovec.EpisodeCollector(batch_size=2, group_size=4)`` with its default
    ``max_in_flight`` (8 groups: ``num_envs``), until the tasks run out;
``episodes, 2 in flight`` / ``episodes, 4 in flight``
    the same with ``max_in_flight=2`` (no group waits to start, so an env
    freed early idles until its group's slowest member ends) and ``4``;
``gather-all``
    a lock-step loop over the same vector env that runs 2 groups at a time
    (8 episodes, one per env, each group's 4 with its seed) and waits for the
    longest episode before the next 2 groups.

Each candidate collects the 24 groups once per repetition, the order rotating;
reported: median seconds, and the median of each candidate's time over
gather-all's in the same repetition (the envs' lengths are seeded alike).  The
machine's load is printed.  ``--timeline`` prints, for one EpisodeCollector
run, each env's episodes over time (a letter per group).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from gymnasium import spaces

import aiovec

ENVS = 8
GROUP = 4
STEP_S = 0.005
MEDIAN_STEPS = 8
SIGMA = math.log(20) / 2.3263  # p99 / p50 = exp(2.3263 * sigma) = 20


class SampledLengthEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """An env behind a service: each step waits 5 ms; lengths are heavy-tailed."""

    def __init__(self, seed: int) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._lengths = random.Random(seed)
        self._obs = np.zeros(4, np.float32)
        self._left = 0

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        self._left = max(1, round(MEDIAN_STEPS * self._lengths.lognormvariate(0.0, SIGMA)))
        return self._obs, {}

    async def step(self, action: Any) -> Any:
        await asyncio.sleep(STEP_S)
        self._left -= 1
        return self._obs, 1.0, self._left <= 0, False, {}


def zeros(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    return np.zeros(len(env_ids), np.int64)


async def episodes(
    venv: Any, groups: int, seen: list[aiovec.Episode] | None = None, **kwargs: Any
) -> float:
    """Seconds for an EpisodeCollector to collect ``groups`` groups (episodes into ``seen``)."""
    tasks = [{} for _ in range(groups)]
    start = time.perf_counter()
    got = 0
    async with aiovec.EpisodeCollector(
        venv, zeros, batch_size=2, group_size=GROUP, tasks=tasks, seed=0, **kwargs
    ) as collector:
        async for batch in collector:
            got += len(batch.groups)
            if seen is not None:
                seen += batch.episodes
    assert got == groups, got
    return time.perf_counter() - start


def timeline(seen: list[aiovec.Episode], columns: int = 96) -> str:
    """Each env's episodes over time: a letter per group (``a`` the first), ``.`` idle."""
    start = min(e.start_time for e in seen)
    span = max(e.end_time for e in seen) - start
    rows = [["."] * columns for _ in range(ENVS)]
    for e in seen:
        first = int((e.start_time - start) / span * columns)
        last = max(first, min(columns - 1, int((e.end_time - start) / span * columns) - 1))
        for c in range(first, last + 1):
            rows[e.env_id][c] = chr(ord("a") + e.group_id % 26)
    lines = [f"env {i}  {''.join(row)}" for i, row in enumerate(rows)]
    return "\n".join([*lines, f"       0 s{' ' * (columns - 12)}{span:.2f} s"])


async def gather_all(venv: Any, groups: int) -> float:
    """Seconds for lock-step rounds of 2 groups, each round waiting for its longest episode."""
    per_round = ENVS // GROUP
    start = time.perf_counter()
    for first in range(0, groups, per_round):
        seeds = [first + k // GROUP for k in range(ENVS)]  # each group's one seed
        await venv.reset(seed=seeds)
        running = list(range(ENVS))
        while running:
            venv.send(np.zeros(len(running), np.int64), running)
            _, _, terms, truncs, _, ids = await venv.recv(min_envs=len(running))
            running = [int(i) for i, end in zip(ids, terms | truncs, strict=True) if not end]
    return time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    reps = 1 if args.quick else args.reps
    groups = 8 if args.quick else 24
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs; reps={reps}")
    candidates: dict[str, Callable[[Any], Awaitable[float]]] = {
        "episodes": lambda venv: episodes(venv, groups),
        "episodes, 2 in flight": lambda venv: episodes(venv, groups, max_in_flight=2),
        "episodes, 4 in flight": lambda venv: episodes(venv, groups, max_in_flight=4),
        "gather-all": lambda venv: gather_all(venv, groups),
    }
    times: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            fns = [lambda i=i, r=rep: SampledLengthEnv(1000 * r + i) for i in range(ENVS)]
            async with aiovec.AsyncioVectorEnv(fns) as venv:
                times[name].append(await candidates[name](venv))
    print(f"{ENVS} async envs, groups of {GROUP}, {groups} groups, episode lengths p99/p50 = 20:")
    for name, got in times.items():
        paired = [t / base for t, base in zip(got, times["gather-all"], strict=True)]
        print(
            f"  {name:<22} {statistics.median(got):6.3f} s  "
            f"({statistics.median(paired):.2f}x gather-all, median of paired ratios)"
        )
    if args.timeline:
        seen: list[aiovec.Episode] = []
        fns = [lambda i=i: SampledLengthEnv(i) for i in range(ENVS)]
        async with aiovec.AsyncioVectorEnv(fns) as venv:
            await episodes(venv, groups, seen)
        print(timeline(seen))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test: tiny and rough")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--timeline", action="store_true", help="print one run's timeline")
    asyncio.run(main(parser.parse_args()))
