"""PPO (numpy only) on CartPole behind a slow server: the Collector against lock-step.

Each env is CartPole behind a simulated game server whose every step waits a
heavy-tailed time: 95% of steps take 2-10 ms, 5% take 100-300 ms.  With 64
envs, a lock-step ``step()`` almost always waits for some env's slow step;
`aiovec.Collector` steps each env again as soon as the policy has answered for
it and hands out ``(envs, steps)`` segments.  The same agent (a numpy MLP, PPO
with GAE, truncations bootstrapped from the final observation) learns from
either; the script prints mean return against env-steps and wall time for
both, over 3 seeds.

Run: ``python examples/async_ppo.py`` (a few minutes: the lock-step runs wait on
the slow steps; the six runs go in parallel processes), or with
``AIOVEC_EXAMPLES_QUICK=1`` (a tiny run of each, seconds).
"""

from __future__ import annotations

import os

# Six runs go in parallel processes, and the agent's matrices are small: one BLAS
# thread each (several would fight over the cores and be 3x slower).
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import asyncio  # noqa: E402
import itertools  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium  # noqa: E402
import numpy as np  # noqa: E402

import aiovec  # noqa: E402

QUICK = os.environ.get("AIOVEC_EXAMPLES_QUICK") == "1"
NUM_ENVS, SEGMENT = (4, 8) if QUICK else (64, 16)
BUDGET = 2 * NUM_ENVS * SEGMENT if QUICK else 60_000  # env-steps per run
GAMMA, LAMBDA, CLIP, EPOCHS, MINIBATCHES, LR, ENTROPY = 0.99, 0.95, 0.2, 4, 4, 1e-3, 0.01


class SlowServerEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """CartPole behind a server: each step waits 2-10 ms (95%) or 100-300 ms (5%)."""

    def __init__(self, seed: int) -> None:
        self.env = gymnasium.make("CartPole-v1")
        self.observation_space, self.action_space = (
            self.env.observation_space,
            self.env.action_space,
        )
        self._delays = random.Random(seed)

    async def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        return self.env.reset(seed=seed, options=options)

    async def step(self, action: Any) -> Any:
        slow = self._delays.random() < 0.05
        await asyncio.sleep(self._delays.uniform(*((0.1, 0.3) if slow else (0.002, 0.01))))
        return self.env.step(action)

    async def close(self) -> None:
        self.env.close()


# -- the agent: two tanh MLPs and Adam, by hand ---------------------------------------


class MLP:
    """``in -> 64 -> 64 -> out`` with tanh, and its gradient by hand."""

    def __init__(self, rng: np.random.Generator, sizes: tuple[int, ...], last_scale: float) -> None:
        self.params = []
        for k, (a, b) in enumerate(itertools.pairwise(sizes)):
            scale = last_scale if k == len(sizes) - 2 else np.sqrt(2)
            self.params += [rng.standard_normal((a, b)) * scale / np.sqrt(a), np.zeros(b)]

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        acts = [x]
        for k in range(0, len(self.params), 2):
            x = x @ self.params[k] + self.params[k + 1]
            if k < len(self.params) - 2:
                x = np.tanh(x)
            acts.append(x)
        return x, acts

    def backward(self, acts: list[np.ndarray], grad: np.ndarray) -> list[np.ndarray]:
        grads: list[np.ndarray] = []
        for k in range(len(self.params) - 2, -1, -2):
            layer = k // 2
            grads = [acts[layer].T @ grad, grad.sum(0), *grads]
            if k:
                grad = (grad @ self.params[k].T) * (1 - acts[layer] ** 2)
        return grads


class Adam:
    def __init__(self, params: list[np.ndarray]) -> None:
        self.params, self.t = params, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        for k, g in enumerate(grads):
            self.m[k] += 0.1 * (g - self.m[k])
            self.v[k] += 0.001 * (g * g - self.v[k])
            m_hat, v_hat = self.m[k] / (1 - 0.9**self.t), self.v[k] / (1 - 0.999**self.t)
            self.params[k] -= LR * m_hat / (np.sqrt(v_hat) + 1e-8)


class Agent:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.pi, self.vf = MLP(self.rng, (4, 64, 64, 2), 0.01), MLP(self.rng, (4, 64, 64, 1), 1.0)
        self.opt = Adam(self.pi.params + self.vf.params)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logits, _ = self.pi.forward(obs)
        logp = logits - np.logaddexp(logits[:, 0], logits[:, 1])[:, None]
        actions = (self.rng.random(len(obs)) < np.exp(logp[:, 1])).astype(np.int64)
        return actions, logp[np.arange(len(obs)), actions]

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.vf.forward(obs)[0][..., 0]

    def learn(self, obs, actions, logp, rewards, terms, truncs, next_obs) -> None:
        """PPO on ``(B, T)`` segments: GAE, truncations bootstrapped from ``next_obs``."""
        b, t = rewards.shape
        values = self.value(obs.reshape(b * t, 4)).reshape(b, t)
        nexts = self.value(next_obs.reshape(b * t, 4)).reshape(b, t)
        deltas = rewards + GAMMA * nexts * ~terms - values
        adv, running = np.zeros_like(rewards), np.zeros(b)
        for k in reversed(range(t)):
            running = deltas[:, k] + GAMMA * LAMBDA * ~(terms[:, k] | truncs[:, k]) * running
            adv[:, k] = running
        flat = [x.reshape(b * t, *x.shape[2:]) for x in (obs, actions, logp, adv, adv + values)]
        for _ in range(EPOCHS):
            order = self.rng.permutation(b * t)
            for part in np.array_split(order, MINIBATCHES):
                self._update(*(x[part] for x in flat))

    def _update(self, obs, actions, old_logp, adv, returns) -> None:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        n = len(obs)
        logits, pi_acts = self.pi.forward(obs)
        logp_all = logits - np.logaddexp(logits[:, 0], logits[:, 1])[:, None]
        p = np.exp(logp_all)
        ratio = np.exp(logp_all[np.arange(n), actions] - old_logp)
        active = ~(((adv > 0) & (ratio > 1 + CLIP)) | ((adv < 0) & (ratio < 1 - CLIP)))
        onehot = np.eye(2)[actions]
        entropy = -(p * logp_all).sum(1, keepdims=True)
        grad_logits = (-(ratio * adv * active)[:, None] * (onehot - p)) / n
        grad_logits += ENTROPY * p * (logp_all + entropy) / n
        v, vf_acts = self.vf.forward(obs)
        grad_v = (v[:, 0] - returns)[:, None] / n
        self.opt.step(self.pi.backward(pi_acts, grad_logits) + self.vf.backward(vf_acts, grad_v))


