"""Objects aiovec keeps alive per async env-step: counted, not timed (deterministic).

Run from the repository root::

    python benchmarks/allocations.py              # every case, ~10 s
    python benchmarks/allocations.py --quick      # CI smoke test, small N, a few seconds
    python benchmarks/allocations.py --memory 100000   # + aiovec's own RSS per env
    python benchmarks/allocations.py --json allocations.json

Why count rather than time: CPython's cyclic garbage collector runs when the
number of container objects *alive at once* has grown by its threshold (700
by default; objects freed by reference counting give their count back), and
each collection walks every young object, older ones every tenth and
hundredth time.  So what a step keeps alive while it runs, per env, is what
drives the collector's work as N grows; and unlike a timing, it does not
depend on a busy machine.

How it counts: ``gc.collect()``, then ``gc.disable()`` while one vector step
runs (after warm-up steps), so that every container object created since is
still in generation 0; a *reading* is ``len(gc.get_objects(0))`` (objects the
collector would walk) and the growth of ``sys.getallocatedblocks()`` (every
small-object allocation, containers or not; objects kept on CPython's free
lists count as allocated, so blocks can hide some churn).  Readings are taken:

``never suspends`` (``AsyncTrivialEnv``, N = 64 and 512)
    while the first and the last env's ``step`` runs.
    *kept per env*: growth between the first and the last env, over N - 1
    (what each env's result holds until the batch is built); *in flight at
    one env*: growth up to the first env's ``step`` (the call's fixed cost
    plus one env's call in flight).  The floor is a bare driver that sends
    ``None`` into each env's ``step`` coroutine and keeps the results in a list.
``suspends`` (each env's ``step`` awaits a future of its own, N = 1,000
    and 10,000)
    once every env is suspended and the loop has settled (three iterations
    later), per env.  *env's own*: the env coroutines suspended by hand, with
    nothing driving them (a coroutine, its future and the future's
    iterator each); a bare ``asyncio.gather`` adds a Task (and its context)
    per env.

Every case also counts the cyclic garbage the step left: what ``gc.collect()``
finds unreachable afterwards, per env (reference cycles, which only the
collector frees); and the calls one more step makes, per env: Python calls
(generator and coroutine resumptions included) and calls of C functions, as
``sys.setprofile`` sees them, a deterministic measure of the interpreter's
work where timings are not to be trusted.

``--memory N`` adds aiovec's own resident memory per env over N
``AsyncTrivialEnv`` on inline, measured in fresh processes by
``benchmarks/io.py``'s memory probe: the RSS growth of building, resetting and
stepping the vector env, minus that of as many bare envs, per env.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
from _common import benchmark_module

import aiovec
from aiovec.testing import AsyncTrivialEnv

Reading = tuple[int, int]  # (GC objects in generation 0, allocated blocks)
Counted = tuple[Reading, int, tuple[int, int]]
"""The reading before a step, the cyclic garbage it left, its (Python, C) calls."""


def reading() -> Reading:
    """Objects the collector would walk now (generation 0), and allocated blocks."""
    young = len(gc.get_objects(0))
    return young, sys.getallocatedblocks()


def grown(after: Reading, before: Reading, per: int = 1) -> tuple[float, float]:
    """Growth between two readings, per ``per``."""
    return (after[0] - before[0]) / per, (after[1] - before[1]) / per


@contextlib.contextmanager
def calls_counted(counts: list[int]) -> Iterator[None]:
    """Count the Python calls (generator resumptions included) and C calls in the block.

    ``counts`` becomes ``[python, c]``: ``sys.setprofile``'s ``call`` and
    ``c_call`` events, a deterministic measure of the interpreter's work.
    """
    counts[:] = [0, 0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[0] += 1
        elif event == "c_call":
            counts[1] += 1

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    """Collect, then keep the collector off (every new object stays in generation 0)."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Probe:
    """Takes readings at chosen ``step`` calls, and releases waiting envs."""

    def __init__(self) -> None:
        self.calls = 0
        self.at: tuple[int, ...] = ()
        self.marks: dict[int, Reading] = {}
        self.waiting: list[asyncio.Future[None]] = []
        self.expect = 0

    def arm(self, at: tuple[int, ...] = (), expect: int = 0) -> None:
        """Read at the ``at``-th step calls from now; release once ``expect`` envs wait."""
        self.calls, self.at, self.marks, self.expect = 0, at, {}, expect
        self.waiting.clear()

    def tick(self) -> None:
        self.calls += 1
        if self.calls in self.at:
            self.marks[self.calls] = reading()

    def arrived(self, future: asyncio.Future[None]) -> None:
        self.waiting.append(future)
        if len(self.waiting) == self.expect:
            future.get_loop().call_soon(self.settle, 3)

    def settle(self, hops: int) -> None:
        """After ``hops`` more loop iterations: read, then wake every waiting env."""
        if hops:
            asyncio.get_running_loop().call_soon(self.settle, hops - 1)
            return
        self.marks[0] = reading()
        for future in self.waiting:
            future.set_result(None)
        self.waiting.clear()


