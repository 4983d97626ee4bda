"""Envs that wait on I/O: aiovec against the other ways of stepping them.

Run from the repository root::

    python benchmarks/io.py                     # every case, several minutes on 2 cores
    python benchmarks/io.py --quick             # CI smoke test, < 60 s (numbers are rough)
    python benchmarks/io.py --reps 9 --json io.json
    python benchmarks/io.py --only tcp --server both   # one case; the server both ways
    python benchmarks/io.py --only workers --io-workers 1,2,4,8,16   # past 2 cores

Cases (the figures of docs/network.md; the workers case's go to docs/process.md):

``sleep``
    Envs whose every step waits 5 ms (``asyncio.sleep`` in the async env,
    ``time.sleep`` in its blocking twin; resets do not wait), N = 64 and 256:
    aiovec's await API (inline, on asyncio's loop; on uvloop too at N = 256),
    ``BlockingVectorEnv``, ``backend="thread"`` over the blocking twins; and
    the other ways: gymnasium ``SyncVectorEnv`` (N x 5 ms a step: one vector
    step is timed per repetition and scaled), gymnasium ``AsyncVectorEnv`` (one
    process per env), a ``ThreadPoolExecutor(N)`` stepping the blocking twins
    (one ``list(pool.map(...))`` per step, observations and rewards stacked
    into arrays), and a bare ``asyncio.gather`` over the async envs' coroutines
    (no batching, no autoreset: the floor of the obvious implementation).
``tcp``
    The loopback game server (``aiovec.gameserver``, 1 ms latency per reply),
    N = 256 clients: aiovec over ``GameClientEnv`` (and a bare ``gather`` over
    the same), ``backend="thread"``, a 256-thread pool, gymnasium
    ``AsyncVectorEnv`` and ``SyncVectorEnv`` over ``BlockingGameClientEnv``.
    The server runs in a process of its own by default (``--server``).  On a
    thread of this process it would compete for the GIL with the clients that
    live here (aiovec, the thread pool) but not with those in gymnasium's
    worker processes, and distort the comparison; ``--server both`` measures
    both ways.  The server process is pinned to the last CPU
    (``--no-pin-server`` to leave it free), so that on a small machine the
    clients' loop and the server do not take turns on one core.
``partial``
    N = 256 envs whose every step waits a time drawn from 1-20 ms (per env and
    step, seeded): full-batch ``step`` (it waits for the slowest env every time)
    against ``send``/``recv(min_envs=N // 4)``, re-sending exactly the envs
    received, with actions routed by ``env_ids``.  Env-steps per second.
``10k``
    N = 10,000 envs waiting 5 ms on one loop: aiovec against a bare
    ``asyncio.gather`` over the same envs' coroutines, on asyncio's loop and on
    uvloop; and aiovec's own memory per env, measured in fresh processes: the
    RSS growth from building and resetting the vector env, minus the growth
    from building and resetting as many bare env objects, per env.
``workers``
    N = 20,000 envs waiting 5 ms (issue 15): the await API on one loop
    (``backend="inline"``, asyncio's loop) against ``backend="process"`` with
    W workers, each stepping its share of the envs on an event loop of its
    own, for each W of ``--io-workers`` (default 1,2, which fits 2 cores).
    Env-steps per second, and each W's over one loop (a note; W = 2 against
    issue 15's 3x is a target).  CPU and memory count the worker processes.
    ``--quick`` shrinks it to 2,000 envs.

How it measures (as ``benchmarks/overhead.py``): in each case every candidate
is built, reset and stepped once, warmed up, then timed once per repetition,
the order rotating from one repetition to the next, so that noise from other
processes hits all candidates alike.  Reported per candidate, medians over
repetitions: milliseconds per vector step; env-steps per second; *overhead
per env-step*, the step time minus the latency, divided by N (what each
waiting env costs above the wait); *aiovec's own* overhead per env-step,
aiovec's step time minus that of the bare ``gather`` over the same envs on
the same loop, paired per repetition, divided by N (what aiovec adds to
what the loop itself spends on every waiting env); CPU time per env-step
(this process, all threads, plus the worker processes it started; the game
server's own CPU is given apart); and memory: the growth of this process's
RSS while the
candidate was built and warmed, plus the RSS of its worker processes (and
their PSS, which counts the pages they share once).  Ratios between
candidates are medians over repetitions of paired ratios.  Once built, what
the candidates hold is ``gc.freeze()``-d (``--no-gc-freeze`` to skip), so
that one candidate's objects do not slow down another's garbage collections.
Targets are printed PASS/MISS; timings never make the script fail.  Every
vector env, pool, thread and process is closed on the way out, on errors and
Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import gc
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from _common import Candidate, loop_factories, machine_info, positive_ints, run_interleaved

import aiovec
from aiovec.gameserver import BlockingGameClientEnv, GameClientEnv, GameServer
from aiovec.testing import AsyncTrivialEnv, TrivialEnv

SLEEP = 0.005  # seconds each step of the sleep envs waits
SERVER_LATENCY = 0.001  # seconds the game server waits before each reply
JITTER_RANGE = (0.001, 0.020)  # seconds: the partial case's per-env latencies
ASYNC_PROCESS_CAP = 64  # gymnasium AsyncVectorEnv processes when memory is short
CASES = ("sleep", "tcp", "partial", "10k", "workers")
WORKERS_ENVS = 20_000  # the workers case's envs (--quick: 2,000)
WORKERS_CASE = f"process workers, sleep {SLEEP * 1e3:g} ms"  # no other case's name starts so
ONE_LOOP = "aiovec inline (one loop)"  # the workers case's baseline
ACTION_ROWS = 16  # distinct pre-sampled action batches, replayed in turn

Factory = Callable[[], asyncio.AbstractEventLoop]


# ------------------------------------------------------------------------ envs


class SleepEnv(AsyncTrivialEnv):
    """An async env whose every step waits ``latency`` seconds (``asyncio.sleep``)."""

    def __init__(self, latency: float = SLEEP) -> None:
        self.latency = latency

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(self.latency)
        return await super().step(action)


class BlockingSleepEnv(TrivialEnv):
    """The blocking twin of :class:`SleepEnv`: every step blocks in ``time.sleep``."""

    def __init__(self, latency: float = SLEEP) -> None:
        self.latency = latency

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(self.latency)
        return super().step(action)


class JitterSleepEnv(AsyncTrivialEnv):
    """An async env with a latency of its own, drawn once from ``JITTER_RANGE`` (seeded).

    The issue's case: "per-env latency drawn from 1-20 ms", a fleet of servers some
    of which are slower than others, so partial stepping lets fast envs run on.
    """

    def __init__(self, seed: int) -> None:
        self.latency = random.Random(seed).uniform(*JITTER_RANGE)

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(self.latency)
        return await super().step(action)


class AutoresetClient:
    """A blocking env stepped by a thread pool, with gymnasium's NEXT_STEP autoreset."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        self.env = env
        self.ended = False

    def reset(self, seed: int) -> tuple[Any, dict[str, Any]]:
        self.ended = False
        return self.env.reset(seed=seed)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.ended:
            obs, info = self.env.reset()
            self.ended = False
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.ended = terminated or truncated
        return obs, float(reward), terminated, truncated, info


