"""aiovec's own overhead per env-step, against gymnasium's ``SyncVectorEnv``.

Run from the repository root::

    python benchmarks/overhead.py            # full run, a few minutes
    python benchmarks/overhead.py --quick    # CI smoke test, < 20 s
    python benchmarks/overhead.py --reps 9 --json results.json
    python benchmarks/overhead.py --only sb3 # the SB3 adapter against DummyVecEnv and
                                             # SubprocVecEnv only

For each case (an env and a number of envs N) every candidate steps the same
pre-sampled actions: gymnasium's ``SyncVectorEnv`` (the baseline), aiovec's
await API (``AsyncioVectorEnv(backend="inline")``, timed inside one running
loop, on asyncio's default loop and on uvloop when installed) and aiovec's
blocking wrapper (``BlockingVectorEnv``, timed in plain sync code).  The
candidates of a case take turns in every repetition (rotating the order), so
noise from other processes hits them alike.  Each timing is preceded by an
untimed ``reset(seed=0)`` and ``gc.collect()``.

Envs: ``TrivialEnv`` (the cheapest sync env) and CartPole-v1 through both;
``AsyncTrivialEnv`` (its async twin, never suspends) and ``YieldingTrivialEnv``
(suspends once per step, so the event loop does real work) through aiovec,
compared with ``SyncVectorEnv`` over ``TrivialEnv``.

With Stable-Baselines3 installed, SB3 cases compare the adapter
(``aiovec.compat.sb3.make_sb3_env``, inline) with SB3's ``DummyVecEnv`` over
the same envs, stepped as SB3 steps them (``step(actions)``; CartPole-v1, and
``HeldInfoEnv``, which ends episodes and fills infos often, so the adapter's
copies of infos show), and the adapter on ``backend="process"`` (its default
workers) with SB3's ``SubprocVecEnv`` (one process per env) over CartPole-v1.

Reported: the median over repetitions of microseconds per env-step, and the
median of the per-repetition ratio aiovec / gymnasium (or aiovec / SB3) with its
range, with PASS/MISS against the project's targets.  Timings never make the script fail.
Reference rows: a bare ``asyncio.gather`` over the async envs' coroutines, and
the fixed cost of one call into an event loop (``asyncio.Runner().run(noop())``)
next to one ``step`` of each vector env with N = 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from _common import (
    Candidate,
    loop_factories,
    machine_info,
    median_ratio,
    per_env_step_us,
    run_interleaved,
    timed_async,
    timed_sync,
)

import aiovec
from aiovec.testing import AsyncTrivialEnv, TrivialEnv

BASELINE = "gymnasium SyncVectorEnv"
SB3_BASELINE = "SB3 DummyVecEnv"
SB3_SUBPROC = "SB3 SubprocVecEnv"

# (env label, front end, N) -> highest acceptable ratio aiovec / gymnasium.
TARGETS: dict[tuple[str, str, int], float] = {
    ("TrivialEnv", "await", 64): 1.0,
    ("TrivialEnv", "await", 512): 1.0,
    ("TrivialEnv", "blocking", 8): 1.25,  # issue 34 (2.0 before)
    ("TrivialEnv", "blocking", 64): 1.25,
    ("CartPole-v1", "blocking", 8): 1.15,
    ("CartPole-v1", "sb3", 8): 1.15,  # issue 34: inline against DummyVecEnv
    ("CartPole-v1", "sb3 process", 8): 1.0,  # issue 34: no slower than SubprocVecEnv
}


def make_cartpole() -> gymnasium.Env[Any, Any]:
    return gymnasium.make("CartPole-v1")


class YieldingTrivialEnv(AsyncTrivialEnv):
    """:class:`AsyncTrivialEnv` whose step suspends once (``asyncio.sleep(0)``).

    The cheapest env that really waits: every step goes through the event loop,
    which is where the choice of loop (asyncio's or uvloop) shows.
    """

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(0)
        return await super().step(action)


class HeldInfoEnv(gymnasium.Env[Any, Any]):
    """Episodes of 1 to 4 steps; each step's info holds a small array and a dict."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,))
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self) -> None:
        self.obs = np.zeros(4, np.float32)
        self.info = {"state": np.zeros(3), "meta": {"level": 1}}
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self.obs, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self.obs, 1.0, self.t >= 1 + (action + self.t) % 4, False, self.info


