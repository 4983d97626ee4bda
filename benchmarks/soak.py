"""Soak test: a million env-steps with random episode ends and injected faults, nothing lost.

Run from the repository root::

    python benchmarks/soak.py            # 1,000,000 env-steps per backend
    python benchmarks/soak.py --quick    # CI smoke test: 20,000 env-steps per backend
    python benchmarks/soak.py --backends process --env-steps 200000 --fault-rate 0.05

On each backend (inline and process by default) an ``AsyncioVectorEnv`` of
``SoakEnv`` runs under ``on_error="restart"`` (a :class:`aiovec.RestartPolicy`
with no practical restart limit: the faults here are the point, not a crash
loop).  Episodes end at random (termination or truncation, drawn from each
env's seeded ``np_random``).  Before every step a seeded generator of the
script's own picks which envs fail (``--fault-rate``, 1% by default): their
action is :data:`FAIL`, on which ``SoakEnv.step`` raises.  An env whose action
is ignored that step (it is being autoreset) is never picked, so every fault
drawn is a fault raised.

Every step is checked against what the contract says, row by row:

- one transition per env: observations ``(num_envs, 4)``, rewards ``float64``,
  terminations and truncations ``bool``, each ``num_envs`` long; each row is
  the env it claims to be (``obs[i, 0] == i``);
- an env that failed is restarted: its row is a reset observation (step 0),
  reward 0, ``truncated=True``, and ``infos["error"]`` (masked) says it was
  rebuilt; no other row carries an error;
- an env that ended on the previous step is autoreset: step 0, reward 0, no
  flags; any other env took exactly one step (its step counter is one more
  than before) and its reward is ``1 + action`` (its own action reached it).

Reported per backend: resident memory of the process tree (this process plus
its workers) and open fds of this process after the warm-up and at the end,
faults injected, restarts seen, episodes ended and rows that broke a rule.
The script exits 1 if any rule was broken, if memory grew by 5% or more, or if
the number of open fds changed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from _common import machine_info
from gymnasium import spaces

import aiovec

FAIL = 2
"""The action on which :class:`SoakEnv` raises (the injected fault)."""

MEMORY_GROWTH_LIMIT = 0.05  # fail at >= 5% more resident memory at the end


class InjectedFault(RuntimeError):
    """What :class:`SoakEnv` raises on the action :data:`FAIL`."""


class SoakEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A cheap env whose observations say who it is and how far into its episode it is.

    Observation: ``[index, step in episode, episode number, reward]`` as
    float64.  Action ``0`` or ``1``: reward ``1 + action``; action
    :data:`FAIL` raises :class:`InjectedFault`.  Each step ends the episode
    with probability ``end_rate`` (terminated or truncated, 50/50, drawn from
    ``np_random``).
    """

    observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float64)
    action_space = spaces.Discrete(3)

    def __init__(self, index: int, end_rate: float = 0.02) -> None:
        self.index, self.end_rate = index, end_rate
        self.steps = 0
        self.episodes = 0

    def _obs(self, reward: float) -> np.ndarray:
        return np.array([self.index, self.steps, self.episodes, reward], dtype=np.float64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        self.episodes += 1
        return self._obs(0.0), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if int(action) == FAIL:
            raise InjectedFault(f"injected fault in env {self.index}")
        self.steps += 1
        reward = 1.0 + float(action)
        ended = bool(self.np_random.random() < self.end_rate)
        truncated = ended and bool(self.np_random.random() < 0.5)
        return self._obs(reward), reward, ended and not truncated, truncated, {}


# ---------------------------------------------------------------- resources


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Linux ``/proc``)."""
    found = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:  # the thread ended meanwhile
            continue
        for child in children:
            found += _tree(child)
    return found


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # the process ended meanwhile
        pass
    return 0


@dataclass(frozen=True)
class Resources:
    """Resident memory of this process and its workers, and this process's open fds."""

    rss: int
    fds: int
    processes: int

    @classmethod
    def now(cls) -> Resources:
        gc.collect()
        pids = _tree(os.getpid())
        return cls(sum(map(_rss_bytes, pids)), len(os.listdir("/proc/self/fd")), len(pids))