# ------------------------------------------------------------- /proc readings


def _proc_kb(path: str, key: str) -> int | None:
    """A ``kB`` figure from a ``/proc`` file (``None`` where there is none)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes(pid: int | str = "self") -> int | None:
    kb = _proc_kb(f"/proc/{pid}/status", "VmRSS:")
    return None if kb is None else kb * 1024


def pss_bytes(pid: int) -> int | None:
    kb = _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss:")
    return None if kb is None else kb * 1024


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (``None`` without /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def async_vector_processes(num_envs: int, quick: bool) -> int:
    """Processes for gymnasium ``AsyncVectorEnv``: one per env, unless memory is short.

    Each worker is a fork of this process and shares its pages until it writes
    them: summed RSS overstates what they use (their PSS was ~6 MB each here).
    Budget 30 MB per worker against half of the memory available.
    """
    kb = _proc_kb("/proc/meminfo", "MemAvailable:")
    if quick or kb is None or num_envs * 30e6 <= kb * 1024 / 2:
        return num_envs
    return min(num_envs, ASYNC_PROCESS_CAP)


# ----------------------------------------------------------------- candidates


@dataclass
class Meter:
    """Wall-clock and CPU time of the timed regions of one candidate.

    CPU is this process's (every thread) plus that of the child processes in
    ``pids``; the game server's (``server_pid``) is kept apart.  Each timing
    is preceded by a ``gc.collect()`` outside the timed region.
    """

    pids: list[int] = field(default_factory=list)
    server_pid: int | None = None
    cpu: list[float] = field(default_factory=list)  # CPU seconds per env-step, per timing
    server_cpu: list[float] = field(default_factory=list)
    _started: tuple[float, float, float | None] = (0.0, 0.0, None)

    def _cpu(self) -> tuple[float, float | None]:
        own = time.process_time() + sum(cpu_seconds(pid) or 0.0 for pid in self.pids)
        return own, None if self.server_pid is None else cpu_seconds(self.server_pid)

    def start(self) -> None:
        gc.collect()
        self._started = (time.perf_counter(), *self._cpu())

    def stop(self, env_steps: int) -> float:
        """End the timed region; returns its seconds and records CPU per env-step."""
        wall = time.perf_counter() - self._started[0]
        own, server = self._cpu()
        self.cpu.append((own - self._started[1]) / env_steps)
        server0 = self._started[2]
        if server is not None and server0 is not None:
            self.server_cpu.append((server - server0) / env_steps)
        return wall

    def time(self, body: Callable[[], object], env_steps: int) -> float:
        self.start()
        body()
        return self.stop(env_steps)

    async def time_async(self, body: Callable[[], Awaitable[object]], env_steps: int) -> float:
        self.start()
        await body()
        return self.stop(env_steps)


@dataclass
class IOCandidate(Candidate):
    """A :class:`Candidate` with what this benchmark reports besides time."""

    num_envs: int = 0  # envs it steps (gymnasium AsyncVectorEnv may be capped)
    meter: Meter = field(default_factory=Meter)
    sequential: bool = False  # steps one env after another: no per-env overhead figure
    rss: int | None = None  # bytes: RSS growth of this process + its workers' RSS
    child_pss: int | None = None  # bytes: its worker processes' PSS
    venv: Any = None  # an aiovec vector env, for latency_stats()
    note: str = ""


def action_rows(num_envs: int, n: int) -> list[np.ndarray]:
    """``ACTION_ROWS`` batches of ``Discrete(n)`` actions, the same for every candidate."""
    rng = np.random.default_rng(0)
    return list(rng.integers(0, n, size=(ACTION_ROWS, num_envs), dtype=np.int64))


def replay(rows: Sequence[np.ndarray], steps: int) -> list[np.ndarray]:
    return [rows[k % len(rows)] for k in range(steps)]


def aiovec_await(
    name: str,
    env_fns: Sequence[Callable[[], Any]],
    n_actions: int,
    factory: Factory,
    *,
    after_build: Callable[[aiovec.AsyncioVectorEnv[Any, Any]], Awaitable[object]] | None = None,
    **kwargs: Any,
) -> IOCandidate:
    """``AsyncioVectorEnv``, timed inside its own running loop.

    ``after_build`` is awaited on that loop once the vector env is reset and
    stepped; ``kwargs`` go to ``AsyncioVectorEnv``.
    """
    runner = asyncio.Runner(loop_factory=factory)
    rows = action_rows(len(env_fns), n_actions)
    meter = Meter()
    venv: aiovec.AsyncioVectorEnv[Any, Any] | None = None

    async def build() -> aiovec.AsyncioVectorEnv[Any, Any]:
        nonlocal venv
        venv = aiovec.AsyncioVectorEnv(env_fns, **kwargs)
        await venv.reset(seed=0)
        await venv.step(rows[0])
        if after_build is not None:
            await after_build(venv)
        return venv

    def close() -> None:
        try:
            if venv is not None:
                runner.run(venv.close())
        finally:
            runner.close()

    try:
        built = runner.run(build())
    except BaseException:
        close()
        raise

    def run(steps: int) -> float:
        todo = replay(rows, steps)

        async def body() -> None:
            step = built.step
            for a in todo:
                await step(a)

        return runner.run(meter.time_async(body, steps * len(env_fns)))

    return IOCandidate(name, run, close, num_envs=len(env_fns), meter=meter, venv=built)


def aiovec_blocking(
    name: str, env_fns: Sequence[Callable[[], Any]], n_actions: int, **kwargs: Any
) -> IOCandidate:
    """``BlockingVectorEnv``, timed in plain sync code."""
    rows = action_rows(len(env_fns), n_actions)
    meter = Meter()
    venv = aiovec.BlockingVectorEnv(env_fns, **kwargs)
    try:
        venv.reset(seed=0)
        venv.step(rows[0])
    except BaseException:
        venv.close()
        raise

    def run(steps: int) -> float:
        todo = replay(rows, steps)

        def body() -> None:
            step = venv.step
            for a in todo:
                step(a)

        return meter.time(body, steps * len(env_fns))

    return IOCandidate(name, run, venv.close, num_envs=len(env_fns), meter=meter, venv=venv)


def gymnasium_vector(
    name: str,
    venv: gymnasium.vector.VectorEnv[Any, Any, Any],
    n_actions: int,
    *,
    timed_steps: int | None = None,
) -> IOCandidate:
    """A gymnasium vector env; ``timed_steps``: time only that many steps, and scale."""
    rows = action_rows(venv.num_envs, n_actions)
    meter = Meter()
    if isinstance(venv, gymnasium.vector.AsyncVectorEnv):
        meter.pids = [p.pid for p in venv.processes if p.pid is not None]
    try:
        venv.reset(seed=0)
        venv.step(rows[0])
    except BaseException:
        venv.close()
        raise

    def run(steps: int) -> float:
        timed = steps if timed_steps is None else min(steps, timed_steps)
        todo = replay(rows, timed)

        def body() -> None:
            step = venv.step
            for a in todo:
                step(a)

        return meter.time(body, timed * venv.num_envs) * steps / timed

    cand = IOCandidate(name, run, venv.close, num_envs=venv.num_envs, meter=meter)
    cand.sequential = isinstance(venv, gymnasium.vector.SyncVectorEnv)
    if timed_steps is not None:
        cand.note = f"{timed_steps} step(s) timed per repetition, scaled"
    return cand


def gymnasium_async(
    env_fn: Callable[[], gymnasium.Env[Any, Any]], num_envs: int, n_actions: int, quick: bool
) -> IOCandidate:
    procs = async_vector_processes(num_envs, quick)
    venv = gymnasium.vector.AsyncVectorEnv([env_fn] * procs)
    cand = gymnasium_vector(f"gymnasium AsyncVectorEnv ({procs} processes)", venv, n_actions)
    if procs < num_envs:
        cand.note = f"capped at {procs} processes (memory): N = {procs}"
    return cand


def thread_pool(
    name: str, env_fn: Callable[[], gymnasium.Env[Any, Any]], num_envs: int, n_actions: int
) -> IOCandidate:
    """``ThreadPoolExecutor(N)``: one ``pool.map`` over the blocking envs per vector step."""
    rows = action_rows(num_envs, n_actions)
    meter = Meter()
    clients = [AutoresetClient(env_fn()) for _ in range(num_envs)]
    pool = concurrent.futures.ThreadPoolExecutor(num_envs)

    def close() -> None:
        pool.shutdown(wait=True, cancel_futures=True)
        for c in clients:
            c.env.close()

    def vector_step(actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        results = list(pool.map(AutoresetClient.step, clients, actions))
        return np.stack([r[0] for r in results]), np.array([r[1] for r in results])

    try:
        list(pool.map(AutoresetClient.reset, clients, range(num_envs)))
        vector_step(rows[0])
    except BaseException:
        close()
        raise

    def run(steps: int) -> float:
        todo = replay(rows, steps)

        def body() -> None:
            for a in todo:
                vector_step(a)

        return meter.time(body, steps * num_envs)

    return IOCandidate(name, run, close, num_envs=num_envs, meter=meter)


def bare_gather(
    name: str, env_fn: Callable[[], Any], num_envs: int, n_actions: int, factory: Factory
) -> IOCandidate:
    """``await asyncio.gather(*(env.step(a) ...))``: no batching, no autoreset."""
    runner = asyncio.Runner(loop_factory=factory)
    rows = action_rows(num_envs, n_actions)
    meter = Meter()
    envs = [env_fn() for _ in range(num_envs)]

    async def gather_steps(todo: Sequence[np.ndarray]) -> None:
        gather = asyncio.gather
        for a in todo:
            await gather(*[env.step(x) for env, x in zip(envs, a, strict=True)])

    async def build() -> None:
        await asyncio.gather(*[env.reset(seed=i) for i, env in enumerate(envs)])
        await gather_steps(rows[:1])

    async def close_envs() -> None:
        await asyncio.gather(*[env.close() for env in envs])

    def close() -> None:
        try:
            runner.run(close_envs())
        finally:
            runner.close()

    try:
        runner.run(build())
    except BaseException:
        close()
        raise

    def run(steps: int) -> float:
        todo = replay(rows, steps)
        return runner.run(meter.time_async(lambda: gather_steps(todo), steps * num_envs))

    return IOCandidate(name, run, close, num_envs=num_envs, meter=meter)


def partial_stepping(env_fns: Sequence[Callable[[], Any]], min_envs: int) -> IOCandidate:
    """``send``/``recv(min_envs)`` rounds, re-sending exactly the envs received."""
    num_envs = len(env_fns)
    runner = asyncio.Runner()
    meter = Meter()
    table = np.random.default_rng(0).integers(0, 2, size=num_envs, dtype=np.int64)
    venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv(env_fns)

    async def rounds(env_steps: int) -> float:
        """Seconds per env-step of rounds until ``env_steps`` rows came back."""
        await venv.reset(seed=0)
        meter.start()
        venv.send(table, np.arange(num_envs))
        received = 0
        try:
            while received < env_steps:
                *_, env_ids = await venv.recv(min_envs=min_envs)
                received += len(env_ids)
                venv.send(table[env_ids], env_ids)  # the policy's actions, routed by id
            return meter.stop(received) / received
        finally:
            await venv.recv()  # collect the envs still in flight (not timed)

    def run(steps: int) -> float:
        return runner.run(rounds(steps * num_envs)) * steps * num_envs

    def close() -> None:
        try:
            runner.run(venv.close())
        finally:
            runner.close()

    try:
        runner.run(rounds(num_envs))
    except BaseException:
        close()
        raise
    meter.cpu.clear()  # that was building, not timing
    name = f"aiovec send()/recv(min_envs={min_envs})"
    return IOCandidate(name, run, close, num_envs=num_envs, meter=meter, venv=venv)


# ---------------------------------------------------------------------- cases


@dataclass
class Case:
    """Candidates doing the same work; ``latency``: each env-step's wait (if fixed)."""

    name: str
    num_envs: int
    latency: float | None
    builders: list[Callable[[], IOCandidate]]
    steps: int  # vector steps per timing
    server_pid: int | None = None  # the game server's process, if it runs in one


