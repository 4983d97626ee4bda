"""How long ``backend="process"`` takes to start its workers from a script that imported torch.

Run from the repository root::

    python benchmarks/startup.py                      # forkserver, 7 repetitions
    python benchmarks/startup.py --method spawn --reps 5
    python benchmarks/startup.py --against ../other-checkout   # the same, from another aiovec

Each timing is a fresh Python process running a script that (in one case)
imports torch first, then times the construction of a
``BlockingVectorEnv([TrivialEnv] * 2, backend="process", num_workers=2)``
(the workers started, their envs built and reported), and closes it.  Under
``forkserver`` or ``spawn`` a worker that imported the main module anew would
import torch again: issue 38 measured 1.26 s instead of 0.30 s.  The cases (with
and without torch, and each ``--against`` checkout) run in rotating order in
every repetition; reported: the median and range of each, and the difference
with torch minus without, against the target (at most 0.5 s more).  Timings
never make the script fail; without torch the torch case is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence

TARGET_S = 0.5  # issue 38: at most this much more with torch imported

SCRIPT = """
import time
{imports}
import aiovec
from aiovec.testing import TrivialEnv


def main():
    started = time.perf_counter()
    venv = aiovec.BlockingVectorEnv([TrivialEnv] * 2, backend="process", num_workers=2)
    elapsed = time.perf_counter() - started
    venv.close()
    print(elapsed)


if __name__ == "__main__":  # (guarded: a checkout whose workers import it anew runs too)
    main()
"""


def once(torch: bool, method: str, path: str | None) -> float:
    """Seconds to start two workers, in a fresh process (``path``: aiovec from there)."""
    env = {**os.environ, "AIOVEC_START_METHOD": method}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (path, env.get("PYTHONPATH"))))
    code = SCRIPT.format(imports="import torch" if torch else "")
    with tempfile.TemporaryDirectory() as folder:  # a script file: `-c` has no main module
        script = os.path.join(folder, "train.py")  # for a worker to import anew
        with open(script, "w", encoding="utf-8") as file:
            file.write(code)
        done = subprocess.run(
            [sys.executable, script],
            env=env,
            cwd=folder,  # (not a checkout: its aiovec would come first in the workers)
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode:
        raise RuntimeError(f"the timed script failed ({path or 'this checkout'}):\n{done.stderr}")
    return float(done.stdout.split()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="2 repetitions (CI smoke)")
    parser.add_argument("--method", default="forkserver", choices=("forkserver", "spawn"))
    parser.add_argument(
        "--against", action="append", default=[], help="another checkout's root (repeatable)"
    )
    args = parser.parse_args(argv)
    has_torch = importlib.util.find_spec("torch") is not None
    if not has_torch:
        print("torch is not installed: the torch case is skipped", file=sys.stderr)
    sources: list[str | None] = [None, *args.against]
    kinds = (False, True) if has_torch else (False,)
    cases = [(src, torch) for src in sources for torch in kinds]
    times: dict[tuple[str | None, bool], list[float]] = {case: [] for case in cases}
    if args.quick:
        args.reps = 2
    for rep in range(args.reps):
        order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
        for src, torch in order:
            times[src, torch].append(once(torch, args.method, src))
        print(f"  repetition {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
    print(
        f"Starting 2 workers (BlockingVectorEnv of 2 TrivialEnv, num_workers=2), "
        f"start method {args.method}, {args.reps} repetitions, s: median (min-max)"
    )
    print("| aiovec | plain script | script that imported torch | torch - plain | target |")
    print("|---|---:|---:|---:|---|")
    for src in sources:
        plain = times[src, False]
        row = [src or "this checkout", _spread(plain)]
        if has_torch:
            heavy = times[src, True]
            more = statistics.median(heavy) - statistics.median(plain)
            verdict = "PASS" if more <= TARGET_S else "MISS"
            row += [_spread(heavy), f"{more:+.2f}", f"<= {TARGET_S} {verdict}"]
        else:
            row += ["-", "-", "-"]
        print("| " + " | ".join(row) + " |")
    return 0


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    raise SystemExit(main())