# -- the two ways of collecting ---------------------------------------------------------


class Curve:
    """Mean return of the last 20 episodes against env-steps and wall time."""

    def __init__(self) -> None:
        self.start, self.steps = time.perf_counter(), 0
        self.returns = np.zeros(NUM_ENVS)
        self.episodes: list[float] = []
        self.points: list[tuple[int, float, float]] = []

    def add(self, env_ids: np.ndarray, rewards: np.ndarray, ends: np.ndarray) -> None:
        for row, i in enumerate(env_ids.tolist()):
            for r, end in zip(rewards[row].tolist(), ends[row].tolist(), strict=True):
                self.returns[i] += r
                if end:
                    self.episodes.append(self.returns[i])
                    self.returns[i] = 0.0
        self.steps += rewards.size
        mean = float(np.mean(self.episodes[-20:])) if self.episodes else 0.0
        self.points.append((self.steps, time.perf_counter() - self.start, mean))


def envs(seed: int, mode: str) -> aiovec.AsyncioVectorEnv[Any, Any]:
    fns = [lambda i=i: SlowServerEnv(seed * 1000 + i) for i in range(NUM_ENVS)]
    return aiovec.AsyncioVectorEnv(fns, autoreset_mode=mode)


async def with_collector(seed: int) -> Curve:
    agent, curve = Agent(seed), Curve()

    def policy(obs: np.ndarray, env_ids: np.ndarray) -> Any:
        actions, logp = agent.act(obs)
        return actions, {"log_prob": logp}

    async with (
        envs(seed, "NextStep") as venv,
        aiovec.Collector(
            venv, policy, segment_length=SEGMENT, batch_size=NUM_ENVS, seed=seed
        ) as collector,
    ):
        async for b in collector:
            curve.add(b.env_ids, b.rewards, b.terminations | b.truncations)
            agent.learn(
                b.obs,
                b.actions,
                b.extras["log_prob"],
                b.rewards,
                b.terminations,
                b.truncations,
                b.next_obs,
            )
            collector.update_policy()
            if curve.steps >= BUDGET:
                break
    return curve


async def lockstep(seed: int) -> Curve:
    agent, curve = Agent(seed), Curve()
    async with envs(seed, "SameStep") as venv:
        obs, _ = await venv.reset(seed=seed)
        while curve.steps < BUDGET:
            rows: dict[str, list[np.ndarray]] = {k: [] for k in "oalrxun"}
            for _ in range(SEGMENT):
                actions, logp = agent.act(obs)
                nxt, rewards, terms, truncs, infos = await venv.step(actions)
                final = nxt.copy()
                for i in np.flatnonzero(infos.get("_final_obs", np.zeros(NUM_ENVS, bool))):
                    final[i] = infos["final_obs"][i]
                for key, x in zip(
                    "oalrxun", (obs, actions, logp, rewards, terms, truncs, final), strict=True
                ):
                    rows[key].append(x)
                obs = nxt
            o, a, lp, r, te, tr, n = (np.stack(rows[k], axis=1) for k in "oalrxun")
            curve.add(np.arange(NUM_ENVS), r, te | tr)
            agent.learn(o, a, lp, r, te, tr, n)
    return curve


def run(job: tuple[str, int]) -> tuple[str, int, list[tuple[int, float, float]]]:
    mode, seed = job
    curve = asyncio.run(with_collector(seed) if mode == "collector" else lockstep(seed))
    return mode, seed, curve.points


def main() -> None:
    seeds = [0] if QUICK else [0, 1, 2]
    jobs = [(mode, seed) for mode in ("collector", "lock-step") for seed in seeds]
    if QUICK:
        results = [run(job) for job in jobs]
    else:
        with ProcessPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(run, jobs))
    print(f"{NUM_ENVS} envs, heavy-tailed step latency; mean return of the last 20 episodes")
    for mode in ("collector", "lock-step"):
        curves = [points for m, _, points in results if m == mode]
        for fraction in (0.25, 0.5, 1.0):
            at = [min(p, key=lambda q: abs(q[0] - fraction * BUDGET)) for p in curves]
            returns = [q[2] for q in at]
            wall = np.mean([q[1] for q in at])
            print(
                f"  {mode:>9} at {fraction * BUDGET:>7,.0f} env-steps: return "
                f"{np.mean(returns):6.1f} (seeds {min(returns):.0f}-{max(returns):.0f}), "
                f"{wall:6.1f} s of wall time"
            )
    assert all(points for _, _, points in results)


if __name__ == "__main__":
    main()