def sleep_case(num_envs: int, args: argparse.Namespace) -> Case:
    loops = {k: v for k, v in loop_factories().items() if k == "asyncio" or num_envs == 256}
    async_fns = [functools.partial(SleepEnv, SLEEP)] * num_envs
    blocking_fns = [functools.partial(BlockingSleepEnv, SLEEP)] * num_envs
    builders: list[Callable[[], IOCandidate]] = []
    if not args.quick:  # first: fork its processes before this one has threads
        builders.append(lambda: gymnasium_async(blocking_fns[0], num_envs, 2, args.quick))
    builders += [
        functools.partial(aiovec_await, f"aiovec await ({loop})", async_fns, 2, factory)
        for loop, factory in loops.items()
    ]
    builders += [
        lambda: aiovec_blocking("aiovec blocking", async_fns, 2),
        lambda: aiovec_await(
            "aiovec backend=thread", blocking_fns, 2, asyncio.new_event_loop, backend="thread"
        ),
        lambda: thread_pool(f"thread pool ({num_envs} threads)", blocking_fns[0], num_envs, 2),
    ]
    builders += [
        functools.partial(
            bare_gather, f"bare asyncio.gather ({loop})", async_fns[0], num_envs, 2, factory
        )
        for loop, factory in loops.items()
    ]
    if not (args.quick and num_envs > 64):
        builders.append(
            lambda: gymnasium_vector(
                "gymnasium SyncVectorEnv",
                gymnasium.vector.SyncVectorEnv(blocking_fns),
                2,
                timed_steps=1,
            )
        )
    steps = 8 if args.quick else 40
    return Case(f"sleep {SLEEP * 1e3:g} ms", num_envs, SLEEP, builders, steps)