PROBE = Probe()
_OBS = AsyncTrivialEnv.observation_space.sample() * 0


class CountingEnv(AsyncTrivialEnv):
    """``AsyncTrivialEnv`` whose ``step`` lets the probe read (it never suspends)."""

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        PROBE.tick()
        return _OBS, 1.0, False, False, {}


class WaitingEnv(AsyncTrivialEnv):
    """An async env whose ``step`` awaits a future of its own (a reply, say)."""

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        PROBE.arrived(future)
        await future
        return _OBS, 1.0, False, False, {}


# ------------------------------------------------------------------ counting


def count_sync(step: Callable[[], Any], at: tuple[int, ...], expect: int) -> Counted:
    """The reading before one ``step()`` (after warm-up, the collector off), and more.

    Also the garbage, what ``gc.collect()`` finds unreachable after the step
    (reference cycles, which only the collector frees), and the calls made by
    one more step.
    """
    for _ in range(3):
        PROBE.arm(expect=expect)
        step()
    with gc_off():
        PROBE.arm(at, expect)
        before = reading()
        step()
        garbage = gc.collect()
    calls: list[int] = []
    marks = PROBE.marks  # the counted step's
    PROBE.arm(expect=expect)
    with calls_counted(calls):
        step()
    PROBE.marks = marks
    return before, garbage, (calls[0], calls[1])


async def count_async(
    step: Callable[[], Awaitable[Any]], at: tuple[int, ...], expect: int
) -> Counted:
    """`count_sync` inside a running loop: ``step()`` is awaited."""
    for _ in range(3):
        PROBE.arm(expect=expect)
        await step()
    with gc_off():
        PROBE.arm(at, expect)
        before = reading()
        await step()
        garbage = gc.collect()
    calls: list[int] = []
    marks = PROBE.marks  # the counted step's
    PROBE.arm(expect=expect)
    with calls_counted(calls):
        await step()
    PROBE.marks = marks
    return before, garbage, (calls[0], calls[1])


def eager_row(name: str, n: int, counted: Counted) -> dict[str, Any]:
    before, garbage, calls = counted
    first, last = PROBE.marks[1], PROBE.marks[n]
    return {
        "case": "never suspends",
        "candidate": name,
        "num_envs": n,
        "kept_per_env": grown(last, first, n - 1),
        "in_flight_at_one_env": grown(first, before),
        "garbage_per_env": garbage / n,
        "calls_per_env": (calls[0] / n, calls[1] / n),
    }


def waiting_row(name: str, n: int, counted: Counted) -> dict[str, Any]:
    before, garbage, calls = counted
    return {
        "case": "suspends",
        "candidate": name,
        "num_envs": n,
        "alive_per_env": grown(PROBE.marks[0], before, n),
        "garbage_per_env": garbage / n,
        "calls_per_env": (calls[0] / n, calls[1] / n),
    }


def send_each(envs: list[Any], actions: np.ndarray) -> list[Any]:
    """The floor: drive each env's ``step`` coroutine by hand, keep each value."""
    out = []
    for env, action in zip(envs, actions, strict=True):
        try:
            env.step(action).send(None)
        except StopIteration as stop:
            out.append(stop.value)
    return out


# ------------------------------------------------------------------ the cases