@dataclass(frozen=True)
class Case:
    """An env (as aiovec sees it and as gymnasium sees it) and a number of envs."""

    env: str
    num_envs: int
    aiovec_env_fn: Callable[[], Any]
    baseline_env_fn: Callable[[], gymnasium.Env[Any, Any]]
    gather_env: Callable[[], Any] | None = None  # add bare asyncio.gather rows over these
    backend: str = "inline"  # SB3 cases: the adapter's backend (process: against SubprocVecEnv)


class Actions:
    """Actions sampled once, up front, from the batched action space; grown on demand."""

    def __init__(self, space: gymnasium.spaces.Space[Any]) -> None:
        self._space = space
        self._space.seed(0)
        self._rows: list[Any] = []

    def take(self, steps: int) -> list[Any]:
        while len(self._rows) < steps:
            self._rows.append(self._space.sample())
        return self._rows[:steps]


# ---------------------------------------------------------------- candidates


def stepping_candidate(
    name: str, venv: Any, actions: Actions, before: Callable[[], object]
) -> Candidate:
    """A synchronous vector env (gymnasium's or SB3's) whose ``step`` is timed in plain code."""

    def run(steps: int) -> float:
        rows = actions.take(steps)

        def body() -> None:
            step = venv.step
            for a in rows:
                step(a)

        return timed_sync(body, before=before)

    return Candidate(name, run, venv.close)


def baseline_candidate(case: Case, actions: Actions) -> Candidate:
    venv = gymnasium.vector.SyncVectorEnv([case.baseline_env_fn] * case.num_envs)
    return stepping_candidate(BASELINE, venv, actions, lambda: venv.reset(seed=0))


def await_candidate(
    case: Case, actions: Actions, loop: str, factory: Callable[[], asyncio.AbstractEventLoop]
) -> Candidate:
    runner = asyncio.Runner(loop_factory=factory)

    async def build() -> aiovec.AsyncioVectorEnv:
        return aiovec.AsyncioVectorEnv([case.aiovec_env_fn] * case.num_envs, backend="inline")

    venv = runner.run(build())

    def run(steps: int) -> float:
        rows = actions.take(steps)

        async def body() -> None:
            step = venv.step
            for a in rows:
                await step(a)

        async def before() -> None:
            await venv.reset(seed=0)

        return runner.run(timed_async(body, before))

    def close() -> None:
        runner.run(venv.close())
        runner.close()

    return Candidate(f"aiovec await ({loop})", run, close)


def blocking_candidate(case: Case, actions: Actions) -> Candidate:
    venv = aiovec.BlockingVectorEnv([case.aiovec_env_fn] * case.num_envs, backend="inline")
    return stepping_candidate("aiovec blocking", venv, actions, lambda: venv.reset(seed=0))


def gather_candidate(
    case: Case, actions: Actions, loop: str, factory: Callable[[], asyncio.AbstractEventLoop]
) -> Candidate:
    runner = asyncio.Runner(loop_factory=factory)
    assert case.gather_env is not None
    envs = [case.gather_env() for _ in range(case.num_envs)]

    def run(steps: int) -> float:
        rows = actions.take(steps)

        async def body() -> None:
            gather = asyncio.gather
            for a in rows:
                await gather(*[env.step(x) for env, x in zip(envs, a, strict=True)])

        async def before() -> None:
            await asyncio.gather(*[env.reset(seed=i) for i, env in enumerate(envs)])

        return runner.run(timed_async(body, before))

    return Candidate(f"bare asyncio.gather ({loop})", run, runner.close)


