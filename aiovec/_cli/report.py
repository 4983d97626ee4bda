"""Timings, tables, a progress bar and advice for the commands (plain text, no dependency).

A command measures *vector steps*: each one is timed on its own, so a row can
say both how much work got done (env-steps per second, over the whole timed
run) and how long a learner waited for one batch (p50 and p99 of the step
times).  Tables are fixed-width text for a terminal or a CI log.  The progress
bar goes to stderr, so stdout holds only the results: on a terminal it is
redrawn in place at most ten times a second; anywhere else (a CI log, a pipe)
it prints one line when each phase starts, never a stream of carriage returns.
From `LARGE_N` envs on, both commands end with one line of advice on the garbage
collector (`large_n_advice`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from aiovec._cli.memory import PeakMemory

__all__ = ("LARGE_N", "Progress", "StepTimes", "format_table", "large_n_advice", "short", "timed")

LARGE_N = 1_000
"""From this many envs on, the commands point to the garbage collector's advice.

Measured on either side of it: at 256 envs that wait 5 ms, aiovec steps as fast as
a bare ``asyncio.gather`` or faster (docs/performance.md); at 10,000, turning the
cyclic garbage collector off more than halved a step's time.  At 1,000, a waiting
step keeps some 5,000 container objects alive at once (five per env, counted by
``benchmarks/allocations.py``), seven times the collector's default threshold of
700: it collects several times in every step, each time walking what is alive.
"""


def large_n_advice(num_envs: int) -> str:
    """One line of advice for ``num_envs`` >= `LARGE_N` envs, else ``""``.

    aiovec never changes the process's garbage collector settings: it says
    where the knobs are measured, and leaves the choice to the user.
    """
    if num_envs < LARGE_N:
        return ""
    return (
        f"Note: with {LARGE_N:,} envs or more, Python's garbage collector can take much of "
        "each step; gc.set_threshold(100_000) at the start halved it at 10,000-100,000 "
        "envs: see docs/performance.md, 'Running 1,000-100,000 envs' (also gc.freeze() "
        "after construction, uvloop)."
    )


@dataclass(frozen=True)
class StepTimes:
    """The measured vector steps of one configuration.

    Attributes:
        num_envs: Envs per vector step.
        seconds: Wall-clock seconds of each timed vector step, in order.
        cpu_seconds: CPU seconds this thread spent over those steps (``None``:
            not measured).
    """

    num_envs: int
    seconds: tuple[float, ...]
    cpu_seconds: float | None = None  # this thread's CPU time over the timed steps, if taken

    @property
    def steps(self) -> int:
        """How many vector steps were timed."""
        return len(self.seconds)

    @property
    def rate(self) -> float:
        """Env-steps per second over the timed steps."""
        return self.num_envs * self.steps / sum(self.seconds)

    def percentile_ms(self, q: float) -> float:
        """The ``q``-th percentile of the step times, in milliseconds."""
        return float(np.percentile(self.seconds, q)) * 1e3


async def timed(
    step: Callable[[int], Awaitable[Any]],
    num_envs: int,
    seconds: float,
    memory: PeakMemory,
    min_steps: int,
) -> StepTimes:
    """Time ``await step(k)`` (the k-th timed step) for ``seconds``, at least ``min_steps`` times.

    Resident memory is sampled before, as it goes and after; this thread's CPU
    time over the steps is kept (an inline env's blocking shows in it).
    """
    memory.sample()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    cpu = time.thread_time()
    while len(times) < min_steps or time.perf_counter() < deadline:
        start = time.perf_counter()
        await step(len(times))
        times.append(time.perf_counter() - start)
        memory.maybe_sample()
    cpu = time.thread_time() - cpu
    memory.sample()
    return StepTimes(num_envs, tuple(times), cpu)


def short(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Align ``rows`` under ``header``: the first column left, the others right.

    A column whose title is empty (a note) gets no rule under it.
    """
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rules = (("-" if title else " ") * width for title, width in zip(header, widths, strict=True))
    rule = "  ".join(rules)
    return "\n".join([line(header), rule.rstrip(), *(line(row) for row in rows)])


class Progress:
    """A progress bar over ``total`` units of work, on stderr.

    Args:
        total: Units of work in all phases together (at least 1).
        stream: Where to draw (default ``sys.stderr``).
        width: Characters of the bar itself.
    """

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self.label = ""
        self._live = self.stream.isatty()
        self._drawn_at = 0.0
        self._dirty = False

    def phase(self, label: str) -> None:
        """Start a phase: on a terminal it names the bar; elsewhere it prints a line."""
        self.label = label
        if self._live:
            self._draw(force=True)
        else:
            print(f"... {label}", file=self.stream, flush=True)

    def advance(self, units: int = 1) -> None:
        """Record ``units`` more of work done."""
        self.done = min(self.done + units, self.total)
        if self._live:
            self._draw(force=False)

    def close(self) -> None:
        """End the bar's line (call it before printing anything else)."""
        if self._live and self._dirty:
            print(file=self.stream, flush=True)
            self._dirty = False

    def _draw(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._drawn_at < 0.1 and self.done < self.total:
            return
        self._drawn_at = now
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        percent = 100 * self.done // self.total
        self.stream.write(f"\r[{bar}] {percent:3d}%  {self.label}\x1b[K")
        self.stream.flush()
        self._dirty = True
