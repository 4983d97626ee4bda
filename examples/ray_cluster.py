"""CPU-bound envs on a Ray cluster: the same vector env, ``backend="ray"``.

The envs are CartPole plus ~100 us of pure Python per step (a stand-in for a
simulator that costs CPU).  ``AsyncioVectorEnv(..., backend="ray",
num_workers=W)`` puts them in W Ray actors, a contiguous group of envs each,
spread over the cluster's nodes; every step is one remote call per actor.
Results are the same as on any other backend: the script checks them against
gymnasium's ``SyncVectorEnv`` on the first steps, then reports the throughput.

Run it with ``python examples/ray_cluster.py``: without ``--address`` it
starts a small local Ray instance (2 CPUs) and shuts it down at the end; with
``--address ray://head:10001`` or ``--address auto`` it joins your cluster
(aiovec must be installed on every node).  Needs ``pip install "aiovec[ray]"``.
``--quick`` (or ``AIOVEC_EXAMPLES_QUICK=1``, which CI sets) takes fewer steps.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

import aiovec

try:
    import ray
except ImportError:  # the extra is not installed: main() says so
    ray = None


class BusyCartPole(CartPoleEnv):
    """CartPole that spends ~100 us of pure Python in every step."""

    def step(self, action: Any) -> Any:
        total = 0
        for k in range(1500):
            total += k
        return super().step(action)


def make_env() -> Any:
    return gymnasium.wrappers.TimeLimit(BusyCartPole(), 500)


async def main(args: argparse.Namespace) -> None:
    started_here = not ray.is_initialized() and args.address is None
    if started_here:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2)
    elif not ray.is_initialized():
        ray.init(address=args.address)
    try:
        fns = [make_env] * args.num_envs
        oracle = gymnasium.vector.SyncVectorEnv(fns)
        actions = np.random.default_rng(0).integers(0, 2, size=(args.steps, args.num_envs))
        options = {"num_cpus": 1} if args.cpu_per_actor else None
        async with aiovec.AsyncioVectorEnv(
            fns, backend="ray", num_workers=args.workers, backend_options=options
        ) as venv:
            obs, _ = await venv.reset(seed=42)
            assert np.array_equal(obs, oracle.reset(seed=42)[0])
            for t in range(10):  # concurrency never changes results
                got, want = await venv.step(actions[t]), oracle.step(actions[t])
                assert all(np.array_equal(g, w) for g, w in zip(got[:4], want[:4], strict=True))
            start = time.perf_counter()
            for t in range(10, args.steps):
                await venv.step(actions[t])
            seconds = time.perf_counter() - start
            rate = (args.steps - 10) * args.num_envs / seconds
            nodes = sum(node["Alive"] for node in ray.nodes())
            print(
                f"{args.num_envs} envs in {args.workers} Ray actors on a cluster of {nodes} "
                f"node(s): {rate:,.0f} env-steps/s"
            )
        oracle.close()
    finally:
        if started_here:
            ray.shutdown()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="a Ray cluster to join (default: a local one)")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="Ray actors")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--cpu-per-actor", action="store_true", help="reserve 1 CPU per actor")
    parser.add_argument("--quick", action="store_true", help="a few steps only (CI)")
    args = parser.parse_args(argv)
    if args.quick or os.environ.get("AIOVEC_EXAMPLES_QUICK"):
        args.steps = 40
    return args


if __name__ == "__main__":
    if ray is None:
        print('this example needs Ray: pip install "aiovec[ray]"', file=sys.stderr)
        sys.exit(0)
    asyncio.run(main(parse()))