def build_sb3_candidates(case: Case, actions: Actions) -> list[Candidate]:
    """SB3's ``DummyVecEnv`` and the adapter, stepped as SB3's algorithms step them."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from aiovec.compat.sb3 import make_sb3_env

    fns = [case.aiovec_env_fn] * case.num_envs
    venvs: dict[str, Any] = {}
    try:
        if case.backend == "inline":
            venvs[SB3_BASELINE] = DummyVecEnv(fns)
        else:
            venvs[SB3_SUBPROC] = SubprocVecEnv(fns)
        venvs[f"aiovec make_sb3_env ({case.backend})"] = make_sb3_env(fns, backend=case.backend)
    except BaseException:
        for venv in venvs.values():
            venv.close()
        raise
    return [stepping_candidate(name, v, actions, v.reset) for name, v in venvs.items()]


def build_candidates(case: Case, actions: Actions) -> list[Candidate]:
    loops = loop_factories()
    cands = [baseline_candidate(case, actions)]
    cands += [await_candidate(case, actions, name, f) for name, f in loops.items()]
    cands.append(blocking_candidate(case, actions))
    if case.gather_env is not None:
        cands += [gather_candidate(case, actions, name, f) for name, f in loops.items()]
    return cands


# ---------------------------------------------------------------- running


def calibrate(baseline: Candidate, target_s: float) -> int:
    """Steps for which the baseline takes about ``target_s`` (the others take longer)."""
    steps = 16
    while True:
        elapsed = min(baseline.run(steps) for _ in range(2))
        if elapsed >= 0.01 or steps >= 1 << 20:
            return max(16, math.ceil(steps * target_s / elapsed))
        steps *= 4


def run_case(case: Case, args: argparse.Namespace, *, sb3: bool = False) -> list[dict[str, Any]]:
    probe = gymnasium.vector.SyncVectorEnv([case.baseline_env_fn] * case.num_envs)
    actions = Actions(probe.action_space)
    probe.close()
    cands = build_sb3_candidates(case, actions) if sb3 else build_candidates(case, actions)
    try:
        if args.quick:
            steps = max(20, min(300, 16384 // case.num_envs))
        else:
            steps = calibrate(cands[0], args.target_ms / 1000)
        run_interleaved(cands, steps=steps, reps=args.reps, warmup_steps=max(5, steps // 10))
    finally:
        for cand in cands:
            cand.close()
    base = cands[0]
    rows = []
    for cand in cands[1:]:
        front = "await" if "await" in cand.name else "blocking" if "blocking" in cand.name else ""
        front = ("sb3" if case.backend == "inline" else f"sb3 {case.backend}") if sb3 else front
        limit = TARGETS.get((case.env, front, case.num_envs))
        ratio = median_ratio(cand.seconds, base.seconds)
        ratios = [c / b for c, b in zip(cand.seconds, base.seconds, strict=True)]
        rows.append(
            {
                "env": case.env,
                "num_envs": case.num_envs,
                "candidate": cand.name,
                "baseline": base.name,
                "steps": steps,
                "us_per_env_step": per_env_step_us(
                    statistics.median(cand.seconds), steps, case.num_envs
                ),
                "baseline_us_per_env_step": per_env_step_us(
                    statistics.median(base.seconds), steps, case.num_envs
                ),
                "ratio": ratio,
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "target": limit,
                "passed": None if limit is None else ratio <= limit,
                "seconds": cand.seconds,
                "baseline_seconds": base.seconds,
            }
        )
    return rows


# ------------------------------------------------------- fixed cost per call


async def _noop() -> None:
    return None


def runner_candidate(loop: str, factory: Callable[[], asyncio.AbstractEventLoop]) -> Candidate:
    """``asyncio.Runner.run`` of a coroutine that does nothing: sync code entering a loop."""

    def run(calls: int) -> float:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_noop())

            def body() -> None:
                for _ in range(calls):
                    runner.run(_noop())

            return timed_sync(body)

    return Candidate(f"asyncio.Runner().run(noop()) ({loop})", run)


def per_call_candidates() -> list[Candidate]:
    """One call into an event loop from sync code, and one step of each vector env at N=1."""
    cands = [runner_candidate(name, f) for name, f in loop_factories().items()]
    one = Case("TrivialEnv", 1, TrivialEnv, TrivialEnv)
    actions = Actions(gymnasium.spaces.MultiDiscrete([2]))
    steppers = [
        baseline_candidate(one, actions),
        await_candidate(one, actions, "asyncio", asyncio.new_event_loop),
        blocking_candidate(one, actions),
    ]
    for cand in steppers:
        cand.name = f"{cand.name}: step(), N = 1"
    return cands + steppers


def run_per_call(args: argparse.Namespace) -> list[dict[str, Any]]:
    calls = 500 if args.quick else 4000
    cands = per_call_candidates()
    try:
        run_interleaved(cands, steps=calls, reps=args.reps, warmup_steps=50)
    finally:
        for cand in cands:
            cand.close()
    return [
        {
            "what": c.name,
            "calls": calls,
            "us_per_call": statistics.median(c.seconds) / calls * 1e6,
            "seconds": c.seconds,
        }
        for c in cands
    ]


# ---------------------------------------------------------------- report


def cases() -> list[Case]:
    out = [Case("TrivialEnv", n, TrivialEnv, TrivialEnv) for n in (8, 64, 512)]
    out += [
        Case("AsyncTrivialEnv", n, AsyncTrivialEnv, TrivialEnv, gather_env=AsyncTrivialEnv)
        for n in (8, 64, 512)
    ]
    out += [
        Case("YieldingTrivialEnv", n, YieldingTrivialEnv, TrivialEnv, YieldingTrivialEnv)
        for n in (64, 512)
    ]
    out += [Case("CartPole-v1", n, make_cartpole, make_cartpole) for n in (8, 64)]
    return out


def sb3_cases() -> list[Case]:
    """The SB3 adapter's cases (empty without Stable-Baselines3)."""
    if importlib.util.find_spec("stable_baselines3") is None:
        return []
    return [
        Case("CartPole-v1", 8, make_cartpole, make_cartpole),
        Case("HeldInfoEnv", 8, HeldInfoEnv, HeldInfoEnv),
        Case("CartPole-v1", 8, make_cartpole, make_cartpole, backend="process"),
    ]


