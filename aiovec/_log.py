"""aiovec's logger, and what it says when an env holds the event loop.

Everything is logged on the ``aiovec`` logger with the standard ``logging``
module, at WARNING and only off the per-step path: a restart, giving up, a
timeout, an env that held the loop.  As the logging HOWTO advises libraries,
aiovec adds no handler: with no logging configured, Python's last-resort
handler prints these warnings to stderr; an application configures or silences
them like any other logger (``logging.getLogger("aiovec").setLevel(...)``).

An env's stretch on the loop is timed with the clock, and a pause of the
garbage collector inside it is not the env's doing: `held_by_env` takes the
collector's pauses out (`GcPauses`, fed by ``gc.callbacks``), so that many
envs whose objects make a long collection are never blamed for it.

Nor is a stretch the OS took: on a loaded machine the loop's thread may be
descheduled in the middle of any env's call.  `LoopHogs` names an env only
when the thread ran on a CPU (``time.thread_time``) for a fair share of the
stretch (at least ``1 / OFF_CPU`` of it); otherwise it says that the loop was
held without the thread running, and names no env.  Reading the thread's CPU
clock is a system call (about a microsecond), so it is read once at the start
of a batch of calls and once per slow stretch, never per env: the CPU time of
a stretch is bounded below by the CPU time since that reference minus the
wall time between the reference and the stretch's start (`cpu_within`).  A
vector env says each kind of line once per kind of call (``step()``,
``reset()``, ...), naming up to five envs, then a range or a count.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import time
from collections.abc import Sequence
from typing import Any

__all__ = (
    "DEFAULT_SLOW_SLICE",
    "MIN_SLOW_SLICE",
    "OFF_CPU",
    "CpuMark",
    "GcPauses",
    "LoopHogs",
    "cpu_mark",
    "cpu_within",
    "held_by_env",
    "logger",
    "say_envs",
    "slow_slice_limit",
)

logger = logging.getLogger("aiovec")

DEFAULT_SLOW_SLICE = 0.1
"""asyncio's own default ``slow_callback_duration``, in seconds."""

MIN_SLOW_SLICE = 0.001
"""A stretch shorter than this (seconds) is never reported, whatever the loop's limit:
the hot path of synchronous steps looks the limit up only past it."""


def slow_slice_limit() -> float:
    """Seconds one uninterrupted stretch of an env's call may hold the loop unremarked.

    The running loop's ``slow_callback_duration`` (the threshold asyncio's
    debug mode uses for callbacks), or asyncio's default without a loop.
    """
    loop = asyncio._get_running_loop()
    return getattr(loop, "slow_callback_duration", DEFAULT_SLOW_SLICE)


def say_envs(indices: Sequence[int]) -> str:
    """``env 3``, ``envs 0, 1, 2``, ``envs 0-255`` or ``40 envs`` for a log line (sorted)."""
    if len(indices) == 1:
        return f"env {indices[0]}"
    if len(indices) <= _HANDFUL:
        return "envs " + ", ".join(map(str, indices))
    if indices[-1] - indices[0] + 1 == len(indices):
        return f"envs {indices[0]}-{indices[-1]}"
    return f"{len(indices)} envs"


_HANDFUL = 5
"""Up to this many envs, a log line lists them; more are a range or a count."""

OFF_CPU = 10.0
"""A stretch whose wall time is over this many times the thread's CPU time was the OS's."""

CpuMark = tuple[float, float]
"""``(time.perf_counter(), time.thread_time())``, read together: a reference for `cpu_within`."""


def cpu_mark() -> CpuMark:
    """A reference for `cpu_within`, read now (a system call: about a microsecond)."""
    return time.perf_counter(), time.thread_time()


def cpu_within(mark: CpuMark, start: float, now: CpuMark) -> float:
    """Seconds this thread surely ran on a CPU between ``start`` and ``now``.

    ``mark`` was read before ``start``: between the two the thread ran for at
    most their wall time, so the CPU time since ``mark`` less that wall time is
    a lower bound of the CPU time since ``start``.
    """
    return (now[1] - mark[1]) - max(start - mark[0], 0.0)