def tcp_case(
    num_envs: int, port: int, server_pid: int | None, where: str, args: argparse.Namespace
) -> Case:
    async_fn = functools.partial(GameClientEnv, port=port)
    blocking_fn = functools.partial(BlockingGameClientEnv, port=port)
    builders: list[Callable[[], IOCandidate]] = []
    if not args.quick:  # first: fork its processes before this one has threads
        builders.append(lambda: gymnasium_async(blocking_fn, num_envs, 5, args.quick))
    builders += [
        functools.partial(aiovec_await, f"aiovec await ({loop})", [async_fn] * num_envs, 5, factory)
        for loop, factory in loop_factories().items()
    ]
    builders += [
        lambda: aiovec_await(
            "aiovec backend=thread",
            [blocking_fn] * num_envs,
            5,
            asyncio.new_event_loop,
            backend="thread",
        ),
        lambda: thread_pool(f"thread pool ({num_envs} threads)", blocking_fn, num_envs, 5),
        lambda: bare_gather(
            "bare asyncio.gather (asyncio)", async_fn, num_envs, 5, asyncio.new_event_loop
        ),
        lambda: gymnasium_vector(
            "gymnasium SyncVectorEnv",
            gymnasium.vector.SyncVectorEnv([blocking_fn] * num_envs),
            5,
            timed_steps=1,
        ),
    ]
    name = f"tcp {SERVER_LATENCY * 1e3:g} ms (server {where})"
    steps = 8 if args.quick else 40
    return Case(name, num_envs, SERVER_LATENCY, builders, steps, server_pid)