def run_case(env_cls: type[AsyncTrivialEnv], n: int) -> list[dict[str, Any]]:
    """Every candidate over ``n`` envs of ``env_cls`` (never suspends, or suspends)."""
    actions = np.zeros(n, dtype=np.int64)
    waits = env_cls is WaitingEnv
    at, expect = ((), n) if waits else ((1, n), 0)
    row = waiting_row if waits else eager_row
    rows = []
    runner = asyncio.Runner()
    try:
        envs = [env_cls() for _ in range(n)]
        if waits:

            async def by_hand() -> None:  # suspended with nothing driving them
                coros = [env.step(a) for env, a in zip(envs, actions, strict=True)]
                for coro in coros:
                    coro.send(None)
                PROBE.marks[0] = reading()
                for future in PROBE.waiting:
                    future.set_result(None)
                for coro in coros:
                    with contextlib.suppress(StopIteration):
                        coro.send(None)

            rows.append(
                row("env's own (suspended by hand)", n, runner.run(count_async(by_hand, at, n + 1)))
            )
        else:
            floor = count_sync(lambda: send_each(envs, actions), at, expect)
            rows.append(row("floor: coro.send(None)", n, floor))

        async def gathered() -> None:
            await asyncio.gather(*[e.step(a) for e, a in zip(envs, actions, strict=True)])

        rows.append(row("bare asyncio.gather", n, runner.run(count_async(gathered, at, expect))))

        async def build() -> aiovec.AsyncioVectorEnv[Any, Any]:
            venv: aiovec.AsyncioVectorEnv[Any, Any] = aiovec.AsyncioVectorEnv([env_cls] * n)
            await venv.reset(seed=0)
            return venv

        venv = runner.run(build())
        try:
            readings = runner.run(count_async(lambda: venv.step(actions), at, expect))
            rows.append(row("aiovec await (inline)", n, readings))
        finally:
            runner.run(venv.close())
    finally:
        runner.close()
    with aiovec.BlockingVectorEnv([env_cls] * n) as blocking:
        blocking.reset(seed=0)
        readings = count_sync(lambda: blocking.step(actions), at, expect)
        rows.append(row("aiovec blocking (inline)", n, readings))
    return rows


# ------------------------------------------------------------------ memory


def memory_per_env(num_envs: int, repeats: int) -> dict[str, Any]:
    """aiovec's own RSS per env over ``AsyncTrivialEnv`` (``benchmarks/io.py``'s probe)."""
    io = benchmark_module("io.py")
    result: dict[str, Any] = io.run_memory_probes(num_envs, repeats, env="trivial")
    return result


# ------------------------------------------------------------------ report


def fmt(value: Any) -> str:
    """A figure, or a pair ``GC objects / blocks``."""
    if isinstance(value, tuple):
        return f"{value[0]:.2f} / {value[1]:.2f}"
    return f"{value:.2f}"


TABLES = {
    "never suspends": ("kept_per_env", "in_flight_at_one_env", "garbage_per_env", "calls_per_env"),
    "suspends": ("alive_per_env", "garbage_per_env", "calls_per_env"),
}


def print_report(rows: list[dict[str, Any]], memory: dict[str, Any] | None) -> None:
    print(
        f"Python {sys.version.split()[0]}, aiovec {aiovec.__version__}; pairs are"
        " GC objects / blocks, or Python calls / C calls"
    )
    for case, columns in TABLES.items():
        print(f"\n{case}\n\n| candidate | N | {' | '.join(columns)} |")
        print("|---|---:|" + "---:|" * len(columns))
        for r in rows:
            if r["case"] == case:
                figures = " | ".join(fmt(r[c]) for c in columns)
                print(f"| {r['candidate']} | {r['num_envs']} | {figures} |")
    if memory is not None:
        print(
            f"\nN = {memory['num_envs']:,} AsyncTrivialEnv on inline, fresh processes, median of"
            f" {memory['repeats']}: aiovec's own RSS per env"
            f" {memory['aiovec_kb_per_env_after_reset']:.2f} KB after reset,"
            f" {memory['aiovec_kb_per_env_after_steps']:.2f} KB after steps (the envs alone:"
            f" {memory['bare_kb_per_env_after_steps']:.2f} KB)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small N only (CI smoke test)")
    parser.add_argument("--memory", type=int, metavar="N", help="also aiovec's own RSS per env")
    parser.add_argument("--json", metavar="PATH", help="write every figure here")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for n in (64,) if args.quick else (64, 512):
        rows += run_case(CountingEnv, n)
    for n in (1_000,) if args.quick else (1_000, 10_000):
        rows += run_case(WaitingEnv, n)
    memory = None
    if args.memory:
        memory = memory_per_env(args.memory, 1 if args.quick else 3)
    print_report(rows, memory)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"python": sys.version, "rows": rows, "memory": memory}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