class LoopHogs:
    """One vector env's stretches that held the loop, said once per kind of call.

    `note` judges a stretch over the limit; `say` logs what was noted since
    it was last called: one line naming the envs that held the loop on the
    CPU, and one for stretches the thread did not run for (no env named), each
    once per kind of call.
    """

    __slots__ = ("_blamed", "_idle", "_said", "noted")

    def __init__(self) -> None:
        self._blamed: dict[str, dict[int, float]] = {}  # call -> env -> longest stretch
        self._idle: dict[str, tuple[float, float]] = {}  # call -> (held, ran) of the longest
        self._said: set[tuple[str, bool]] = set()  # (call, blamed) said already
        self.noted = False  # something waits to be said

    def note(self, i: int, operation: str, start: float, stop: float, ran: float) -> None:
        """Env ``i`` held the loop from ``start`` to ``stop``; the thread ran ``ran`` s of it."""
        paused = GC_PAUSES.within(start, stop)  # the collector's, not the env's (nor the OS's)
        held = (stop - start) - paused
        if held <= slow_slice_limit():
            return
        blamed = (ran - paused) * OFF_CPU >= held
        if (operation, blamed) in self._said:
            return
        if blamed:
            envs = self._blamed.setdefault(operation, {})
            envs[i] = max(envs.get(i, 0.0), held)
        else:
            known = self._idle.get(operation)
            if known is None or known[0] < held:
                self._idle[operation] = (held, max(ran - paused, 0.0))
        self.noted = True

    def say(self) -> None:
        """Log what was noted: one line per kind of call and of line."""
        limit = slow_slice_limit()
        for operation, envs in self._blamed.items():
            self._said.add((operation, True))
            logger.warning(
                "%s held the event loop on the CPU for up to %.3f s without awaiting, in %s() "
                "(the limit is the loop's slow_callback_duration, %g s): every other env waited "
                "meanwhile. Run blocking envs with backend='thread'; for CPU-bound envs, "
                "backend='process' may be faster: `python -m aiovec bench` measures it (said "
                "once per vector env and call)",
                say_envs(sorted(envs)),
                max(envs.values()),
                operation,
                limit,
            )
        for operation, (held, ran) in self._idle.items():
            self._said.add((operation, False))
            logger.warning(
                "the event loop was held for %.3f s in %s() (the limit is the loop's "
                "slow_callback_duration, %g s), but its thread ran on a CPU for only %.3f s of "
                "it: the OS ran other work meanwhile (a loaded machine), or a call blocked "
                "without awaiting (a synchronous sleep or I/O: run blocking envs with "
                "backend='thread'); no env is named (said once per vector env and call)",
                held,
                operation,
                limit,
                ran,
            )
        self._blamed.clear()
        self._idle.clear()
        self.noted = False


class GcPauses:
    """The garbage collector's recent pauses, as ``(start, stop)`` on ``time.perf_counter``.

    One instance (`GC_PAUSES`) is registered in ``gc.callbacks`` by the first
    backend that times its envs' stretches, and stays: it costs two clock
    reads per collection.  Only the last `KEPT` pauses are kept; a stretch is checked
    at its end, so older ones never matter.
    """

    KEPT = 64

    def __init__(self) -> None:
        self.pauses: collections.deque[tuple[float, float]] = collections.deque(maxlen=self.KEPT)
        self._started = 0.0
        self._installed = False

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((self._started, time.perf_counter()))

    def install(self) -> None:
        """Start recording pauses (idempotent)."""
        if not self._installed:
            self._installed = True
            gc.callbacks.append(self)

    def within(self, start: float, stop: float) -> float:
        """Seconds the collector paused between ``start`` and ``stop``."""
        paused = 0.0
        for began, ended in reversed(self.pauses):
            if ended <= start:
                break
            paused += min(ended, stop) - max(began, start)
        return max(paused, 0.0)


GC_PAUSES = GcPauses()


def held_by_env(start: float, stop: float) -> float:
    """Seconds of the stretch ``start``..``stop`` that were not the garbage collector's.

    Called only for a stretch over the limit, so the hot path pays nothing.
    Pauses are recorded once `GcPauses.install` was called (a backend that
    times its envs' stretches calls it when it is made).
    """
    return (stop - start) - GC_PAUSES.within(start, stop)