def partial_case(num_envs: int, args: argparse.Namespace) -> Case:
    env_fns = [functools.partial(JitterSleepEnv, i) for i in range(num_envs)]
    builders: list[Callable[[], IOCandidate]] = [
        lambda: aiovec_await("aiovec step() (full batch)", env_fns, 2, asyncio.new_event_loop),
        lambda: partial_stepping(env_fns, num_envs // 4),
    ]
    low, high = (s * 1e3 for s in JITTER_RANGE)
    return Case(f"partial {low:g}-{high:g} ms", num_envs, None, builders, 5 if args.quick else 20)


def many_case(num_envs: int, args: argparse.Namespace) -> Case:
    async_fns = [functools.partial(SleepEnv, SLEEP)] * num_envs
    builders: list[Callable[[], IOCandidate]] = []
    for loop, factory in loop_factories().items():
        builders.append(
            functools.partial(aiovec_await, f"aiovec await ({loop})", async_fns, 2, factory)
        )
        builders.append(
            functools.partial(
                bare_gather, f"bare asyncio.gather ({loop})", async_fns[0], num_envs, 2, factory
            )
        )
    steps = 3 if args.quick else 6
    return Case(f"sleep {SLEEP * 1e3:g} ms", num_envs, SLEEP, builders, steps)


def process_workers(workers: int, env_fns: Sequence[Callable[[], Any]]) -> IOCandidate:
    """The await API on ``backend="process"`` with ``workers`` workers (their CPU and
    memory counted with this process's)."""
    cand = aiovec_await(
        f"aiovec process W={workers}",
        env_fns,
        2,
        asyncio.new_event_loop,
        backend="process",
        num_workers=workers,
    )
    cand.meter.pids = [pid for pid in cand.venv._backend.pids if pid is not None]
    return cand


def workers_case(num_envs: int, args: argparse.Namespace) -> Case:
    """N envs waiting 5 ms: one loop against W worker processes, each a loop of its own."""
    async_fns = [functools.partial(SleepEnv, SLEEP)] * num_envs
    builders: list[Callable[[], IOCandidate]] = [
        functools.partial(aiovec_await, ONE_LOOP, async_fns, 2, asyncio.new_event_loop)
    ]
    builders += [functools.partial(process_workers, w, async_fns) for w in args.io_workers]
    steps = 3 if args.quick else 6
    return Case(WORKERS_CASE, num_envs, SLEEP, builders, steps)


def measured(build: Callable[[], IOCandidate]) -> IOCandidate:
    """Build (and warm) a candidate, recording the memory it took."""
    gc.collect()
    before = rss_bytes()
    cand = build()
    gc.collect()
    after = rss_bytes()
    pids = cand.meter.pids
    if before is not None and after is not None:
        cand.rss = after - before + sum(rss_bytes(pid) or 0 for pid in pids)
        pss = [pss_bytes(pid) for pid in pids]
        if pids and None not in pss:
            cand.child_pss = sum(p or 0 for p in pss)
    return cand


def close_all(cands: Sequence[IOCandidate]) -> None:
    """Close every candidate, even if some close fails (reported, not raised)."""
    for cand in reversed(cands):
        try:
            cand.close()
        except Exception as exc:
            print(f"  warning: closing {cand.name} failed: {exc!r}", file=sys.stderr)


def run_case(case: Case, args: argparse.Namespace) -> list[dict[str, Any]]:
    cands: list[IOCandidate] = []
    try:
        for build in case.builders:
            cands.append(measured(build))
            cands[-1].meter.server_pid = case.server_pid
        if args.gc_freeze:
            # What every candidate holds goes to the permanent generation: a full
            # collection (garbage from the steps is still collected as usual) no
            # longer walks the other candidates' objects.
            gc.freeze()
        warmup = max(2, case.steps // 5)
        run_interleaved(cands, steps=case.steps, reps=args.reps, warmup_steps=warmup)
        rows = [row(case, cand) for cand in cands]
    finally:
        gc.unfreeze()
        close_all(cands)
    return rows


def row(case: Case, cand: IOCandidate) -> dict[str, Any]:
    per_step = statistics.median(cand.seconds) / case.steps
    overhead = None
    if case.latency is not None and not cand.sequential:
        overhead = (per_step - case.latency) / cand.num_envs * 1e6
    out = {
        "case": case.name,
        "case_envs": case.num_envs,
        "num_envs": cand.num_envs,
        "candidate": cand.name,
        "steps": case.steps,
        "ms_per_step": per_step * 1e3,
        "env_steps_per_s": cand.num_envs / per_step,
        "overhead_us_per_env_step": overhead,
        "rss_mb": None if cand.rss is None else cand.rss / 2**20,
        "child_pss_mb": None if cand.child_pss is None else cand.child_pss / 2**20,
        "note": cand.note,
        "seconds": cand.seconds,
    }
    meter = cand.meter
    if len(meter.cpu) > 1:  # the first timing is the warm-up
        out["cpu_us_per_env_step"] = statistics.median(meter.cpu[1:]) * 1e6
    if len(meter.server_cpu) > 1:
        out["server_cpu_us_per_env_step"] = statistics.median(meter.server_cpu[1:]) * 1e6
    stats = getattr(cand.venv, "latency_stats", None)
    if stats is not None:
        s = stats()
        out["call_p50_ms"], out["call_p99_ms"] = s.overall_p50 * 1e3, s.overall_p99 * 1e3
    return out


# ------------------------------------------------------------- game server


def server_cpu(pin: bool) -> int | None:
    """The CPU to pin the game server process to: the last one this process may use.

    ``None`` (no pinning) when ``pin`` is false, on one CPU, or where
    affinity cannot be set (not Linux).
    """
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-1] if len(cpus) > 1 else None


@contextmanager
def game_server(where: str, cpu: int | None = None) -> Iterator[tuple[int, int | None]]:
    """A loopback ``GameServer`` (``SERVER_LATENCY``) on a thread or in a process.

    Yields its port, and the server process's pid (``None`` for a thread).
    ``cpu``: pin the server process to that CPU (its threads included; a
    server thread is never pinned).  The clients may still use every CPU: the
    scheduler then keeps them off the server's CPU while it is busy, so the
    client's loop and the server do not take turns on one core.
    """
    if where == "thread":
        thread = GameServer(latency=SERVER_LATENCY).start_in_thread()
        try:
            yield thread.port, None
        finally:
            thread.stop()
        return
    # A process of its own: print the port, serve until the parent closes our stdin.
    code = (
        "import asyncio, os, sys\n"
        "if sys.argv[2] != '-':\n"
        "    os.sched_setaffinity(0, {int(sys.argv[2])})\n"
        "from aiovec.gameserver import GameServer\n"
        "async def main():\n"
        "    async with GameServer(latency=float(sys.argv[1])) as server:\n"
        "        print(server.port, flush=True)\n"
        "        await asyncio.to_thread(sys.stdin.read)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(SERVER_LATENCY), "-" if cpu is None else str(cpu)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the game server process did not start (said {line!r})")
        yield int(line), proc.pid
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------ memory probe


MEMORY_ENVS: dict[str, type[AsyncTrivialEnv]] = {"sleep": SleepEnv, "trivial": AsyncTrivialEnv}
"""The envs the memory probe can build, by name."""


def memory_probe(kind: str, num_envs: int, env: str = "sleep") -> dict[str, float]:
    """In a fresh process: RSS growth of ``num_envs`` envs, bare or in an aiovec vector env.

    ``env`` names the env of `MEMORY_ENVS` (``SleepEnv`` by default).

    Both kinds first build, reset, step and close a small vector env and a few
    bare envs, so that imports and caches are in place before the first reading.
    """
    env_cls = MEMORY_ENVS[env]
    runner = asyncio.Runner()
    actions = np.zeros(num_envs, dtype=np.int64)
    keep: list[aiovec.AsyncioVectorEnv[Any, Any]] = []
    readings: list[int] = []

    async def warm_up() -> None:
        small: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv([env_cls] * 16)
        async with small:
            await small.reset(seed=0)
            await small.step(actions[:16])
        envs = [env_cls() for _ in range(16)]
        await asyncio.gather(*[e.reset(seed=i) for i, e in enumerate(envs)])
        await asyncio.gather(*[e.step(0) for e in envs])

    async def bare() -> Callable[[], Awaitable[object]]:
        envs = [env_cls() for _ in range(num_envs)]
        for i, env in enumerate(envs):  # resets do not wait: no task needed, as in aiovec
            await env.reset(seed=i)
        readings.append(rss_bytes() or 0)
        return lambda: asyncio.gather(*[e.step(0) for e in envs])

    async def vector() -> Callable[[], Awaitable[object]]:
        venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv([env_cls] * num_envs)
        keep.append(venv)
        await venv.reset(seed=0)
        readings.append(rss_bytes() or 0)
        return lambda: venv.step(actions)

    async def probe() -> None:
        await warm_up()
        gc.collect()
        readings.append(rss_bytes() or 0)
        step = await (bare() if kind == "bare" else vector())
        for _ in range(3):
            await step()
        gc.collect()
        readings.append(rss_bytes() or 0)

    try:
        runner.run(probe())
    finally:
        for venv in keep:
            runner.run(venv.close())
        runner.close()
    start, reset, stepped = readings
    return {"after_reset": reset - start, "after_steps": stepped - start}


def run_memory_probes(num_envs: int, repeats: int, env: str = "sleep") -> dict[str, Any]:
    """aiovec's own memory per env: fresh processes, ``repeats`` each, medians.

    ``env`` names the env of `MEMORY_ENVS`.
    """
    got: dict[str, list[dict[str, float]]] = {"bare": [], "aiovec": []}
    for _ in range(repeats):
        for kind, readings in got.items():
            out = subprocess.run(
                [sys.executable, __file__, "--memory-probe", kind, str(num_envs), env],
                check=True,
                capture_output=True,
                text=True,
                timeout=300,
            )
            readings.append(json.loads(out.stdout.strip().splitlines()[-1]))

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in got[kind])

    result: dict[str, Any] = {"num_envs": num_envs, "repeats": repeats, "env": env, "raw": got}
    for key in ("after_reset", "after_steps"):
        bare, vector = median("bare", key), median("aiovec", key)
        result[f"bare_kb_per_env_{key}"] = bare / num_envs / 1024
        result[f"aiovec_kb_per_env_{key}"] = (vector - bare) / num_envs / 1024
    return result