def print_report(
    info: dict[str, str], rows: Sequence[dict[str, Any]], per_call: Sequence[dict[str, Any]]
) -> None:
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    tables = [
        (
            "aiovec front end (loop)",
            "SyncVectorEnv",
            [r for r in rows if r["baseline"] == BASELINE],
        ),
        ("SB3 adapter", "DummyVecEnv", [r for r in rows if r["baseline"] == SB3_BASELINE]),
        ("SB3 adapter", "SubprocVecEnv", [r for r in rows if r["baseline"] == SB3_SUBPROC]),
    ]
    for what, baseline, table in tables:
        if table:
            print()
            print_rows(what, baseline, table)
    if per_call:
        print()
        print("| fixed cost of one call (N = 1) | us per call |")
        print("|---|---:|")
        for p in per_call:
            print(f"| {p['what']} | {p['us_per_call']:.1f} |")
    missed = [r for r in rows if r["passed"] is False]
    print()
    print(f"targets: {sum(r['passed'] is True for r in rows)} PASS, {len(missed)} MISS")


def print_rows(what: str, baseline: str, rows: Sequence[dict[str, Any]]) -> None:
    print(
        f"| env | N | {what} | aiovec us/env-step "
        f"| {baseline} us/env-step | ratio (min-max) | target |"
    )
    print("|---|---:|---|---:|---:|---|---|")
    for r in rows:
        target = ""
        if r["target"] is not None:
            target = f"<= {r['target']:.2f} {'PASS' if r['passed'] else 'MISS'}"
        print(
            f"| {r['env']} | {r['num_envs']} | {r['candidate']} | {r['us_per_env_step']:.2f} "
            f"| {r['baseline_us_per_env_step']:.2f} "
            f"| {r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {target} |"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, 2 reps (CI smoke test)")
    parser.add_argument("--reps", type=int, help="repetitions (default 11, --quick 2)")
    parser.add_argument("--json", metavar="FILE", help="also write all timings as JSON")
    parser.add_argument(
        "--only",
        choices=("gymnasium", "sb3"),
        help="only the cases against gymnasium (with the per-call costs), or only the SB3 ones",
    )
    parser.add_argument(
        "--target-ms",
        type=float,
        default=60.0,
        help="length of the baseline's timing per repetition (full run; default 60)",
    )
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 11
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A script started in the background by a non-interactive shell inherits SIGINT
    # ignored, and asyncio.Runner.run then skips its Ctrl-C handling (~40 us a call):
    # measure what a script run from a terminal pays.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.perf_counter()
    info = machine_info()
    rows: list[dict[str, Any]] = []
    per_call: list[dict[str, Any]] = []
    if args.only != "sb3":
        for case in cases():
            rows += run_case(case, args)
            print(f"  measured {case.env} N={case.num_envs}", file=sys.stderr, flush=True)
        per_call = run_per_call(args)
    if args.only != "gymnasium":
        for case in sb3_cases():
            rows += run_case(case, args, sb3=True)
            print(f"  measured SB3 {case.env} N={case.num_envs}", file=sys.stderr, flush=True)
    print_report(info, rows, per_call)
    elapsed = time.perf_counter() - started
    print(f"({args.reps} repetitions, {elapsed:.0f} s in all)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "machine": info,
                    "argv": sys.argv,
                    "reps": args.reps,
                    "quick": args.quick,
                    "rows": rows,
                    "per_call": per_call,
                    "elapsed_s": elapsed,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
