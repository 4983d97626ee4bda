"""How many of aiovec's Python calls one lock-step ``step()`` makes, and in which files.

Run from the repository root::

    python benchmarks/calls.py                  # inline (8 TrivialEnv) and process (64 CartPole)
    python benchmarks/calls.py process --each   # also each function's calls per step

Each case builds a ``BlockingVectorEnv``, resets it, takes 20 untimed steps,
then counts with ``sys.setprofile`` the Python calls into aiovec's own modules
(``aiovec/``, ``aiovec/testing.py`` left out: it holds the fake envs) over 50
steps, and reports the mean per step and per file.  Cases: ``inline``, 8
``TrivialEnv``; ``process``, 64 ``CartPole-v1`` on 2 workers (issue 34 counts
this one: at most 25 calls).  Calls made in C (numpy, the envs) and by the
worker processes are not counted: this is the parent's Python walk.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium

import aiovec
from aiovec.testing import TrivialEnv

ROOT = os.path.dirname(aiovec.__file__)
WARMUP, STEPS = 20, 50


def _cartpole() -> Any:
    return gymnasium.make("CartPole-v1")


def build(case: str) -> aiovec.BlockingVectorEnv:
    """The vector env of ``case``."""
    if case == "inline":
        return aiovec.BlockingVectorEnv([TrivialEnv] * 8)
    return aiovec.BlockingVectorEnv([_cartpole] * 64, backend="process", num_workers=2)


def count(venv: aiovec.BlockingVectorEnv) -> collections.Counter[tuple[str, str]]:
    """aiovec's calls over `STEPS` lock-step steps, by (file, function)."""
    venv.reset(seed=0)
    venv.action_space.seed(0)
    action = venv.action_space.sample()
    for _ in range(WARMUP):
        venv.step(action)
    calls: collections.Counter[tuple[str, str]] = collections.Counter()
    testing = os.path.join(ROOT, "testing.py")

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(ROOT) and name != testing:
                calls[(os.path.relpath(name, ROOT), frame.f_code.co_name)] += 1

    sys.setprofile(profile)
    try:
        for _ in range(STEPS):
            venv.step(action)
    finally:
        sys.setprofile(None)
    return calls


def report(case: str, calls: collections.Counter[tuple[str, str]], each: bool) -> None:
    """Calls per step, in all and by file (and by function with ``each``)."""
    files: collections.Counter[str] = collections.Counter()
    for (name, _), n in calls.items():
        files[name] += n
    total = sum(calls.values()) / STEPS
    print(f"{case}: {total:.1f} aiovec calls per lock-step step, in {len(files)} files")
    for name, n in files.most_common():
        print(f"  {n / STEPS:5.1f}  {name}")
    if each:
        for (name, function), n in calls.most_common():
            print(f"    {n / STEPS:5.1f}  {name}:{function}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="inline, process (default: both)")
    parser.add_argument("--each", action="store_true", help="also each function's calls")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases) - {"inline", "process"})
    if unknown:
        parser.error(f"unknown case(s) {unknown}: choose from inline, process")
    for case in args.cases or ("inline", "process"):
        venv = build(case)
        try:
            report(case, count(venv), args.each)
        finally:
            venv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