# ------------------------------------------------------------------- targets


def find(rows: Sequence[dict[str, Any]], case: str, n: int, prefix: str) -> dict[str, Any] | None:
    """The row of the candidate named ``prefix...`` in the case ``case...`` with N = ``n``."""
    for r in rows:
        if r["case"].startswith(case) and r["case_envs"] == n and r["candidate"].startswith(prefix):
            return r
    return None


def add_own_overhead(rows: Sequence[dict[str, Any]]) -> None:
    """``own_us_per_env_step`` for each aiovec row that has a bare ``gather`` beside it.

    aiovec's own cost: its step time minus that of a bare ``asyncio.gather``
    over the same env coroutines on the same kind of loop, per env, paired
    repetition by repetition (the median of the paired differences).  The
    difference to the wait itself (``overhead_us_per_env_step``) also counts
    what the event loop spends on every waiting env, which no implementation
    on that loop avoids.
    """
    for r in rows:
        name = r["candidate"]
        if name.startswith("aiovec await ("):
            loop = name.removeprefix("aiovec await (").rstrip(")")
        elif name == "aiovec blocking":
            loop = "asyncio"
        else:
            continue
        bare = find(rows, r["case"], r["case_envs"], f"bare asyncio.gather ({loop})")
        if bare is None or bare["case"] != r["case"]:
            continue
        pairs = zip(r["seconds"], bare["seconds"], strict=True)
        per_env = r["steps"] * r["num_envs"]
        r["own_us_per_env_step"] = statistics.median((x - y) / per_env * 1e6 for x, y in pairs)
        r["own_baseline"] = bare["candidate"]


def rate_ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median over repetitions of the paired ratio of env-steps/s, ``a`` over ``b``."""
    pairs = zip(a["seconds"], b["seconds"], strict=True)
    return float(statistics.median((a["num_envs"] / x) / (b["num_envs"] / y) for x, y in pairs))


def time_ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median over repetitions of the paired ratio of step times, ``a`` over ``b``."""
    pairs = zip(a["seconds"], b["seconds"], strict=True)
    return float(statistics.median(x / y for x, y in pairs))