# ---------------------------------------------------------------- checking


@dataclass
class Tally:
    """What one backend's soak saw."""

    env_steps: int = 0
    vector_steps: int = 0
    faults: int = 0
    restarts: int = 0
    episodes_ended: int = 0
    broken: int = 0
    examples: list[str] = field(default_factory=list)  # the first few broken rules

    def fail(self, step: int, what: str) -> None:
        self.broken += 1
        if len(self.examples) < 5:
            self.examples.append(f"step {step}: {what}")


class Checker:
    """Checks every step's rows against the previous step and the faults drawn."""

    def __init__(self, num_envs: int, obs: np.ndarray) -> None:
        self.num_envs = num_envs
        self.index = np.arange(num_envs, dtype=np.float64)
        self.steps = obs[:, 1].copy()
        self.pending = np.zeros(num_envs, dtype=bool)  # ended: autoreset on the next step

    def check(
        self,
        step: int,
        actions: np.ndarray,
        faults: np.ndarray,
        result: tuple[Any, ...],
        tally: Tally,
    ) -> None:
        obs, rewards, terminations, truncations, infos = result
        n = self.num_envs
        shapes = (np.shape(obs), np.shape(rewards), np.shape(terminations), np.shape(truncations))
        if shapes != ((n, 4), (n,), (n,), (n,)):
            tally.fail(step, f"shapes {shapes}, want one row per env")
            return
        if (rewards.dtype, terminations.dtype, truncations.dtype) != (np.float64, bool, bool):
            tally.fail(step, "dtypes of rewards/flags are not float64/bool")
        marked = np.asarray(infos.get("_error", np.zeros(n, dtype=bool)), dtype=bool)
        if not np.array_equal(obs[:, 0], self.index):
            tally.fail(step, f"rows out of order or foreign: {obs[:, 0]}")
        if not np.array_equal(marked, faults):
            tally.fail(
                step, f"error rows {np.flatnonzero(marked)} != faults {np.flatnonzero(faults)}"
            )
        restarted = faults
        fresh = self.pending & ~faults  # autoreset rows
        stepped = ~self.pending & ~faults
        self._check_rows(step, restarted, obs, rewards, terminations, truncations, tally, True)
        self._check_rows(step, fresh, obs, rewards, terminations, truncations, tally, False)
        want = self.steps + 1
        if not np.array_equal(obs[stepped, 1], want[stepped]):
            tally.fail(step, "a stepped env did not take exactly one step")
        if not np.array_equal(rewards[stepped], 1.0 + actions[stepped]):
            tally.fail(step, "a stepped env's reward is not 1 + its action")
        for i in np.flatnonzero(restarted):
            message = str(infos["error"][i])
            if "InjectedFault" not in message or "rebuilt" not in message:
                tally.fail(step, f"env {i}'s infos['error'] is {message!r}")
        tally.restarts += int(marked.sum())
        tally.faults += int(faults.sum())
        ended = terminations | truncations
        tally.episodes_ended += int((ended & ~faults).sum())
        self.steps = obs[:, 1].copy()
        self.pending = ended

    @staticmethod
    def _check_rows(
        step: int,
        rows: np.ndarray,
        obs: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        tally: Tally,
        truncated: bool,
    ) -> None:
        """Rows that must be a reset observation: step 0, reward 0, the given flags."""
        if not rows.any():
            return
        what = "restarted" if truncated else "autoreset"
        if (obs[rows, 1] != 0).any() or (rewards[rows] != 0.0).any():
            tally.fail(step, f"a {what} row is not a reset observation with reward 0")
        if terminations[rows].any() or (truncations[rows] != truncated).any():
            tally.fail(step, f"a {what} row has flags other than truncated={truncated}")


# ---------------------------------------------------------------- the soak


@dataclass(frozen=True)
class Config:
    backend: str
    num_envs: int
    env_steps: int
    warmup_steps: int  # vector steps before the first measurement
    fault_rate: float
    end_rate: float
    seed: int


