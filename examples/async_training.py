"""An async training loop: a numpy policy-gradient agent learns CartPole through ``await``.

Two tasks share one event loop, each with its own ``aiovec.AsyncioVectorEnv``:

- the **trainer** collects batches from 16 envs and improves a linear softmax
  policy with REINFORCE (returns-to-go, normalised advantages, Adam), all in
  numpy;
- the **evaluator** waits for a snapshot of the policy, plays one greedy
  episode in each of 8 envs of its own and records the mean return: the
  learning curve.

The envs are CartPole behind a simulated 1 ms round trip (``RemoteCartPole``):
the shape of a simulator that runs elsewhere.  While one task waits on its
envs, the other runs, so evaluation costs the trainer almost nothing; no
thread, no process.  SAME_STEP autoreset keeps every row of a batch a real
transition (an env that ends is reset inside that step).

A progress bar goes to stderr; at the end the learning curve is drawn to
``async_training.png`` if matplotlib is installed (``pip install
"aiovec[plot]"``), and skipped with a note otherwise.

Run it with ``python examples/async_training.py`` (~15 s); ``--quick`` (or the
environment variable ``AIOVEC_EXAMPLES_QUICK=1``, which CI sets) runs a few
updates only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

import aiovec

ROUND_TRIP = 0.001  # seconds each simulator call waits


class RemoteCartPole(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """CartPole-v1 on a (simulated) remote simulator: every call waits one round trip."""

    def __init__(self) -> None:
        self.env = gym.make("CartPole-v1")
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        await asyncio.sleep(ROUND_TRIP)  # e.g. `await client.request("reset", seed)`
        return self.env.reset(seed=seed, options=options)

    async def step(self, action: np.int64) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        await asyncio.sleep(ROUND_TRIP)  # e.g. `await client.request("step", action)`
        return self.env.step(action)

    async def close(self) -> None:
        self.env.close()


@dataclass
class Policy:
    """A linear softmax policy over CartPole's two actions, trained with Adam."""

    weights: np.ndarray = field(default_factory=lambda: np.zeros((5, 2)))  # 4 obs + bias
    learning_rate: float = 0.05
    _m: np.ndarray = field(default_factory=lambda: np.zeros((5, 2)))
    _v: np.ndarray = field(default_factory=lambda: np.zeros((5, 2)))
    _t: int = 0

    @staticmethod
    def features(obs: np.ndarray) -> np.ndarray:
        return np.concatenate([obs, np.ones((len(obs), 1))], axis=1)

    def probabilities(self, obs: np.ndarray) -> np.ndarray:
        logits = self.features(obs) @ self.weights
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)

    def sample(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        probs = self.probabilities(obs)
        return (rng.random(len(obs)) < probs[:, 1]).astype(np.int64)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        return self.probabilities(obs).argmax(axis=1)

    def improve(self, obs: np.ndarray, actions: np.ndarray, advantages: np.ndarray) -> None:
        """One Adam step up the REINFORCE gradient, mean of adv * grad log pi(a|s)."""
        probs = self.probabilities(obs)
        chosen = np.eye(2)[actions]
        grad = self.features(obs).T @ ((chosen - probs) * advantages[:, None]) / len(obs)
        self._t += 1
        self._m = 0.9 * self._m + 0.1 * grad
        self._v = 0.999 * self._v + 0.001 * grad**2
        m_hat = self._m / (1 - 0.9**self._t)
        v_hat = self._v / (1 - 0.999**self._t)
        self.weights += self.learning_rate * m_hat / (np.sqrt(v_hat) + 1e-8)


def returns_to_go(rewards: np.ndarray, dones: np.ndarray, gamma: float = 0.99) -> np.ndarray:
    """Discounted returns per env (axis 1), restarting after every episode end."""
    returns = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[1])
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running * ~dones[t]
        returns[t] = running
    return returns