def targets(
    rows: Sequence[dict[str, Any]], memory: dict[str, Any] | None, tcp: str
) -> list[dict[str, Any]]:
    """The project's targets, each with its measured value and PASS/MISS."""
    out: list[dict[str, Any]] = []

    def add(what: str, value: float, op: str, limit: float, unit: str = "") -> None:
        passed = value <= limit if op == "<=" else value >= limit
        out.append(
            {"target": what, "value": value, "op": op, "limit": limit, "unit": unit}
            | {"passed": passed}
        )

    sleep = f"sleep {SLEEP * 1e3:g} ms"
    mine = "aiovec await (asyncio)"
    for front in (mine, "aiovec await (uvloop)", "aiovec blocking"):
        if r := find(rows, sleep, 256, front):
            add(f"sleep N=256, {front}: ms/step", r["ms_per_step"], "<=", 1.3 * SLEEP * 1e3)
    for n in (64, 256):
        for front in (mine, "aiovec await (uvloop)"):
            if r := find(rows, sleep, n, front):
                total = r["overhead_us_per_env_step"]
                add(f"sleep N={n}, {front}: (step - 5 ms) / N, us", total, "<=", 5.0)
                if "own_us_per_env_step" in r:
                    own = r["own_us_per_env_step"]
                    add(f"sleep N={n}, {front}: aiovec's own, us/env-step", own, "<=", 5.0)
        for other, limit in (("gymnasium AsyncVectorEnv", 4.0), ("thread pool", 1.3)):
            a, b = find(rows, sleep, n, mine), find(rows, sleep, n, other)
            if a and b:
                add(f"sleep N={n}: env-steps/s, {mine} / {other}", rate_ratio(a, b), ">=", limit)
    for front in (mine, "aiovec await (uvloop)"):
        for other, limit in (("gymnasium AsyncVectorEnv", 5.0), ("thread pool", 2.0)):
            a, b = find(rows, tcp, 256, front), find(rows, tcp, 256, other)
            if a and b:
                add(f"tcp N=256: env-steps/s, {front} / {other}", rate_ratio(a, b), ">=", limit)
    if r := find(rows, sleep, 64, "aiovec backend=thread"):
        add("thread backend, N=64: ms/step", r["ms_per_step"], "<=", 1.5 * SLEEP * 1e3)
    full, part = (
        find(rows, "partial", 256, "aiovec step()"),
        find(rows, "partial", 256, "aiovec send"),
    )
    if full and part:
        add("partial N=256: env-steps/s, send/recv / step", rate_ratio(part, full), ">=", 2.0)
    many = max((r["case_envs"] for r in rows if r["case"] == sleep), default=0)
    if many > 256:
        for loop in loop_factories():
            a = find(rows, sleep, many, f"aiovec await ({loop})")
            b = find(rows, sleep, many, f"bare asyncio.gather ({loop})")
            if a and b:
                add(
                    f"N={many:,}, {loop}: step time, aiovec / bare gather",
                    time_ratio(a, b),
                    "<=",
                    1.2,
                )
    if memory is not None:
        own = memory["aiovec_kb_per_env_after_reset"]
        add(f"N={memory['num_envs']:,}: aiovec's own memory per env, KB", own, "<=", 20.0)
    two = over_one_loop(rows).get("aiovec process W=2")
    if two is not None:
        n = next(r["case_envs"] for r in rows if r["case"] == WORKERS_CASE)
        add(f"{WORKERS_CASE}, N={n:,}: env-steps/s, process W=2 / one loop", two, ">=", 3.0)
    return out


