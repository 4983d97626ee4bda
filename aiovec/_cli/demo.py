"""``python -m aiovec demo``: why aiovec exists, in one command.

Theory of operation
-------------------
The demo starts `aiovec.gameserver.GameServer` on a thread of its own
(a loopback TCP server that answers every ``reset``/``step`` after
``latency`` seconds, plus seeded jitter): it stands in for a remote simulator
or a game client.  N envs are its clients, one connection each, and the same
N envs are stepped three ways, with the same seeded random actions:

(a) one after another, as ``gymnasium.vector.SyncVectorEnv`` does, over the
    blocking client `BlockingGameClientEnv`: a
    vector step costs N round trips;
(b) through `aiovec.BlockingVectorEnv` (no ``await`` in sight);
(c) through `aiovec.AsyncioVectorEnv` with ``await``.

(b) and (c) run the async client `GameClientEnv`
on the chosen backend (``inline`` or ``process``), or the blocking client on
``thread``.  Every vector step is timed on its own; the table shows
env-steps per second, the p50/p99 of a vector step and the speed-up over (a).
(a) is so slow that it is timed over a fortieth of the steps (at least 3).

Every vector env is closed in a ``finally`` and the server is stopped by its
``with`` block, so Ctrl-C at any point leaves no connection, thread or
process behind (aiovec's front ends cancel and unwind the step in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np

import aiovec
from aiovec._cli.args import non_negative_float, positive_int
from aiovec._cli.report import Progress, StepTimes, format_table, large_n_advice
from aiovec._core.validate import BACKENDS as ALL_BACKENDS
from aiovec.gameserver import BlockingGameClientEnv, GameClientEnv, GameServer

__all__ = ("DemoSettings", "Row", "add_parser", "render", "run", "run_demo")

BACKENDS = tuple(
    name for name in ALL_BACKENDS if name not in {"ray", "remote"}
)  # a cluster, a server
NUM_ACTIONS = 5  # the game's Discrete(5) moves


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs.

    Attributes:
        num_envs: Envs (connections to the server).
        latency: Seconds the server waits before each reply.
        jitter: Up to this many extra seconds per reply (seeded).
        steps: Vector steps timed through each of aiovec's front ends.
        backend: The backend of (b) and (c).
    """

    num_envs: int = 64
    latency: float = 0.005
    jitter: float = 0.001
    steps: int = 200
    backend: str = "inline"

    @property
    def sequential_steps(self) -> int:
        """Vector steps timed one env after another (it is slow): a fortieth, at least 3."""
        return max(3, self.steps // 40)


@dataclass(frozen=True)
class Row:
    """One way of stepping and what it measured."""

    name: str
    times: StepTimes


def run_demo(settings: DemoSettings, progress: Progress) -> list[Row]:
    """Start the server, time the three ways, stop the server; rows in order (a), (b), (c)."""
    rng = np.random.default_rng(0)
    actions = rng.integers(0, NUM_ACTIONS, size=(settings.steps, settings.num_envs))
    server = GameServer(latency=settings.latency, jitter=settings.jitter)
    with server.start_in_thread() as thread:
        port = thread.port
        sequential = _sequential(port, settings, actions[: settings.sequential_steps], progress)
        blocking = _blocking(port, settings, actions, progress)
        awaited = asyncio.run(_awaited(port, settings, actions, progress))
    on = f'backend="{settings.backend}"'
    return [
        Row("(a) one after another (gymnasium SyncVectorEnv)", sequential),
        Row(f"(b) aiovec.BlockingVectorEnv, {on}", blocking),
        Row(f"(c) aiovec.AsyncioVectorEnv + await, {on}", awaited),
    ]


def _client(port: int, backend: str) -> Callable[[], Any]:
    """The env factory of (b) and (c): the async client, or the blocking one on threads."""
    cls = BlockingGameClientEnv if backend == "thread" else GameClientEnv
    return functools.partial(cls, port=port)


def _sequential(
    port: int, settings: DemoSettings, actions: np.ndarray, progress: Progress
) -> StepTimes:
    progress.phase(f"(a) {len(actions)} steps, one env after another")
    envs = gymnasium.vector.SyncVectorEnv(
        [functools.partial(BlockingGameClientEnv, port=port)] * settings.num_envs
    )
    try:
        envs.reset(seed=0)
        return StepTimes(settings.num_envs, _timed(envs.step, actions, progress))
    finally:
        envs.close()


def _blocking(
    port: int, settings: DemoSettings, actions: np.ndarray, progress: Progress
) -> StepTimes:
    progress.phase(f"(b) {len(actions)} steps, aiovec.BlockingVectorEnv")
    fns = [_client(port, settings.backend)] * settings.num_envs
    with aiovec.BlockingVectorEnv(fns, backend=settings.backend) as envs:
        envs.reset(seed=0)
        return StepTimes(settings.num_envs, _timed(envs.step, actions, progress))


async def _awaited(
    port: int, settings: DemoSettings, actions: np.ndarray, progress: Progress
) -> StepTimes:
    progress.phase(f"(c) {len(actions)} steps, aiovec.AsyncioVectorEnv + await")
    fns = [_client(port, settings.backend)] * settings.num_envs
    venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv(fns, backend=settings.backend)
    async with venv:
        await venv.reset(seed=0)
        return StepTimes(settings.num_envs, await _timed_async(venv.step, actions, progress))


def _timed(
    step: Callable[[Any], object], actions: np.ndarray, progress: Progress
) -> tuple[float, ...]:
    seconds = []
    for batch in actions:
        start = time.perf_counter()
        step(batch)
        seconds.append(time.perf_counter() - start)
        progress.advance()
    return tuple(seconds)


async def _timed_async(
    step: Callable[[Any], Awaitable[object]], actions: np.ndarray, progress: Progress
) -> tuple[float, ...]:
    seconds = []
    for batch in actions:
        start = time.perf_counter()
        await step(batch)
        seconds.append(time.perf_counter() - start)
        progress.advance()
    return tuple(seconds)


def render(rows: Sequence[Row], settings: DemoSettings) -> str:
    """The demo's report: the settings, the table, a one-line conclusion (and advice)."""
    base = rows[0].times
    table = format_table(
        ["how", "env-steps/s", "step p50", "step p99", "speed-up"],
        [
            [
                row.name,
                f"{row.times.rate:,.0f}",
                f"{row.times.percentile_ms(50):.1f} ms",
                f"{row.times.percentile_ms(99):.1f} ms",
                f"{row.times.rate / base.rate:.1f}x",
            ]
            for row in rows
        ],
    )
    n, ms = settings.num_envs, settings.latency * 1e3
    intro = (
        f"{n} network envs, each a TCP client of a loopback game server that answers "
        f"every request after {ms:g} ms (+ up to {settings.jitter * 1e3:g} ms of jitter)."
    )
    steps = (
        f"A step is one vector step of all {n} envs; (a) was timed over {base.steps} steps, "
        f"(b) and (c) over {rows[1].times.steps} each."
    )
    advice = large_n_advice(n)
    lines = [intro, "", table, "", steps, _conclusion(rows, settings)]
    return "\n".join([*lines, advice] if advice else lines)


def _conclusion(rows: Sequence[Row], settings: DemoSettings) -> str:
    base = rows[0].times
    best = max(rows[1:], key=lambda row: row.times.rate).times
    speedup = best.rate / base.rate
    n = settings.num_envs
    if speedup < 2:
        return (
            f"With {settings.latency * 1e3:g} ms per reply there is little waiting to overlap: "
            f"aiovec was {speedup:.1f}x as fast; it pays off when envs wait."
        )
    return (
        f"aiovec stepped {n} network envs {speedup:.0f}x faster: their round trips overlap, "
        f"so a vector step took {best.percentile_ms(50):.0f} ms instead of "
        f"{base.percentile_ms(50):.0f} ms for {n} round trips in a row."
    )


def add_parser(commands: Any) -> None:
    """Register the ``demo`` command on an ``argparse`` sub-parser collection."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="network envs stepped one after another, then with aiovec",
        description=(
            "Start a loopback game server, connect N envs to it and step them one after "
            "another (as gymnasium's SyncVectorEnv does), through aiovec.BlockingVectorEnv "
            "and through aiovec.AsyncioVectorEnv with await; print the speed-up."
        ),
    )
    defaults = DemoSettings()
    parser.add_argument(
        "--num-envs", type=positive_int, default=defaults.num_envs, help="envs (default: 64)"
    )
    parser.add_argument(
        "--latency",
        type=non_negative_float,
        default=defaults.latency,
        help="seconds the server waits before each reply (default: 0.005)",
    )
    parser.add_argument(
        "--steps",
        type=positive_int,
        default=defaults.steps,
        help="vector steps timed through each aiovec front end (default: 200)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=defaults.backend,
        help="where aiovec's envs live (default: inline)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo from parsed arguments; the exit status."""
    settings = DemoSettings(
        num_envs=args.num_envs,
        latency=args.latency,
        jitter=min(DemoSettings.jitter, args.latency),
        steps=args.steps,
        backend=args.backend,
    )
    progress = Progress(settings.sequential_steps + 2 * settings.steps)
    try:
        rows = run_demo(settings, progress)
    finally:
        progress.close()
    print(render(rows, settings))
    return 0
