"""``backend="ray"`` against ``backend="process"`` on one machine.

Run from the repository root (needs ``pip install "aiovec[ray]"``)::

    python benchmarks/ray_vs_process.py            # a few minutes
    python benchmarks/ray_vs_process.py --quick    # CI smoke test
    python benchmarks/ray_vs_process.py --reps 7 --json ray.json

It starts a local Ray instance (``--cpus`` logical CPUs, a small object store,
no dashboard) and shuts it down at the end.  Cases, W = 2 workers (processes
or Ray actors), candidates interleaved in every repetition:

- **overhead**: one step of N = W = 2 trivial envs (microseconds per vector
  step): the fixed cost of a round trip to the workers;
- **CPU-bound**: CartPole plus ~100 us of pure Python per step, N = 32
  (thousands of env-steps per second);
- **I/O-bound**: async envs that wait 5 ms per step, N = 64 (milliseconds per
  vector step; the envs' own wait is the floor).

Timings never make the script fail; no figure here is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import Candidate, machine_info, run_interleaved, timed_sync
from cpu import make_busy

import aiovec
from aiovec.testing import AsyncTrivialEnv, TrivialEnv

BACKENDS = ("process", "ray")
WAIT = 0.005  # seconds each I/O-bound env waits per step


class WaitingEnv(AsyncTrivialEnv):
    """An async env whose every step waits ``WAIT`` seconds (a remote simulator)."""

    async def step(self, action: Any) -> Any:
        await asyncio.sleep(WAIT)
        return await super().step(action)


def stepper(name: str, make: Callable[[], Any], num_envs: int, backend: str) -> Candidate:
    venv = aiovec.BlockingVectorEnv([make] * num_envs, backend=backend, num_workers=2)
    actions = np.zeros(num_envs, dtype=np.int64)

    def run(steps: int) -> float:
        def body() -> None:
            for _ in range(steps):
                venv.step(actions)

        return timed_sync(body, lambda: venv.reset(seed=0))

    return Candidate(f"{name} {backend}", run, venv.close)


CASES: dict[str, tuple[Callable[[], Any], int, int]] = {
    # name -> (factory, N, vector steps per repetition)
    "overhead": (TrivialEnv, 2, 400),
    "cpu-bound": (make_busy, 32, 40),
    "io-bound": (WaitingEnv, 64, 40),
}


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for case, (make, num_envs, full) in CASES.items():
        steps = max(5, full // 10) if args.quick else full
        cands = [stepper(case, make, num_envs, backend) for backend in BACKENDS]
        try:
            run_interleaved(cands, steps=steps, reps=args.reps, warmup_steps=max(2, steps // 10))
        finally:
            for cand in cands:
                cand.close()
        for backend, cand in zip(BACKENDS, cands, strict=True):
            seconds = statistics.median(cand.seconds)
            rows.append(
                {
                    "case": case,
                    "backend": backend,
                    "num_envs": num_envs,
                    "steps": steps,
                    "us_per_vector_step": seconds / steps * 1e6,
                    "k_env_steps_per_s": steps * num_envs / seconds / 1e3,
                    "seconds": cand.seconds,
                }
            )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case | N | backend | per vector step | thousand env-steps/s |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        per_step = row["us_per_vector_step"]
        shown = f"{per_step:,.0f} us" if per_step < 10_000 else f"{per_step / 1e3:,.1f} ms"
        lines.append(
            f"| {row['case']} | {row['num_envs']} | {row['backend']} W=2 | {shown} | "
            f"{row['k_env_steps_per_s']:,.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test (CI)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps = 1
    try:
        import ray
    except ImportError:
        print('skipped: this benchmark needs Ray (pip install "aiovec[ray]")')
        return 0
    here = os.path.dirname(os.path.abspath(__file__))  # the actors import cpu.py from here
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    ray.init(
        num_cpus=args.cpus,
        include_dashboard=False,
        object_store_memory=200 * 1024**2,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        log_to_driver=False,
    )
    try:
        rows = measure(args)
    finally:
        ray.shutdown()
    print(machine_info())
    print(report(rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine_info(), "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
