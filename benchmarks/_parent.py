"""The parent's CPU per lock-step vector step, against a bare pipe parent (issue 27).

``cpu.py --only parent`` runs it.  For each worker count W:

- aiovec: ``aiovec.BlockingVectorEnv`` over ``PARENT_ENVS`` ``CartPole-v1`` envs
  (``gymnasium.make``), ``backend="process"``, ``num_workers=W``, stepped in
  lock-step with random actions (a few batches drawn from its ``action_space``,
  replayed in turn);
- bare: W processes that each read one byte from a pipe and write one byte back
  (``os.read``/``os.write`` on raw pipes); a round writes one byte to each of the
  W pipes, then reads one byte from each.  No Python work beyond that: the
  floor of any parent that wakes W workers and waits for each.

Both are timed in the same repetitions, in alternating order (`run_interleaved`),
after an untimed warm-up.  Each timing records the parent's CPU
(``time.process_time()``, all its threads) and the wall time over K steps or
rounds.  Reported per W: the parent's CPU per step of each (median, min-max),
the ratio (median of per-repetition ratios) with PASS/MISS against issue 27's
target, and the wall time per step of each, for context.
"""

from __future__ import annotations

import functools
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
from _common import Candidate, median_ratio, run_interleaved

import aiovec

__all__ = ("PARENT_ENVS", "PARENT_TARGET", "parent_cost", "print_parent")

PARENT_ENVS = 64
PARENT_TARGET = 2.5  # issue 27: aiovec's parent CPU per step <= 2.5x the bare parent's
TARGET_WORKERS = frozenset((2, 4, 8, 16))  # the worker counts the target names
DEFAULT_WORKERS = (1, 2, 4, 8, 16)
QUICK_WORKERS = (1, 2)
ACTION_BATCHES = 8  # distinct batches of random actions, replayed in turn
AIOVEC, BARE = "aiovec process", "bare pipe parent"

# A bare worker: echoes each byte of its request pipe on its reply pipe until end of file
# (Ctrl-C is the parent's: it closes the pipes, and the worker returns)
_ECHO = "\n".join(
    (
        "import os, signal, sys",
        "signal.signal(signal.SIGINT, signal.SIG_IGN)",
        "r, w = int(sys.argv[1]), int(sys.argv[2])",
        "while os.read(r, 1):",
        "    os.write(w, b'r')",
    )
)


class _Timed:
    """A candidate's timings: wall and parent CPU seconds of each timed run."""

    def __init__(self, name: str, step: Callable[[int], object], close: Callable[[], object]):
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.candidate = Candidate(name, self._run, close)
        self._step = step

    def _run(self, steps: int) -> float:
        gc.collect()
        cpu, wall = time.process_time(), time.perf_counter()
        for t in range(steps):
            self._step(t)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        self.cpu.append(cpu / steps)
        self.wall.append(wall / steps)
        return wall


def _aiovec(workers: int) -> _Timed:
    """Lock-step ``step()`` of ``PARENT_ENVS`` CartPole envs on ``workers`` processes."""
    make = functools.partial(gymnasium.make, "CartPole-v1")
    venv = aiovec.BlockingVectorEnv([make] * PARENT_ENVS, backend="process", num_workers=workers)
    try:
        venv.action_space.seed(0)
        actions = [venv.action_space.sample() for _ in range(ACTION_BATCHES)]
        venv.reset(seed=0)
    except BaseException:
        venv.close()
        raise

    def step(t: int) -> None:
        venv.step(actions[t % ACTION_BATCHES])

    return _Timed(f"{AIOVEC} W={workers}", step, venv.close)


