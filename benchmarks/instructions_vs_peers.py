"""Instructions per step against the peers, counted by callgrind (load does not move them).

Run from the repository root (needs ``valgrind``; each case takes a minute or more)::

    python benchmarks/instructions_vs_peers.py                  # every case
    python benchmarks/instructions_vs_peers.py blocking sync    # some cases
    PYTHONPATH=/tmp/before python benchmarks/instructions_vs_peers.py blocking  # another aiovec/

Each case runs in a child process under ``valgrind --tool=callgrind`` twice, taking
``FEW`` and then ``MANY`` steps after the same warm-up; the difference of the two
counts over ``MANY - FEW`` is the instructions of one step (start-up, imports and
the warm-up cancel out).  ``PYTHONHASHSEED=0`` and one BLAS thread keep the two
runs alike.  Cases, each over 8 envs:

``sync`` / ``blocking``
    ``TrivialEnv`` through gymnasium's ``SyncVectorEnv`` / aiovec's
    ``BlockingVectorEnv`` (inline);
``dummy`` / ``sb3``
    ``CartPole-v1`` through SB3's ``DummyVecEnv`` / ``aiovec.compat.sb3`` (inline),
    stepped with pre-sampled random actions, as ``overhead.py --only sb3`` does.

Instructions are not time (a cache miss or a system call counts as one), but two
trees compared this way differ by what their code does, whatever else runs on the
machine.  Under valgrind a step takes ~50x longer, so the inline backend's check
for an env holding the loop (judged by the wall clock) is turned off in the child:
it would time the envs one by one after the first stretch valgrind made slow.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

CASES = ("sync", "blocking", "dummy", "sb3")
FEW, MANY, WARMUP = 100, 600, 50

CHILD = """
import sys
import gymnasium, numpy as np
case, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import aiovec.backends.inline as inline
inline.slow_slice_limit = lambda: float("inf")  # wall-clock judged: see the module
from aiovec.testing import TrivialEnv
def cartpole():
    return gymnasium.make("CartPole-v1")
if case == "sync":
    venv = gymnasium.vector.SyncVectorEnv([TrivialEnv] * 8)
elif case == "blocking":
    import aiovec
    venv = aiovec.BlockingVectorEnv([TrivialEnv] * 8)
elif case == "dummy":
    from stable_baselines3.common.vec_env import DummyVecEnv
    venv = DummyVecEnv([cartpole] * 8)
else:
    from aiovec.compat.sb3 import make_sb3_env
    venv = make_sb3_env([cartpole] * 8)
if case in ("sync", "blocking"):
    venv.reset(seed=0)
else:
    venv.reset()
rng = np.random.default_rng(0)
actions = [rng.integers(0, 2, 8) for _ in range(1000)]
for k in range(warmup + steps):
    venv.step(actions[k % 1000])
venv.close()
"""


def instructions(case: str, steps: int) -> int:
    """Instructions of a child that takes ``steps`` steps of ``case`` (after the warm-up)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-P",  # no current directory on sys.path: PYTHONPATH's aiovec, else the installed one
        "-c",
        CHILD,
        case,
        str(steps),
        str(WARMUP),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    match = re.search(r"Collected : (\d+)", done.stderr)
    if match is None:
        raise RuntimeError(f"callgrind said no count for {case}:\n{done.stderr[-2000:]}")
    return int(match.group(1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help=f"any of {', '.join(CASES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="sync, 10 and 60 steps (CI smoke)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")
    if shutil.which("valgrind") is None:
        print(
            "instructions_vs_peers.py needs valgrind (callgrind): not installed, nothing measured"
        )
        return 0
    few, many = (10, 60) if args.quick else (FEW, MANY)
    per_step = {}
    for case in ["sync"] if args.quick else args.cases or CASES:
        per_step[case] = (instructions(case, many) - instructions(case, few)) / (many - few)
        print(f"{case}: {per_step[case]:,.0f} instructions per step", flush=True)
    for mine, theirs in (("blocking", "sync"), ("sb3", "dummy")):
        if mine in per_step and theirs in per_step:
            print(f"{mine} / {theirs}: {per_step[mine] / per_step[theirs]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
