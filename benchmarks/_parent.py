"""The parent's CPU per lock-step vector step, against a bare pipe parent (issue 27).

``cpu.py --only parent`` runs it.  For each worker count W:

- aiovec: ``aiovec.BlockingVectorEnv`` over ``PARENT_ENVS`` ``CartPole-v1`` envs
  (``gymnasium.make``), ``backend="process"``, ``num_workers=W``, stepped in
  lock-step with random actions (a few batches drawn from its ``action_space``,
  replayed in turn);
- minimal: the same envs on W worker processes that step them over shared
  memory (`GroupServers`: aiovec's own worker code on rows of one shared buffer);
  the parent copies the actions and reset flags in, writes one byte to each
  worker, waits for each with a blocking read (newest first), and copies the four
  outputs out (observations, rewards, terminations, truncations).  No rules, no
  checks, no event loop: issue 34's floor for a parent that does the same work;
- bare: W processes that each read one byte from a pipe and write one byte back
  (``os.read``/``os.write`` on raw pipes); a round writes one byte to each of the
  W pipes, then reads one byte from each.  No Python work beyond that: the
  floor of any parent that wakes W workers and waits for each.

All three are timed in the same repetitions, in rotating order (`run_interleaved`),
after an untimed warm-up.  Each timing records the parent's CPU
(``time.process_time()``, all its threads) and the wall time over K steps or
rounds.  Reported per W: the parent's CPU per step of each (median, min-max),
the ratio to the bare parent (median of per-repetition ratios) with PASS/MISS
against issue 27's target, aiovec's excess over the minimal parent (median of
per-repetition differences) with PASS/MISS against issue 34's at most
``25 + 2 W`` us, and the wall time per step of each, for context.
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
import numpy as np
from _common import Candidate, median_ratio, run_interleaved
from _servers import GroupServers

import aiovec

__all__ = ("PARENT_ENVS", "PARENT_TARGET", "parent_cost", "print_parent")

PARENT_ENVS = 64
PARENT_TARGET = 2.5  # issue 27: aiovec's parent CPU per step <= 2.5x the bare parent's
TARGET_WORKERS = frozenset((2, 4, 8, 16))  # the worker counts the target names
DEFAULT_WORKERS = (1, 2, 4, 8, 16)
QUICK_WORKERS = (1, 2)
ACTION_BATCHES = 8  # distinct batches of random actions, replayed in turn
AIOVEC, MINIMAL, BARE = "aiovec process", "minimal shared-memory parent", "bare pipe parent"
# issue 34: aiovec's parent CPU per step <= the minimal parent's + EXCESS_US
# + EXCESS_PER_WORKER_US * W
EXCESS_US, EXCESS_PER_WORKER_US = 25.0, 2.0

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


def _make_cartpole() -> Any:
    return gymnasium.make("CartPole-v1")


def _minimal(workers: int) -> _Timed:
    """The same envs on ``workers`` processes, stepped over shared memory by a minimal parent."""
    servers = GroupServers(_make_cartpole, PARENT_ENVS, workers=workers)
    arrays = servers.arrays
    actions = np.random.default_rng(0).integers(0, 2, size=(ACTION_BATCHES, PARENT_ENVS))
    requests, replies = servers.requests, servers.replies[::-1]  # waited for newest first

    def step(t: int) -> None:
        arrays.actions[:] = actions[t % ACTION_BATCHES]
        np.logical_or(arrays.terminations, arrays.truncations, out=arrays.resets)
        for fd in requests:  # one part per worker: its whole group
            os.write(fd, b"\0")
        for fd in replies:
            os.read(fd, 1)
        arrays.observations.copy()
        arrays.rewards.copy()
        arrays.terminations.copy()
        arrays.truncations.copy()

    return _Timed(f"{MINIMAL} W={workers}", step, servers.close)


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
            made.append(_minimal(w))
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
        ours, minimal, bare = made
        ratio = median_ratio(ours.cpu, bare.cpu)
        target = PARENT_TARGET if w in TARGET_WORKERS else None
        excess = statistics.median(
            (a - m) * 1e6 for a, m in zip(ours.cpu, minimal.cpu, strict=True)
        )
        allowed = EXCESS_US + EXCESS_PER_WORKER_US * w if w in TARGET_WORKERS else None
        rows.append(
            {
                "env": "CartPole-v1",
                "num_envs": PARENT_ENVS,
                "workers": w,
                "steps": steps,
                "aiovec_cpu_us": _spread(ours.cpu),
                "minimal_cpu_us": _spread(minimal.cpu),
                "bare_cpu_us": _spread(bare.cpu),
                "ratio": ratio,
                "target": target,
                "passed": None if target is None else ratio <= target,
                "excess_us": excess,
                "excess_target_us": allowed,
                "excess_passed": None if allowed is None else excess <= allowed,
                "aiovec_wall_us": _spread(ours.wall),
                "minimal_wall_us": _spread(minimal.wall),
                "bare_wall_us": _spread(bare.wall),
                "aiovec_cpu_s_per_step": ours.cpu,
                "minimal_cpu_s_per_step": minimal.cpu,
                "bare_cpu_s_per_step": bare.cpu,
                "aiovec_wall_s_per_step": ours.wall,
                "minimal_wall_s_per_step": minimal.wall,
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
        f"Parent CPU per lock-step vector step (issues 27 and 34): CartPole-v1 N = {PARENT_ENVS}, "
        "process backend, against a minimal parent whose workers step the same envs over "
        "shared memory, and a bare parent that writes 1 byte to each of W pipes and reads "
        f"1 byte back from each ({rows[0]['steps']} steps a timing, interleaved)"
    )
    print(
        "| W | aiovec parent CPU us/step (min-max) | minimal parent CPU us/step (min-max) "
        "| bare pipe parent CPU us/step (min-max) | aiovec - minimal us | target (issue 34) "
        "| aiovec / bare | target (issue 27) | aiovec wall us/step | minimal wall us/step "
        "| bare wall us/step |"
    )
    print("|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|")
    for r in rows:
        a, m, b = r["aiovec_cpu_us"], r["minimal_cpu_us"], r["bare_cpu_us"]
        target = excess = ""
        if r["target"] is not None:
            target = f"<= {r['target']:.1f}x " + ("PASS" if r["passed"] else "MISS")
        if r["excess_target_us"] is not None:
            excess = f"<= {r['excess_target_us']:.0f} " + ("PASS" if r["excess_passed"] else "MISS")
        print(
            f"| {r['workers']} | {a['median']:.0f} ({a['min']:.0f}-{a['max']:.0f}) "
            f"| {m['median']:.0f} ({m['min']:.0f}-{m['max']:.0f}) "
            f"| {b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}) "
            f"| {r['excess_us']:.0f} | {excess} "
            f"| {r['ratio']:.1f}x | {target} | {r['aiovec_wall_us']['median']:.0f} "
            f"| {r['minimal_wall_us']['median']:.0f} | {r['bare_wall_us']['median']:.1f} |"
        )
