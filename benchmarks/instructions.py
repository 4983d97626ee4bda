"""Instructions per lock-step ``step()`` (valgrind's callgrind): a cost that load does not move.

Run from the repository root (needs ``valgrind``)::

    python benchmarks/instructions.py                      # this tree
    python benchmarks/instructions.py --tree ../other      # another checkout's aiovec/
    python benchmarks/instructions.py --cases sync8 --steps 200,2000
    python benchmarks/instructions.py --tree /tmp/before   # e.g. `git archive HEAD~3 aiovec`

On a machine shared with other work, timings move by tens of percent from one
run to the next; the instructions a process executes do not.  Each case builds
a ``BlockingVectorEnv`` on the inline backend, resets it, takes one step, then
``N`` steps, under ``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0``, for
two values of ``N``; the difference of the two totals over the difference of
the step counts is the cost of one step, start-up and first calls left out.
Cases: ``sync8`` (8 ``TrivialEnv``: the hot path of sync envs), ``async8`` (8
``AsyncTrivialEnv``, driven eagerly) and ``yield64`` (64 envs whose step
suspends once: the lanes).  Only user-space instructions are counted (no
system call's work), and under valgrind a process runs some 50 times slower,
so anything done once per millisecond of wall time (the loop-hog check's
reference reading, ``aiovec._log.MARK_EVERY``) is counted some 50 times too
often: ``--mark-every 0.05`` stretches that interval as valgrind stretches
time (a tree without it ignores the option).  The loop's ``slow_callback_duration``
and the 1 ms under which a batch of sync envs never looks it up are set out of
reach: under valgrind, on a loaded machine, a step can outlast either, and the
count would depend on the load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = ("sync8", "async8", "yield64")
STEPS = {"sync8": (1000, 10000), "async8": (1000, 10000), "yield64": (100, 1000)}
"""The two step counts of each case (a step of ``yield64`` costs some 17 of the others)."""


def child(case: str, steps: int, mark_every: float | None) -> None:
    """Build the case's vector env and take ``steps`` steps (run under callgrind)."""
    import aiovec  # imported here: from the tree PYTHONPATH names
    from aiovec import _log
    from aiovec.backends import _lanes, inline
    from aiovec.testing import AsyncTrivialEnv, TrivialEnv

    # Under valgrind, on a loaded machine, a batch can outlast the loop's limit (0.1 s)
    # and send the inline backend to timing each env, as for a real hog: a step that
    # holds nothing over the limit is what is counted, so the limit is out of reach.
    asyncio.BaseEventLoop.slow_callback_duration = 3600.0
    inline.MIN_SLOW_SLICE = 3600.0  # (a batch over 1 ms looks the limit up: load-dependent)
    if mark_every is not None:
        for module in (_log, _lanes, inline):
            if hasattr(module, "MARK_EVERY"):
                module.MARK_EVERY = mark_every  # type: ignore[attr-defined]

    class Yielding(AsyncTrivialEnv):
        async def step(self, action: object) -> object:
            await asyncio.sleep(0)
            return await super().step(action)

    env, n = {"sync8": (TrivialEnv, 8), "async8": (AsyncTrivialEnv, 8), "yield64": (Yielding, 64)}[
        case
    ]
    with aiovec.BlockingVectorEnv([env] * n) as venv:
        venv.reset(seed=0)
        actions = venv.action_space.sample()
        venv.step(actions)
        for _ in range(steps):
            venv.step(actions)


def instructions(tree: Path, case: str, steps: int, mark_every: float | None) -> int:
    """Instructions of one child run (callgrind's total)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree)}
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/out",
                sys.executable,
                __file__,
                "--child",
                case,
                str(steps),
                *(["--mark-every", str(mark_every)] if mark_every is not None else []),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return int(re.findall(r"Collected : (\d+)", out.stderr)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).parent.parent)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", help="two step counts, FEW,MANY (default: per case)")
    parser.add_argument(
        "--mark-every", type=float, help="seconds between the loop-hog check's reference readings"
    )
    parser.add_argument("--quick", action="store_true", help="sync8, 10 and 60 steps (CI smoke)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.mark_every)
        return
    if shutil.which("valgrind") is None:
        print("instructions.py needs valgrind (callgrind): not installed, nothing measured")
        return
    cases = ["sync8"] if args.quick else args.cases.split(",")
    if not set(cases) <= set(CASES):
        parser.error(f"--cases: expected some of {','.join(CASES)}, got {args.cases!r}")
    steps = (10, 60) if args.quick else _steps(parser, args.steps)
    print(f"instructions per step() of aiovec in {args.tree.resolve()} (callgrind)")
    for case in cases:
        few, many = steps or STEPS[case]
        totals = [instructions(args.tree, case, n, args.mark_every) for n in (few, many)]
        cost = (totals[1] - totals[0]) / (many - few)
        print(f"{case:>8}: {cost:,.0f}", flush=True)


def _steps(parser: argparse.ArgumentParser, text: str | None) -> tuple[int, int] | None:
    """``FEW,MANY`` step counts, ``0 <= FEW < MANY``; ``None`` if not given."""
    if text is None:
        return None
    try:
        few, many = (int(n) for n in text.split(","))
    except ValueError:
        few = many = -1
    if not 0 <= few < many:
        parser.error(f"--steps: expected FEW,MANY with 0 <= FEW < MANY, got {text!r}")
    return few, many


if __name__ == "__main__":
    main()