async def train(
    policy: Policy, updates: int, snapshots: asyncio.Queue[tuple[int, np.ndarray] | None]
) -> None:
    """Collect batches, improve the policy, hand snapshots to the evaluator."""
    rng = np.random.default_rng(0)
    fns = [RemoteCartPole] * 16
    async with aiovec.AsyncioVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP) as venv:
        obs, _ = await venv.reset(seed=0)
        for update in range(1, updates + 1):
            batch_obs, batch_actions, rewards, dones = [], [], [], []
            for _ in range(128):
                actions = policy.sample(obs, rng)
                batch_obs.append(obs)
                batch_actions.append(actions)
                obs, reward, terminated, truncated, _ = await venv.step(actions)
                rewards.append(reward)
                dones.append(terminated | truncated)
            returns = returns_to_go(np.array(rewards), np.array(dones))
            advantages = (returns - returns.mean()) / (returns.std() + 1e-8)
            policy.improve(
                np.concatenate(batch_obs), np.concatenate(batch_actions), advantages.ravel()
            )
            show_progress(update, updates)
            if update % max(1, updates // 10) == 0 or update == updates:
                await snapshots.put((update, policy.weights.copy()))
    await snapshots.put(None)  # training is over


async def evaluate(
    snapshots: asyncio.Queue[tuple[int, np.ndarray] | None], curve: list[tuple[int, float]]
) -> None:
    """Play one greedy episode per env for every snapshot, concurrently with training."""
    async with aiovec.AsyncioVectorEnv([RemoteCartPole] * 8) as venv:
        while (snapshot := await snapshots.get()) is not None:
            update, weights = snapshot
            policy = Policy(weights=weights)
            obs, _ = await venv.reset(seed=1000 + update)
            totals, finished = np.zeros(8), np.zeros(8, dtype=bool)
            while not finished.all():
                obs, reward, terminated, truncated, _ = await venv.step(policy.greedy(obs))
                totals += reward * ~finished
                finished |= terminated | truncated
            curve.append((update, float(totals.mean())))


def show_progress(done: int, total: int) -> None:
    """A one-line progress bar on stderr (redrawn in place on a terminal)."""
    if not sys.stderr.isatty() and done not in (1, total):
        return
    filled = 30 * done // total
    end = "\n" if done == total or not sys.stderr.isatty() else ""
    bar = "#" * filled + "-" * (30 - filled)
    print(f"\rtraining [{bar}] update {done}/{total}", end=end, file=sys.stderr, flush=True)


def draw(curve: list[tuple[int, float]], path: str) -> None:
    """The learning curve as a PNG, if matplotlib is installed."""
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415  (an optional extra)
    except ImportError:
        print(f'(no {path}: pip install "aiovec[plot]" to draw the learning curve)')
        return
    figure = Figure(figsize=(6, 3.5), layout="constrained")
    axes = figure.add_subplot()
    updates, returns = zip(*curve, strict=True)
    axes.plot(updates, returns, marker="o")
    axes.set_xlabel("policy update (2,048 env-steps each)")
    axes.set_ylabel("greedy return (mean of 8 episodes)")
    axes.set_title("REINFORCE on CartPole-v1 through aiovec's await API")
    axes.set_ylim(0, 510)
    axes.grid(True, alpha=0.3)
    figure.savefig(path, dpi=100)
    print(f"learning curve written to {path}")


async def main(updates: int, plot: str) -> None:
    policy = Policy()
    snapshots: asyncio.Queue[tuple[int, np.ndarray] | None] = asyncio.Queue()
    curve: list[tuple[int, float]] = []
    start = time.perf_counter()
    async with asyncio.TaskGroup() as tasks:  # both run until training ends
        tasks.create_task(train(policy, updates, snapshots))
        tasks.create_task(evaluate(snapshots, curve))
    elapsed = time.perf_counter() - start
    print(f"{updates} updates ({updates * 16 * 128:,} env-steps) in {elapsed:.1f} s")
    for update, mean_return in curve:
        print(f"  after update {update:3d}: greedy return {mean_return:6.1f}")
    draw(curve, plot)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="a few updates (a smoke test)")
    parser.add_argument("--plot", default="async_training.png", help="learning-curve PNG")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1"
    asyncio.run(main(3 if quick else args.updates, args.plot))