def over_one_loop(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The workers case: each candidate's env-steps/s over one loop's (paired ratios)."""
    case = [r for r in rows if r["case"] == WORKERS_CASE]
    base = next((r for r in case if r["candidate"] == ONE_LOOP), None)
    if base is None:
        return {}
    return {r["candidate"]: rate_ratio(r, base) for r in case if r is not base}


def tcp_cpu_notes(rows: Sequence[dict[str, Any]], where: str) -> list[str]:
    """Client CPU per env-step against aiovec's: what the ratios approach when the
    server's CPU is not on this machine."""
    case = f"tcp {SERVER_LATENCY * 1e3:g} ms (server {where})"
    mine = find(rows, case, 256, "aiovec await (asyncio)")
    if mine is None or "cpu_us_per_env_step" not in mine:
        return []
    parts = []
    for other in ("gymnasium AsyncVectorEnv", "thread pool", "aiovec backend=thread"):
        r = find(rows, case, 256, other)
        if r is not None and "cpu_us_per_env_step" in r:
            ratio = r["cpu_us_per_env_step"] / mine["cpu_us_per_env_step"]
            parts.append(f"{r['candidate']} {r['cpu_us_per_env_step']:.0f} ({ratio:.2f}x)")
    server = mine.get("server_cpu_us_per_env_step")
    served = "" if server is None else f"; the server process used {server:.0f} us per request"
    return [
        f"{case}: client CPU per env-step, aiovec await (asyncio) "
        f"{mine['cpu_us_per_env_step']:.0f} us; " + ", ".join(parts) + served
    ]


# -------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def print_report(
    info: dict[str, str],
    rows: Sequence[dict[str, Any]],
    memory: dict[str, Any] | None,
    goals: Sequence[dict[str, Any]],
    notes: Sequence[str],
) -> None:
    print("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    print()
    print(
        "| case | N | candidate | ms/step | env-steps/s | overhead us/env-step "
        "| aiovec's own us/env-step | CPU us/env-step | memory MB | notes |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        memory_mb = _fmt(r["rss_mb"], ".1f")
        if r["child_pss_mb"] is not None:
            memory_mb += f" (PSS {r['child_pss_mb']:.0f})"
        extras = [r["note"]] if r["note"] else []
        if "server_cpu_us_per_env_step" in r:
            extras.append(f"server CPU {r['server_cpu_us_per_env_step']:.0f} us/env-step")
        if "call_p50_ms" in r:
            extras.append(
                f"latency_stats p50 {r['call_p50_ms']:.1f}, p99 {r['call_p99_ms']:.1f} ms"
            )
        print(
            f"| {r['case']} | {r['num_envs']} | {r['candidate']} | {r['ms_per_step']:.2f} "
            f"| {r['env_steps_per_s']:,.0f} | {_fmt(r['overhead_us_per_env_step'], '.1f')} "
            f"| {_fmt(r.get('own_us_per_env_step'), '.1f')} "
            f"| {_fmt(r.get('cpu_us_per_env_step'), '.1f')} | {memory_mb} | {'; '.join(extras)} |"
        )
    if memory is not None:
        print()
        print(
            f"Memory per env, N = {memory['num_envs']:,} (fresh processes, "
            f"median of {memory['repeats']}):"
        )
        print()
        print("| | after reset, KB/env | after 3 steps, KB/env |")
        print("|---|---:|---:|")
        for label, key in (
            ("bare SleepEnv objects", "bare"),
            ("aiovec's own (vector env minus bare envs)", "aiovec"),
        ):
            print(
                f"| {label} | {memory[f'{key}_kb_per_env_after_reset']:.2f} "
                f"| {memory[f'{key}_kb_per_env_after_steps']:.2f} |"
            )
    print()
    print("| target | measured | limit | result |")
    print("|---|---:|---:|---|")
    for g in goals:
        print(
            f"| {g['target']} | {g['value']:.2f} | {g['op']} {g['limit']:g} "
            f"| {'PASS' if g['passed'] else 'MISS'} |"
        )
    print()
    passed = sum(g["passed"] for g in goals)
    print(f"targets: {passed} PASS, {len(goals) - passed} MISS")
    for note in notes:
        print(f"note: {note}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke test: < 60 s, rough")
    parser.add_argument("--reps", type=int, help="repetitions (default 7, --quick 2)")
    parser.add_argument("--json", metavar="FILE", help="also write all timings as JSON")
    parser.add_argument(
        "--only", choices=CASES, action="append", help="run only this case (repeatable)"
    )
    parser.add_argument(
        "--io-workers",
        type=positive_ints,
        default=[1, 2],
        metavar="W,W,...",
        help="the workers case's worker counts (default 1,2; e.g. 1,2,4,8,16 on 16 cores)",
    )
    parser.add_argument(
        "--server",
        choices=("process", "thread", "both"),
        default="process",
        help="where the tcp case's game server runs (default: a process of its own)",
    )
    parser.add_argument(
        "--no-pin-server",
        dest="pin_server",
        action="store_false",
        help="do not pin the tcp case's game server process to the last CPU",
    )
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="do not gc.freeze() what the candidates hold once they are built",
    )
    parser.add_argument(
        "--memory-probe", nargs=3, metavar=("KIND", "N", "ENV"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 7
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    args.cases = tuple(args.only or CASES)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_probe:
        kind, n, env = args.memory_probe
        print(json.dumps(memory_probe(kind, int(n), env)))
        return 0
    # As overhead.py: measure what a script started from a terminal pays.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.perf_counter()
    info = machine_info()
    total = _proc_kb("/proc/meminfo", "MemTotal:")
    if total is not None:
        info["memory"] = f"{total / 2**20:.1f} GiB"
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    memory: dict[str, Any] | None = None
    if args.quick:
        notes.append(
            "--quick: no gymnasium AsyncVectorEnv, 10k and workers cases shrunk to 2,000 envs"
        )
    if not args.gc_freeze:
        notes.append("--no-gc-freeze: candidates' objects stay in the collected generations")

    def done(what: str) -> None:
        elapsed = time.perf_counter() - started
        print(f"  measured {what} ({elapsed:.0f} s)", file=sys.stderr, flush=True)

    if "sleep" in args.cases:
        for n in (64, 256):
            rows += run_case(sleep_case(n, args), args)
            done(f"sleep N={n}")
    servers = ("process", "thread") if args.server == "both" else (args.server,)
    if "tcp" in args.cases:
        cpu = server_cpu(args.pin_server)
        pinned = "not pinned" if cpu is None else f"pinned to CPU {cpu}"
        notes.append(f"tcp: the game server process was {pinned}")
        for where in servers:
            with game_server(where, cpu) as (port, pid):
                rows += run_case(tcp_case(256, port, pid, where, args), args)
            done(f"tcp (server {where})")
            notes += tcp_cpu_notes(rows, where)
    if "partial" in args.cases:
        rows += run_case(partial_case(256, args), args)
        latencies = [JitterSleepEnv(i).latency for i in range(256)]
        slowest = max(latencies)
        bound = sum(slowest / latency for latency in latencies) / len(latencies)
        notes.append(
            f"partial: a full-batch step waits for the slowest of 256 envs ({slowest * 1e3:.2f}"
            f" ms), an env in send/recv only for itself (1-20 ms, its own): with no overhead"
            f" the latencies would allow {bound:.2f}x"
        )
        done("partial")
    if "10k" in args.cases:
        n = 2_000 if args.quick else 10_000
        rows += run_case(many_case(n, args), args)
        done(f"N={n}")
        memory = run_memory_probes(n, 1 if args.quick else 3)
        done("memory")
    if "workers" in args.cases:
        n = WORKERS_ENVS // 10 if args.quick else WORKERS_ENVS
        rows += run_case(workers_case(n, args), args)
        done(f"workers N={n}")
        ratios = ", ".join(f"{name} {x:.2f}x" for name, x in over_one_loop(rows).items())
        notes.append(f"{WORKERS_CASE}, N={n:,}: env-steps/s over one loop: {ratios}")
    add_own_overhead(rows)
    goals = targets(rows, memory, f"tcp {SERVER_LATENCY * 1e3:g} ms (server {servers[0]})")
    info["load_avg_1min_end"] = f"{os.getloadavg()[0]:.2f}"
    print_report(info, rows, memory, goals, notes)
    elapsed = time.perf_counter() - started
    print(f"({args.reps} repetitions, {elapsed:.0f} s in all)")
    if args.json:
        report = {"machine": info, "argv": sys.argv, "reps": args.reps, "quick": args.quick}
        report |= {"rows": rows, "memory": memory, "targets": goals, "notes": notes}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report | {"elapsed_s": elapsed}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
