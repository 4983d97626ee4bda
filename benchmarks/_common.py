"""Timing helpers shared by the benchmarks (no aiovec imports here).

A benchmark is a list of *cases*; each case holds *candidates* (ways of doing the
same work) that are timed in turn inside every repetition, in a rotating order,
so that machine noise (other processes on a small machine) hits all of them
alike.  Each candidate reports seconds for ``steps`` vector steps; the helpers
turn that into microseconds per env-step and take medians over repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = (
    "Candidate",
    "LoopKind",
    "Measurement",
    "benchmark_module",
    "loop_factories",
    "machine_info",
    "positive_ints",
    "run_interleaved",
    "timed_async",
    "timed_sync",
)

LoopKind = str  # "asyncio" or "uvloop"


def loop_factories() -> dict[LoopKind, Callable[[], asyncio.AbstractEventLoop]]:
    """Event loop factories available here: always asyncio's, and uvloop's if installed."""
    factories: dict[LoopKind, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    try:
        import uvloop
    except ImportError:
        pass
    else:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


def benchmark_module(file_name: str) -> ModuleType:
    """Another benchmark script of this folder, loaded as a module (``io.py``: not ``io``).

    ``io.py`` cannot be imported by its name, which is the standard library's.  The
    module is registered in ``sys.modules`` as ``_<stem>_benchmark`` (cloudpickle
    needs that to send its classes to worker processes by value).
    """
    path = Path(__file__).with_name(file_name)
    name = f"_{path.stem}_benchmark"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed_sync(body: Callable[[], object], before: Callable[[], object] | None = None) -> float:
    """Run ``before`` (untimed), collect garbage, then return the seconds ``body`` takes."""
    if before is not None:
        before()
    gc.collect()
    start = time.perf_counter()
    body()
    return time.perf_counter() - start


async def timed_async(
    body: Callable[[], Coroutine[Any, Any, object]],
    before: Callable[[], Coroutine[Any, Any, object]] | None = None,
) -> float:
    """:func:`timed_sync` inside a running loop: the clock runs within the loop."""
    if before is not None:
        await before()
    gc.collect()
    start = time.perf_counter()
    await body()
    return time.perf_counter() - start


@dataclass
class Candidate:
    """One way of doing a case's work.

    ``run(steps)`` returns the seconds that ``steps`` vector steps took (the
    candidate resets and collects garbage itself, outside the timed region);
    ``close()`` releases what it holds.
    """

    name: str
    run: Callable[[int], float]
    close: Callable[[], object] = lambda: None
    seconds: list[float] = field(default_factory=list)


@dataclass
class Measurement:
    """Medians of one candidate in one case."""

    name: str
    us_per_env_step: float
    seconds: list[float]


def run_interleaved(
    candidates: Sequence[Candidate], *, steps: int, reps: int, warmup_steps: int
) -> None:
    """Time every candidate ``reps`` times, rotating the order in each repetition.

    Timings land in each candidate's ``seconds``; one untimed warm-up run each
    comes first.
    """
    for cand in candidates:
        cand.run(warmup_steps)
    n = len(candidates)
    for rep in range(reps):
        for k in range(n):
            cand = candidates[(rep + k) % n]
            cand.seconds.append(cand.run(steps))


def per_env_step_us(seconds: float, steps: int, num_envs: int) -> float:
    """Microseconds per env-step."""
    return seconds / (steps * num_envs) * 1e6


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over repetitions of the paired ratio ``num[i] / den[i]``."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, str]:
    """What the figures were measured on."""
    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": _cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "load_avg_1min": f"{os.getloadavg()[0]:.2f}",
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "gymnasium": _version("gymnasium"),
        "uvloop": _version("uvloop"),
        "aiovec": _version("aiovec"),
    }


def positive_ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: the argparse type of options that list counts."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers such as 1,2,4, got {text!r}"
        )
    return counts
