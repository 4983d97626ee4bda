"""Draw docs/img/collector-timeline.png: each env's steps and the policy's batches.

From one real run: 12 async envs on the inline backend whose steps wait a
heavy-tailed time (95% 2-10 ms, 5% 100-300 ms), collected by `aiovec.Collector`
with ``max_batch=4``.  Each env records when its ``step`` began and ended, the
policy when it was called and for which envs; nothing is simulated.

Run it with ``python tools/collector_timeline.py [OUT_DIR]`` (needs matplotlib:
``pip install "aiovec[plot]"``).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces
from matplotlib.figure import Figure

import aiovec

NUM_ENVS, MAX_BATCH, SECONDS = 12, 4, 0.4
STEPS: list[tuple[int, float, float]] = []  # (env, start, end)
CALLS: list[tuple[float, list[int]]] = []  # (when, envs)


class TimedEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    def __init__(self, i: int) -> None:
        self.i = i
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._rng = random.Random(i)

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return np.zeros(2, np.float32), {}

    async def step(self, action: Any) -> Any:
        start = time.perf_counter()
        tail = self._rng.random() < 0.05
        await asyncio.sleep(self._rng.uniform(0.1, 0.3) if tail else self._rng.uniform(0.002, 0.01))
        STEPS.append((self.i, start, time.perf_counter()))
        return np.zeros(2, np.float32), 1.0, False, False, {}


def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    CALLS.append((time.perf_counter(), env_ids.tolist()))
    return np.zeros(len(env_ids), np.int64)


async def record() -> float:
    venv = aiovec.AsyncioVectorEnv([lambda i=i: TimedEnv(i) for i in range(NUM_ENVS)])
    start = time.perf_counter()
    async with (
        venv,
        aiovec.Collector(
            venv, policy, segment_length=8, batch_size=2, max_batch=MAX_BATCH
        ) as collector,
    ):
        async for _ in collector:
            if time.perf_counter() - start > SECONDS:
                break
    return start


def draw(start: float, out: Path) -> None:
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    for i, s, e in STEPS:
        ax.barh(i, (e - s) * 1e3, left=(s - start) * 1e3, height=0.7, color="tab:blue")
    for when, envs in CALLS:
        x = (when - start) * 1e3
        ax.plot([x] * len(envs), envs, "|", color="tab:red", markersize=9)
        ax.barh(NUM_ENVS + 0.5, 0.6, left=x, height=0.7, color="tab:red")
    ax.set_yticks([*range(NUM_ENVS), NUM_ENVS + 0.5])
    ax.set_yticklabels([f"env {i}" for i in range(NUM_ENVS)] + ["policy"])
    ax.set_xlabel("ms since the collection started")
    ax.set_xlim(0, SECONDS * 1e3)
    ax.set_title(
        "Collector: each env steps as soon as the policy answered for it "
        f"(blue: env steps; red: policy calls, max_batch={MAX_BATCH})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out / "collector-timeline.png", dpi=110)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")
    draw(asyncio.run(record()), out)
    print(f"wrote {out / 'collector-timeline.png'}: {len(STEPS)} steps, {len(CALLS)} calls")
