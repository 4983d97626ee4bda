"""How many of aiovec's Python calls one step makes, by route, and in which files.

Run from the repository root::

    python benchmarks/calls.py                  # inline (8 TrivialEnv) and process (64 CartPole)
    python benchmarks/calls.py process --each   # also each function's calls per step
    python benchmarks/calls.py --route step     # only the blocking lock-step step
    python benchmarks/calls.py --quick          # CI smoke test: 10 steps counted

Each case builds its vector env, resets it, takes 20 untimed steps, then counts
with ``sys.setprofile`` the Python calls into aiovec's own modules (``aiovec/``,
``aiovec/testing.py`` left out: it holds the fake envs) over 50 steps, and
reports the mean per step and per file.  Cases: ``inline``, 8 ``TrivialEnv``;
``process``, 64 ``CartPole-v1`` on 2 workers (issue 39 counts this one: at
most 25 calls).  Routes, each a way to step every env once:

``step``
    ``BlockingVectorEnv.step``;
``await``
    ``AsyncioVectorEnv.step``, awaited in a running loop (the loop's own
    callbacks into aiovec count too);
``split``
    ``BlockingVectorEnv.step_async`` then ``step_wait``;
``collector``
    a round of ``aiovec.Collector`` over the blocking front end (a policy
    returning zeros): one ``recv()``, the rows sorted into segments, the policy
    called and its actions sent; counted per ``recv()``.

Calls made in C (numpy, the envs) and by the worker processes are not counted:
this is the parent's Python walk.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium
import numpy as np

import aiovec
from aiovec.testing import TrivialEnv

ROOT = os.path.dirname(aiovec.__file__)
TESTING = os.path.join(ROOT, "testing.py")
WARMUP, STEPS = 20, 50
CASES = ("inline", "process")
ROUTES = ("step", "await", "split", "collector")

Calls = collections.Counter[tuple[str, str]]


def _cartpole() -> Any:
    return gymnasium.make("CartPole-v1")


def _arguments(case: str) -> tuple[list[Callable[[], Any]], dict[str, Any]]:
    """The factories and options of ``case``."""
    if case == "inline":
        return [TrivialEnv] * 8, {}
    return [_cartpole] * 64, {"backend": "process", "num_workers": 2}


def build(case: str) -> aiovec.BlockingVectorEnv:
    """The blocking vector env of ``case``."""
    fns, options = _arguments(case)
    return aiovec.BlockingVectorEnv(fns, **options)


@contextlib.contextmanager
def counting(calls: Calls) -> Iterator[None]:
    """Count aiovec's calls made in this thread during the block, by (file, function)."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(ROOT) and name != TESTING:
                calls[(os.path.relpath(name, ROOT), frame.f_code.co_name)] += 1

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


def count(venv: aiovec.BlockingVectorEnv, steps: int = STEPS, route: str = "step") -> Calls:
    """aiovec's calls over ``steps`` lock-step steps of ``venv`` along ``route``."""
    venv.reset(seed=0)
    venv.action_space.seed(0)
    action = venv.action_space.sample()
    if route == "split":

        def step() -> Any:
            venv.step_async(action)
            return venv.step_wait()

    else:

        def step() -> Any:
            return venv.step(action)

    for _ in range(WARMUP):
        step()
    calls: Calls = collections.Counter()
    with counting(calls):
        for _ in range(steps):
            step()
    return calls


def count_await(case: str, steps: int = STEPS) -> Calls:
    """aiovec's calls over ``steps`` awaited steps of an ``AsyncioVectorEnv`` of ``case``."""
    fns, options = _arguments(case)

    async def main() -> Calls:
        async with aiovec.AsyncioVectorEnv(fns, **options) as venv:
            await venv.reset(seed=0)
            venv.action_space.seed(0)
            action = venv.action_space.sample()
            for _ in range(WARMUP):
                await venv.step(action)
            calls: Calls = collections.Counter()
            with counting(calls):
                for _ in range(steps):
                    await venv.step(action)
            return calls

    return asyncio.run(main())


def count_collector(venv: aiovec.BlockingVectorEnv, rounds: int = STEPS) -> tuple[Calls, int]:
    """aiovec's calls over about ``rounds`` rounds of a `aiovec.Collector`; the rounds."""
    zeros = np.zeros(venv.num_envs, np.int64)

    def policy(obs: Any, env_ids: Any) -> Any:
        return zeros[: len(env_ids)]

    collector = aiovec.Collector(venv, policy, segment_length=8, batch_size=venv.num_envs)
    calls: Calls = collections.Counter()
    batches = iter(collector)
    try:
        next(batches)  # warm up: the start's resets and a batch
        with counting(calls):
            while calls[("_vector.py", "recv")] < rounds:
                next(batches)
    finally:
        batches.close()
    return calls, calls[("_vector.py", "recv")]


def report(case: str, calls: Calls, each: bool, steps: int = STEPS, route: str = "step") -> None:
    """Calls per step, in all and by file (and by function with ``each``)."""
    files: collections.Counter[str] = collections.Counter()
    for (name, _), n in calls.items():
        files[name] += n
    total = sum(calls.values()) / steps
    what = "round" if route == "collector" else "step"
    print(f"{case}, {route}: {total:.1f} aiovec calls per {what}, in {len(files)} files")
    for name, n in files.most_common():
        print(f"  {n / steps:5.1f}  {name}")
    if each:
        for (name, function), n in calls.most_common():
            print(f"    {n / steps:5.1f}  {name}:{function}")


def measure(case: str, route: str, steps: int) -> tuple[Calls, int]:
    """The calls of ``steps`` steps (or rounds) of ``case`` along ``route``, and the count."""
    if route == "await":
        return count_await(case, steps), steps
    venv = build(case)
    try:
        if route == "collector":
            return count_collector(venv, steps)
        return count(venv, steps, route), steps
    finally:
        venv.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="inline, process (default: both)")
    parser.add_argument(
        "--route", action="append", choices=ROUTES, help="the routes to count (default: all)"
    )
    parser.add_argument("--each", action="store_true", help="also each function's calls")
    parser.add_argument("--quick", action="store_true", help="count 10 steps (CI smoke test)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}: choose from inline, process")
    for case in args.cases or CASES:
        for route in args.route or ROUTES:
            calls, steps = measure(case, route, 10 if args.quick else STEPS)
            report(case, calls, args.each, steps, route)
    return 0


if __name__ == "__main__":
    sys.exit(main())