class _EchoWorkers:
    """``workers`` bare echo processes and the parent's ends of their pipes."""

    def __init__(self, workers: int) -> None:
        self.requests: list[int] = []  # write ends
        self.replies: list[int] = []  # read ends
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(workers):
                req_r, req_w = os.pipe()
                self.requests.append(req_w)
                rep_r, rep_w = os.pipe()
                self.replies.append(rep_r)
                try:
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, "-c", _ECHO, str(req_r), str(rep_w)],
                            pass_fds=(req_r, rep_w),
                        )
                    )
                finally:
                    os.close(req_r)
                    os.close(rep_w)
        except BaseException:
            self.close()
            raise

    def round(self, _t: int = 0) -> None:
        """One byte to each worker, then one byte back from each."""
        for fd in self.requests:
            os.write(fd, b"q")
        for fd in self.replies:
            os.read(fd, 1)

    def close(self) -> None:
        """End of file on every request pipe: each worker returns; reap them, close the rest."""
        for fd in self.requests:
            os.close(fd)
        self.requests = []
        try:
            for proc in self.procs:
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            for fd in self.replies:
                os.close(fd)
            self.replies, self.procs = [], []


def _bare(workers: int) -> _Timed:
    echo = _EchoWorkers(workers)
    return _Timed(f"{BARE} W={workers}", echo.round, echo.close)


def _spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of per-step seconds, in microseconds."""
    us = [v * 1e6 for v in values]
    return {"median": statistics.median(us), "min": min(us), "max": max(us)}


def parent_cost(workers: Sequence[int], steps: int, reps: int) -> list[dict[str, Any]]:
    """For each W: aiovec's parent CPU per lock-step step against the bare parent's.

    Both run ``steps`` steps (rounds) per timing, ``reps`` timings each, in
    alternating order, after one untimed warm-up run each.
    """
    rows = []
    for w in workers:
        made: list[_Timed] = []
        try:
            made.append(_aiovec(w))
            made.append(_bare(w))
            run_interleaved(
                [m.candidate for m in made],
                steps=steps,
                reps=reps,
                warmup_steps=max(5, steps // 5),
            )
        finally:
            for m in made:
                m.candidate.close()
        ours, bare = made
        ratio = median_ratio(ours.cpu, bare.cpu)
        target = PARENT_TARGET if w in TARGET_WORKERS else None
        rows.append(
            {
                "env": "CartPole-v1",
                "num_envs": PARENT_ENVS,
                "workers": w,
                "steps": steps,
                "aiovec_cpu_us": _spread(ours.cpu),
                "bare_cpu_us": _spread(bare.cpu),
                "ratio": ratio,
                "target": target,
                "passed": None if target is None else ratio <= target,
                "aiovec_wall_us": _spread(ours.wall),
                "bare_wall_us": _spread(bare.wall),
                "aiovec_cpu_s_per_step": ours.cpu,
                "bare_cpu_s_per_step": bare.cpu,
                "aiovec_wall_s_per_step": ours.wall,
                "bare_wall_s_per_step": bare.wall,
            }
        )
        print(f"  measured parent cost W={w}", file=sys.stderr, flush=True)
    return rows


def print_parent(rows: Sequence[dict[str, Any]]) -> None:
    """The parent-cost table (markdown), one row per W."""
    if not rows:
        return
    print()
    print(
        f"Parent CPU per lock-step vector step (issue 27): CartPole-v1 N = {PARENT_ENVS}, "
        f"process backend, against a bare parent that writes 1 byte to each of W pipes and "
        f"reads 1 byte back from each ({rows[0]['steps']} steps a timing, interleaved)"
    )
    print(
        "| W | aiovec parent CPU us/step (min-max) | bare pipe parent CPU us/step (min-max) "
        "| ratio | target | aiovec wall us/step | bare wall us/step |"
    )
    print("|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        a, b = r["aiovec_cpu_us"], r["bare_cpu_us"]
        target = ""
        if r["target"] is not None:
            target = f"<= {r['target']:.1f}x " + ("PASS" if r["passed"] else "MISS")
        print(
            f"| {r['workers']} | {a['median']:.0f} ({a['min']:.0f}-{a['max']:.0f}) "
            f"| {b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}) | {r['ratio']:.1f}x "
            f"| {target} | {r['aiovec_wall_us']['median']:.0f} "
            f"| {r['bare_wall_us']['median']:.1f} |"
        )
