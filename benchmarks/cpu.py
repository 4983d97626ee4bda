"""CPU-bound envs on every core: ``backend="process"`` against gymnasium's vector envs.

Run from the repository root::

    python benchmarks/cpu.py            # full run, a few minutes
    python benchmarks/cpu.py --quick    # CI smoke test
    python benchmarks/cpu.py --reps 7 --json cpu.json
    python benchmarks/cpu.py --workers 1,2,4,8,16   # also: throughput against W

Cases (W = 2 workers for aiovec): CartPole-v1 with N = 32 and N = 256, and
``BusyCartPole`` (CartPole plus ~100 us of pure Python per step) with N = 32.
Candidates, interleaved in every repetition: gymnasium ``SyncVectorEnv`` (the
baseline), gymnasium ``AsyncVectorEnv`` (one process per env; N = 32 only),
``aiovec.BlockingVectorEnv(backend="process", num_workers=2)`` (on a 2-CPU
machine its two workers are pinned, one per CPU: ``cpus="auto"``), and the
same with ``backend_options={"cpus": None}``, which lets the OS place the
workers.  Reported:
thousands of env-steps per second (medians of the repetitions), the speed-up
over the baseline (median of per-repetition ratios) with PASS/MISS against the
targets of issue 4, the round trip of one trivial step with N = W = 2, and the
memory of each worker.  Timings never make the script fail.

Where the time goes (Linux: it reads ``/proc``), for each case with W = 2: wall
time per vector step; the parent's CPU per step; each worker's CPU per step
against the same envs stepped bare in this process (the difference is what a
worker spends beyond its envs: reading the request, the flows, writing the
results, and being woken); the same two worker groups (aiovec's worker code)
driven by a minimal parent that only pokes them and copies their rows (so the
gap to aiovec's wall time is the parent's Python); and the floor of any
blocking design, a bare pipe round trip to two sleeping processes with no
Python work.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import select
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
from _common import Candidate, machine_info, median_ratio, run_interleaved, timed_sync
from gymnasium.envs.classic_control import CartPoleEnv

import aiovec
from aiovec._core.layout import StepLayout
from aiovec.backends import _grouped, _worker
from aiovec.testing import TrivialEnv

SYNC, ASYNC, PROCESS = "gymnasium SyncVectorEnv", "gymnasium AsyncVectorEnv", "aiovec process W=2"
UNPINNED = "aiovec process W=2, cpus=None"  # the OS places the workers
# (env, N, candidate) -> minimum speed-up over SyncVectorEnv (AsyncVectorEnv: over it)
TARGETS = {
    ("CartPole-v1", 32, SYNC): 1.3,
    ("CartPole-v1", 32, ASYNC): 5.0,
    ("CartPole-v1", 256, SYNC): 1.7,
    ("BusyCartPole", 32, SYNC): 1.75,
}


class BusyCartPole(CartPoleEnv):
    """CartPole that also spends ~100 us of pure-Python work in every step."""

    loops = 1000  # calibrated in main() so that one step costs about 100 us more

    def step(self, action: Any) -> Any:
        total = 0
        for k in range(self.loops):
            total += k
        return super().step(action)


def make_cartpole() -> Any:
    return gymnasium.make("CartPole-v1")


def make_busy() -> Any:
    return gymnasium.wrappers.TimeLimit(BusyCartPole(), 500)


@dataclass
class Case:
    env: str
    num_envs: int
    make: Callable[[], Any]
    with_async: bool


def _stepper(venv: Any, num_envs: int, close: Callable[[], object]) -> Candidate:
    actions = np.random.default_rng(0).integers(0, 2, size=(64, num_envs))

    def run(steps: int) -> float:
        def body() -> None:
            for t in range(steps):
                venv.step(actions[t % 64])

        return timed_sync(body, lambda: venv.reset(seed=0))

    return Candidate("", run, close)


def candidates(case: Case) -> list[Candidate]:
    fns = [case.make] * case.num_envs
    made: list[tuple[str, Any]] = [(SYNC, gymnasium.vector.SyncVectorEnv(fns))]
    if case.with_async:
        made.append((ASYNC, gymnasium.vector.AsyncVectorEnv(fns)))
    made.append((PROCESS, aiovec.BlockingVectorEnv(fns, backend="process", num_workers=2)))
    unpinned = aiovec.BlockingVectorEnv(
        fns, backend="process", num_workers=2, backend_options={"cpus": None}
    )
    made.append((UNPINNED, unpinned))
    out = []
    for name, venv in made:
        cand = _stepper(venv, case.num_envs, venv.close)
        cand.name = name
        out.append(cand)
    return out


def run_case(case: Case, args: argparse.Namespace) -> list[dict[str, Any]]:
    cands = candidates(case)
    steps = args.steps * 32 // case.num_envs
    try:
        run_interleaved(cands, steps=steps, reps=args.reps, warmup_steps=max(5, steps // 10))
    finally:
        for cand in cands:
            cand.close()
    ours = {c.name: c for c in cands if c.name in (PROCESS, UNPINNED)}
    rows = []
    for cand in cands:
        rate = steps * case.num_envs / statistics.median(cand.seconds) / 1000
        row: dict[str, Any] = {
            "env": case.env,
            "num_envs": case.num_envs,
            "candidate": cand.name,
            "steps": steps,
            "k_env_steps_per_s": rate,
            "seconds": cand.seconds,
        }
        if cand.name not in ours:
            target = TARGETS.get((case.env, case.num_envs, cand.name))
            row["target"] = target
            for name, key in ((PROCESS, "speedup"), (UNPINNED, "speedup_unpinned")):
                if name in ours:
                    row[key] = median_ratio(cand.seconds, ours[name].seconds)
                    passed = None if target is None else row[key] >= target
                    row[key.replace("speedup", "passed")] = passed
        rows.append(row)
    return rows


def round_trip(args: argparse.Namespace) -> dict[str, Any]:
    """One step of N = W = 2 trivial envs: the fixed cost of a round trip."""
    calls = 200 if args.quick else 2000
    fns = [TrivialEnv] * 2
    cands = []
    for name, venv in (
        (SYNC, gymnasium.vector.SyncVectorEnv(fns)),
        (PROCESS.replace("W=2", "N=W=2"), aiovec.BlockingVectorEnv(fns, backend="process")),
    ):
        cand = _stepper(venv, 2, venv.close)
        cand.name = name
        cands.append(cand)
    try:
        run_interleaved(cands, steps=calls, reps=args.reps, warmup_steps=50)
    finally:
        for cand in cands:
            cand.close()
    return {c.name: statistics.median(c.seconds) / calls * 1e6 for c in cands}


def scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Throughput of the process backend against W, on CartPole and on BusyCartPole."""
    rows = []
    for env, make, num_envs in (
        ("CartPole-v1", make_cartpole, 256),
        ("BusyCartPole", make_busy, max(32, 4 * max(args.workers))),
    ):
        fns = [make] * num_envs
        made: list[tuple[str, Any]] = [(SYNC, gymnasium.vector.SyncVectorEnv(fns))]
        made += [
            (
                f"aiovec process W={w}",
                aiovec.BlockingVectorEnv(fns, backend="process", num_workers=w),
            )
            for w in args.workers
        ]
        cands = []
        for name, venv in made:
            cand = _stepper(venv, num_envs, venv.close)
            cand.name = name
            cands.append(cand)
        steps = max(4, args.steps * 32 // num_envs)
        try:
            run_interleaved(cands, steps=steps, reps=args.reps, warmup_steps=max(2, steps // 10))
        finally:
            for cand in cands:
                cand.close()
        base = cands[0]
        for cand in cands:
            rows.append(
                {
                    "env": env,
                    "num_envs": num_envs,
                    "candidate": cand.name,
                    "k_env_steps_per_s": steps * num_envs / statistics.median(cand.seconds) / 1e3,
                    "over_sync": median_ratio(base.seconds, cand.seconds),
                }
            )
    return rows


def breakdown(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    """Wall, parent CPU and worker CPU per vector step (W = 2), and the bare envs' CPU."""
    steps = max(20, args.steps * 32 // case.num_envs)
    actions = np.random.default_rng(0).integers(0, 2, size=(64, case.num_envs))
    venv = aiovec.BlockingVectorEnv([case.make] * case.num_envs, backend="process", num_workers=2)
    try:
        venv.reset(seed=0)
        for t in range(max(5, steps // 10)):
            venv.step(actions[t % 64])
        pids = venv.vector_env._backend.pids  # type: ignore[union-attr]
        workers_before = [_cpu_seconds(pid) for pid in pids]
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        for t in range(steps):
            venv.step(actions[t % 64])
        wall = time.perf_counter() - wall_before
        parent = time.process_time() - cpu_before
        workers = [
            _cpu_seconds(pid) - before for pid, before in zip(pids, workers_before, strict=True)
        ]
    finally:
        venv.close()
    group = [case.make() for _ in range(case.num_envs // 2)]
    try:
        for j, env in enumerate(group):
            env.reset(seed=j)
        cpu_before = time.process_time()
        for t in range(steps):
            for j, env in enumerate(group):
                _, _, terminated, truncated, _ = env.step(int(actions[t % 64][j]))
                if terminated or truncated:
                    env.reset()
        bare = time.process_time() - cpu_before
    finally:
        for env in group:
            env.close()
    per_step = 1e6 / steps
    return {
        "env": case.env,
        "num_envs": case.num_envs,
        "minimal_parent_us": minimal_parent(case, steps),
        "wall_us": wall * per_step,
        "parent_cpu_us": parent * per_step,
        "worker_cpu_us": statistics.mean(workers) * per_step,
        "bare_group_cpu_us": bare * per_step,
    }


def _group_server(
    requests: int, replies: int, buffer: Any, layout: Any, make: Any, first: int, count: int
) -> None:
    group = _worker.Group([make] * count, first)
    group.use_buffer(layout, buffer, first)
    for j, env in enumerate(group.envs):
        env.reset(seed=first + j)
    while os.read(requests, 1):
        group.step(range(count), "NextStep", None, None)
        os.write(replies, b"r")


def minimal_parent(case: Case, steps: int) -> float:
    """Wall us per step of the same two worker groups driven by a minimal parent.

    The workers run aiovec's own worker code (``Group.step`` on its rows of a
    shared buffer); the parent only writes the actions and reset flags, pokes
    each worker with a byte, waits for both and copies observations and
    rewards out: no rules, no checks, no event loop.  The gap between this and
    aiovec's wall time is what the parent's Python costs.
    """
    probe = case.make()
    layout = StepLayout.of(probe.observation_space, probe.action_space, case.num_envs)
    probe.close()
    assert layout is not None
    buffer = mmap.mmap(-1, layout.nbytes)  # anonymous and shared: inherited by fork
    arrays = layout.arrays(buffer)
    context = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for group in _grouped.split(case.num_envs, 2):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        args = (req_r, rep_w, buffer, layout, case.make, group.start, len(group))
        procs.append(context.Process(target=_group_server, args=args, daemon=True))
        procs[-1].start()
        os.close(req_r)
        os.close(rep_w)
        pipes.append((req_w, rep_r))
    actions = np.random.default_rng(0).integers(0, 2, size=(64, case.num_envs))

    def step(t: int) -> None:
        arrays.actions[:] = actions[t % 64]
        np.logical_or(arrays.terminations, arrays.truncations, out=arrays.resets)
        for req_w, _ in pipes:
            os.write(req_w, b"s")
        for _, rep_r in reversed(pipes):
            os.read(rep_r, 1)
        arrays.observations.copy()
        arrays.rewards.copy()

    try:
        for t in range(max(5, steps // 10)):
            step(t)
        start = time.perf_counter()
        for t in range(steps):
            step(t)
        return (time.perf_counter() - start) / steps * 1e6
    finally:
        for req_w, _ in pipes:
            os.close(req_w)  # end of file: each server returns
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for _, rep_r in pipes:
            os.close(rep_r)
        # the views in ``arrays`` keep the mapping until they are collected


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _echo(requests: Any, replies: Any) -> None:
    """A bare worker: answers each byte it reads with one byte, until EOF."""
    while os.read(requests.fileno(), 64):
        os.write(replies.fileno(), b"r")


def pipe_floor(calls: int) -> float:
    """Median us of one 1-byte request to each of two sleeping processes and both replies."""
    context = multiprocessing.get_context("spawn")
    pipes = [(context.Pipe(duplex=False), context.Pipe(duplex=False)) for _ in range(2)]
    procs = [
        context.Process(target=_echo, args=(req_r, rep_w), daemon=True)
        for (req_r, _), (_, rep_w) in pipes
    ]
    for proc in procs:
        proc.start()
    poller = select.poll()
    for _, (rep_r, _) in pipes:
        poller.register(rep_r.fileno(), select.POLLIN)
    times = []
    try:
        for _ in range(calls):
            start = time.perf_counter()
            for (_, req_w), _ in pipes:
                os.write(req_w.fileno(), b"q")
            answered = 0
            while answered < 2:
                for fd, _ in poller.poll():
                    os.read(fd, 64)
                    answered += 1
            times.append(time.perf_counter() - start)
    finally:
        for (_, req_w), _ in pipes:
            req_w.close()  # end of file: each worker returns
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for (req_r, _), (rep_r, rep_w) in pipes:
            for conn in (req_r, rep_r, rep_w):
                conn.close()
    return statistics.median(times) * 1e6


def worker_memory() -> list[dict[str, float]]:
    """RSS and PSS (MiB) of each worker of a CartPole N=32, W=2 process backend."""
    venv = aiovec.BlockingVectorEnv([make_cartpole] * 32, backend="process", num_workers=2)
    try:
        venv.reset(seed=0)
        pids = venv.vector_env._backend.pids  # type: ignore[union-attr]
        return [{"pid": pid, **_memory(pid)} for pid in pids]
    finally:
        venv.close()


def _memory(pid: int) -> dict[str, float]:
    out = {}
    for key, path in (("rss_mib", "status"), ("pss_mib", "smaps_rollup")):
        with open(f"/proc/{pid}/{path}", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:" if key == "rss_mib" else "Pss:"):
                    out[key] = int(line.split()[1]) / 1024
                    break
    return out


def calibrate_busy(target_us: float = 100.0) -> int:
    env = BusyCartPole()
    env.reset(seed=0)
    env.loops = 0
    base = _time_steps(env)
    env.loops = 1000
    per_loop = (_time_steps(env) - base) / 1000
    env.close()
    return max(1, round(target_us / per_loop))


def _time_steps(env: BusyCartPole, steps: int = 300) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(0)
        if term or trunc:
            env.reset()
    return (time.perf_counter() - start) / steps * 1e6


def print_report(info: dict[str, str], rows: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print(f"BusyCartPole: {extra['busy_loops']} loop iterations (~100 us) per step")
    print()
    print(
        "| env | N | candidate | k env-steps/s | aiovec speed-up over it "
        "| aiovec with cpus=None: speed-up over it | target |"
    )
    print("|---|---:|---|---:|---:|---:|---|")
    for r in rows:
        cells = []
        for key in ("speedup", "speedup_unpinned"):
            cell = f"{r[key]:.2f}x" if key in r else ""
            passed = r.get(key.replace("speedup", "passed"))
            if passed is not None:
                cell += " PASS" if passed else " MISS"
            cells.append(cell)
        target = "" if r.get("target") is None else f">= {r['target']:.2f}x"
        print(
            f"| {r['env']} | {r['num_envs']} | {r['candidate']} "
            f"| {r['k_env_steps_per_s']:.1f} | {cells[0]} | {cells[1]} | {target} |"
        )
    print()
    print("| one step of 2 trivial envs | us per step |")
    print("|---|---:|")
    for name, us in extra["round_trip_us"].items():
        print(f"| {name} | {us:.1f} |")
    if extra.get("breakdown"):
        print()
        print(
            "| where the time goes (W = 2) | N | wall us/step | parent CPU us/step "
            "| worker CPU us/step | same envs bare, CPU us/step | worker beyond its envs "
            "| same workers, minimal parent: wall us/step |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for b in extra["breakdown"]:
            print(
                f"| {b['env']} | {b['num_envs']} | {b['wall_us']:.0f} | {b['parent_cpu_us']:.0f} "
                f"| {b['worker_cpu_us']:.0f} | {b['bare_group_cpu_us']:.0f} "
                f"| {b['worker_cpu_us'] - b['bare_group_cpu_us']:.0f} "
                f"| {b['minimal_parent_us']:.0f} |"
            )
        print(
            f"floor: a bare pipe round trip to 2 sleeping processes, "
            f"{extra['pipe_floor_us']:.1f} us"
        )
    print()
    for m in extra["worker_memory"]:
        print(f"worker {m['pid']}: RSS {m['rss_mib']:.1f} MiB, PSS {m['pss_mib']:.1f} MiB")
    if extra.get("scaling"):
        print()
        print("| env | N | candidate | k env-steps/s | speed-up over SyncVectorEnv |")
        print("|---|---:|---|---:|---:|")
        for r in extra["scaling"]:
            print(
                f"| {r['env']} | {r['num_envs']} | {r['candidate']} "
                f"| {r['k_env_steps_per_s']:.1f} | {r['over_sync']:.2f}x |"
            )
    for key, name in (("passed", "default"), ("passed_unpinned", "cpus=None")):
        passed = sum(r.get(key) is True for r in rows)
        missed = sum(r.get(key) is False for r in rows)
        if passed or missed:
            print(f"targets, {name} workers: {passed} PASS, {missed} MISS")


def _has_proc() -> bool:
    """Whether per-process CPU times can be read (Linux ``/proc``)."""
    return os.path.exists(f"/proc/{os.getpid()}/stat")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps, 2 reps (CI smoke test)")
    parser.add_argument("--reps", type=int, help="repetitions (default 5, --quick 2)")
    parser.add_argument("--steps", type=int, help="vector steps per timing at N=32")
    parser.add_argument("--json", metavar="FILE", help="also write all timings as JSON")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(w) for w in text.split(",")],
        default=[],
        help="comma-separated worker counts: also measure throughput against W",
    )
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    if args.steps is None:
        # ~0.7 s per timing at N = 32: after each reset the scheduler takes some
        # steps to place the workers (one per core), which 400 steps over-weighted.
        args.steps = 40 if args.quick else 1600
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.perf_counter()
    info = machine_info()
    BusyCartPole.loops = calibrate_busy()
    cases = [
        Case("CartPole-v1", 32, make_cartpole, True),
        Case("CartPole-v1", 256, make_cartpole, False),
        Case("BusyCartPole", 32, make_busy, True),
    ]
    rows: list[dict[str, Any]] = []
    for case in cases:
        rows += run_case(case, args)
        print(f"  measured {case.env} N={case.num_envs}", file=sys.stderr, flush=True)
    extra = {
        "busy_loops": BusyCartPole.loops,
        "round_trip_us": round_trip(args),
        "breakdown": [breakdown(case, args) for case in cases] if _has_proc() else [],
        "pipe_floor_us": pipe_floor(200 if args.quick else 2000),
        "worker_memory": worker_memory(),
        "scaling": scaling(args) if args.workers else [],
    }
    print_report(info, rows, extra)
    elapsed = time.perf_counter() - started
    print(f"({args.reps} repetitions, {elapsed:.0f} s in all)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": info, "argv": sys.argv, "rows": rows, **extra}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
