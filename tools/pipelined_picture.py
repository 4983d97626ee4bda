"""Draw docs/img/pipelined.png: a learner and two process workers overlapping.

The picture is drawn from one real run's timestamps.  64 CartPole envs run on
``backend="process"`` with 2 workers; the learner loops ``recv(min_envs=32)``,
a stand-in for a policy's forward pass (``LEARNER_US`` of numpy work), then
``send`` for the envs it received.  Each env records when its ``step`` began and
ended (``time.perf_counter``: one clock for every process on Linux) and returns
both in its info, so the bars of the workers are when their envs really ran.

Run it with ``python tools/pipelined_picture.py [OUT_DIR]`` (needs matplotlib:
``pip install "aiovec[plot]"``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from matplotlib.figure import Figure

import aiovec

NUM_ENVS, BATCH, WORKERS = 64, 32, 2
LEARNER_US = 300  # the learner's own work per round
WARMUP, ROUNDS = 50, 10


class Stamped(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose info says when its step ran, and in which process."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))

    def step(self, action: Any) -> Any:
        began = time.perf_counter()
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = {**info, "began": began, "ended": time.perf_counter(), "pid": os.getpid()}
        return obs, reward, terminated, truncated, info


def learn(weights: np.ndarray, obs: np.ndarray) -> None:
    """About ``LEARNER_US`` of work, as a policy's forward pass would take."""
    until = time.perf_counter() + LEARNER_US * 1e-6
    while time.perf_counter() < until:
        np.tanh(obs @ weights)


def run() -> tuple[list[tuple[str, float, float]], dict[int, list[tuple[float, float]]]]:
    """One run: the learner's spans, and each worker's env steps."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 64))
    learner: list[tuple[str, float, float]] = []
    steps: dict[int, list[tuple[float, float]]] = {}
    with aiovec.BlockingVectorEnv(
        [Stamped] * NUM_ENVS, backend="process", num_workers=WORKERS
    ) as venv:
        venv.reset(seed=0)
        venv.send(rng.integers(0, 2, NUM_ENVS), np.arange(NUM_ENVS))
        for k in range(WARMUP + ROUNDS):
            waited = time.perf_counter()
            obs, _, _, _, infos, ids = venv.recv(min_envs=BATCH)
            got = time.perf_counter()
            learn(weights, obs)
            learned = time.perf_counter()
            venv.send(rng.integers(0, 2, len(ids)), ids)
            sent = time.perf_counter()
            if k < WARMUP:
                continue
            learner += [("recv", waited, got), ("learn", got, learned), ("send", learned, sent)]
            for row in np.flatnonzero(infos.get("_began", [])):
                span = (float(infos["began"][row]), float(infos["ended"][row]))
                steps.setdefault(int(infos["pid"][row]), []).append(span)
        venv.recv()
    return learner, steps


def draw(
    learner: list[tuple[str, float, float]], steps: dict[int, list[tuple[float, float]]]
) -> Figure:
    t0 = learner[0][1]
    colours = {"recv": "#dddddd", "learn": "#4c72b0", "send": "#dd8452"}
    figure = Figure(figsize=(10, 2.6))
    axes = figure.subplots()
    for name, start, end in learner:
        axes.broken_barh(
            [((start - t0) * 1e3, (end - start) * 1e3)], (2.6, 0.8), color=colours[name]
        )
    for row, pid in enumerate(sorted(steps)):
        spans = [((a - t0) * 1e3, (b - a) * 1e3) for a, b in steps[pid] if a >= t0]
        axes.broken_barh(spans, (1.6 - row, 0.8), color="#55a868")
    end = (learner[-1][2] - t0) * 1e3
    axes.set_xlim(0, end)
    axes.set_yticks([3.0, 2.0, 1.0], ["learner", "worker 1", "worker 2"])
    axes.set_xlabel(
        "ms  (learner: grey = waiting in recv, blue = its own work, orange = send; "
        "workers: green = an env's step)"
    )
    axes.set_title(
        f"{NUM_ENVS} CartPole envs, {WORKERS} worker processes, "
        f"recv(min_envs={BATCH}) -> {LEARNER_US} us of work -> send (one real run)"
    )
    figure.tight_layout()
    return figure


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pipelined.png"
    draw(*run()).savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