@dataclass
class Outcome:
    config: Config
    start: Resources
    end: Resources
    tally: Tally
    seconds: float

    @property
    def memory_growth(self) -> float:
        return self.end.rss / self.start.rss - 1.0

    @property
    def passed(self) -> bool:
        return (
            self.tally.broken == 0
            and self.memory_growth < MEMORY_GROWTH_LIMIT
            and self.end.fds == self.start.fds
        )


async def soak(config: Config) -> Outcome:
    """Run one backend's soak and return what it saw."""
    n = config.num_envs
    fns = [functools.partial(SoakEnv, i, config.end_rate) for i in range(n)]
    policy = aiovec.RestartPolicy(max_restarts=10**9, backoff=0.0)
    draws = np.random.default_rng(config.seed)
    tally = Tally()
    vector_steps = config.env_steps // n
    async with aiovec.AsyncioVectorEnv(
        fns, backend=config.backend, num_workers=2, on_error=policy
    ) as venv:
        obs, _ = await venv.reset(seed=config.seed)
        checker = Checker(n, obs)
        start: Resources | None = None
        began = time.perf_counter()
        for step in range(config.warmup_steps + vector_steps):
            if step == config.warmup_steps:
                start = Resources.now()
                began = time.perf_counter()
                tally = Tally()
            actions = draws.integers(0, 2, n)
            faults = (draws.random(n) < config.fault_rate) & ~checker.pending
            actions[faults] = FAIL
            result = await venv.step(actions)
            checker.check(step, actions, faults, result, tally)
            tally.vector_steps += 1
            tally.env_steps += n
        seconds = time.perf_counter() - began
        end = Resources.now()
    assert start is not None
    return Outcome(config, start, end, tally, seconds)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def report(outcome: Outcome) -> None:
    c, t = outcome.config, outcome.tally
    s, e = outcome.start, outcome.end
    print(
        f"backend={c.backend}: {t.env_steps:,} env-steps ({c.num_envs} envs x "
        f"{t.vector_steps:,} steps) in {outcome.seconds:.1f} s"
    )
    print(f"  faults injected   {t.faults:,} (rate {c.fault_rate:g})")
    print(f"  restarts          {t.restarts:,}")
    print(f"  episodes ended    {t.episodes_ended:,}")
    print(f"  rules broken      {t.broken:,} (rows lost, extra, misrouted or unmarked)")
    print(
        f"  resident memory   {_mib(s.rss)} -> {_mib(e.rss)} ({outcome.memory_growth:+.1%}; "
        f"{s.processes} process(es) -> {e.processes})"
    )
    print(f"  open fds          {s.fds} -> {e.fds}")
    for line in t.examples:
        print(f"    {line}")
    print(f"  {'PASS' if outcome.passed else 'FAIL'}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 env-steps (CI smoke test)")
    parser.add_argument("--env-steps", type=int, help="env-steps per backend (default 1,000,000)")
    parser.add_argument("--envs", type=int, default=16, help="envs per vector env (16)")
    parser.add_argument(
        "--backends", default="inline,process", help="comma-separated (inline,process)"
    )
    parser.add_argument("--fault-rate", type=float, default=0.01, help="per env-step (0.01)")
    parser.add_argument("--end-rate", type=float, default=0.02, help="episode end per step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.env_steps is None:
        args.env_steps = 20_000 if args.quick else 1_000_000
    if args.envs < 1 or args.env_steps < args.envs:
        parser.error(
            f"need --envs >= 1 and --env-steps >= --envs, got {args.envs}, {args.env_steps}"
        )
    if not 0.0 <= args.fault_rate < 1.0:
        parser.error(f"--fault-rate must be within [0, 1), got {args.fault_rate}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print("machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()))
    print(f"command: python benchmarks/soak.py {' '.join(sys.argv[1:])}".rstrip())
    passed = True
    for backend in args.backends.split(","):
        config = Config(
            backend=backend,
            num_envs=args.envs,
            env_steps=args.env_steps,
            warmup_steps=max(50, args.env_steps // args.envs // 50),
            fault_rate=args.fault_rate,
            end_rate=args.end_rate,
            seed=args.seed,
        )
        outcome = asyncio.run(soak(config))
        report(outcome)
        passed &= outcome.passed
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
