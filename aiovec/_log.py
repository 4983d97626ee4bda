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
preempted in the middle of any env's call.  The kernel tells the two apart: a
thread that blocks in a system call (``time.sleep``, a synchronous request)
gives up its CPU *voluntarily*, a preempted one *involuntarily*, and it counts
both per thread (``getrusage(RUSAGE_THREAD)``: ``ru_nvcsw``, ``ru_nivcsw``,
with the thread's CPU time).  `LoopHogs` reads these counters (`Counters`)
when a stretch was over the limit, and compares them with a reference read
before it (`LoopHogs.mark`, refreshed at the start of a batch of calls or a
loop iteration when it is older than `MARK_EVERY`: about a microsecond per
millisecond at most, nothing per env).  `judge` decides from the differences,
a pure rule: an env is named when the thread ran on a CPU for a fair share of
the stretch (at least ``1 / OFF_CPU``), or when it was never preempted (then
it ran or blocked in the env's call the whole time); a stretch that was
preempted and ran little names no env.  Where the platform has no per-thread
counters (not Linux), only the CPU-time rule names an env.  A vector env says
each kind of line once per kind of call (``step()``, ``reset()``, ...),
naming up to five envs, then a range or a count.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)

__all__ = (
    "DEFAULT_SLOW_SLICE",
    "MARK_EVERY",
    "MIN_SLOW_SLICE",
    "OFF_CPU",
    "Counters",
    "GcPauses",
    "LoopHogs",
    "Verdict",
    "held_by_env",
    "judge",
    "logger",
    "say_envs",
    "slow_slice_limit",
    "thread_counters",
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
"""A preempted stretch over this many times the thread's CPU time within it was the OS's."""

MARK_EVERY = 0.001
"""Seconds after which the reference counters are read again, at the next batch or loop turn."""


class Counters(NamedTuple):
    """The loop thread's clock and counters, read together (`thread_counters`)."""

    at: float  # time.perf_counter()
    cpu: float  # seconds this thread ran on a CPU
    voluntary: int  # times it gave up its CPU to wait (blocked in a system call); -1: unknown
    involuntary: int  # times the OS preempted it; -1: unknown
    thread: int = 0  # whose counters (threading.get_ident()): only a thread's own compare


def thread_counters() -> Counters:
    """This thread's `Counters`, now (two system calls: about two microseconds).

    The CPU time is the thread's CPU clock (``getrusage`` rounds it to the
    scheduler's tick); where the OS counts no context switches per thread
    (not Linux), both counts are -1.
    """
    at, cpu, thread = time.perf_counter(), time.thread_time(), threading.get_ident()
    if _RUSAGE_THREAD is None:
        return Counters(at, cpu, -1, -1, thread)
    usage = resource.getrusage(_RUSAGE_THREAD)
    return Counters(at, cpu, usage.ru_nvcsw, usage.ru_nivcsw, thread)


class Verdict(enum.Enum):
    """Who held the loop for a stretch (`judge`)."""

    CPU = "on the CPU"  # the env's call ran
    BLOCKED = "in a blocking call"  # the env's call waited without awaiting
    PREEMPTED = "preempted"  # the OS ran other work: no env is named
    UNKNOWN = "off the CPU"  # no switch counters here: no env is named


def judge(held: float, ran: float, voluntary: int, involuntary: int) -> Verdict:
    """Who held the loop for a stretch of ``held`` seconds: the env's call, or the OS.

    Args:
        held: The stretch's wall time, less the garbage collector's pauses.
        ran: Seconds the thread surely ran on a CPU within it (a lower bound).
        voluntary: The thread's voluntary context switches (it blocked) counted
            since a reference read before the stretch began; -1: unknown.
        involuntary: Its involuntary ones (the OS preempted it) likewise.

    Returns:
        ``CPU`` when it ran a fair share of the stretch (``1 / OFF_CPU``) or was
        never off the CPU; ``BLOCKED`` when it ran little and blocked: whatever
        it waited on, the env's call waited (nothing else runs in a stretch;
        if the OS also preempted it, part of the time may be the OS's, and the
        line says so); ``PREEMPTED`` when it ran little, never blocked and was
        preempted: the OS's, no env is to blame; ``UNKNOWN`` when it ran little
        and nothing says why.
    """
    if ran * OFF_CPU >= held:
        return Verdict.CPU
    if involuntary < 0:
        return Verdict.UNKNOWN
    if voluntary > 0:
        return Verdict.BLOCKED
    return Verdict.PREEMPTED if involuntary > 0 else Verdict.CPU


_NAMED = (Verdict.CPU, Verdict.BLOCKED)
_ADVICE = {
    Verdict.CPU: (
        "Run blocking envs with backend='thread'; for CPU-bound envs, backend='process' may be "
        "faster: `python -m aiovec bench` measures it"
    ),
    Verdict.BLOCKED: (
        "A synchronous call (time.sleep, requests.get, a blocking socket) stops every env: in an "
        "async env, await its async version (asyncio.sleep, an async client) or "
        "`await asyncio.to_thread(...)`; run synchronous envs that block with backend='thread'"
    ),
}


class LoopHogs:
    """One vector env's stretches that held the loop, said once per kind of call.

    The backend keeps `mark` recent (`refresh`) and hands every stretch over
    the limit to `slow`; `say` logs what was noted since it was last called:
    one line per verdict (`judge`) and kind of call, the envs named where the
    verdict blames them.

    Args:
        read: Reads the thread's `Counters` (`thread_counters`; a test gives its own).
    """

    __slots__ = ("_also", "_blamed", "_idle", "_said", "call", "mark", "noted", "read")

    def __init__(self, read: Callable[[], Counters] | None = None) -> None:
        self.read = read or thread_counters
        self.mark = self.read()  # the reference a stretch's counters are compared with
        self.call = ""  # the kind of call in progress (its op's name), for the lines
        self._blamed: dict[tuple[str, Verdict], dict[int, float]] = {}  # -> env -> longest
        self._also: dict[tuple[str, Verdict], int] = {}  # -> most preemptions in a stretch
        self._idle: dict[str, tuple[float, float, int]] = {}  # call -> (held, ran, preempted)
        self._said: set[tuple[str, Verdict]] = set()  # said already
        self.noted = False  # something waits to be said

    def refresh(self, now: float) -> None:
        """Read the reference again if it is older than `MARK_EVERY` (``now``: perf_counter)."""
        if now - self.mark.at > MARK_EVERY:
            self.mark = self.read()

    def slow(self, i: int, start: float, stop: float) -> None:
        """Env ``i`` held the loop from ``start`` to ``stop`` (over the limit): judge it."""
        mark, now = self.mark, self.read()
        self.mark = now
        paused = GC_PAUSES.within(start, stop)  # the collector's, not the env's (nor the OS's)
        held = (stop - start) - paused
        if held <= slow_slice_limit() or now.thread != mark.thread:
            return  # (read on another thread, the reference tells nothing of this one)
        # CPU time since the mark, less the wall time since it outside the stretch
        ran = (now.cpu - mark.cpu) - ((now.at - mark.at) - (stop - start)) - paused
        known = now.involuntary >= 0
        voluntary = now.voluntary - mark.voluntary if known else -1
        involuntary = now.involuntary - mark.involuntary if known else -1
        verdict = judge(held, ran, voluntary, involuntary)
        if (self.call, verdict) in self._said:
            return
        if verdict in _NAMED:
            key = (self.call, verdict)
            envs = self._blamed.setdefault(key, {})
            envs[i] = max(envs.get(i, 0.0), held)
            self._also[key] = max(self._also.get(key, 0), involuntary)
        else:
            known_idle = self._idle.get(self.call)
            if known_idle is None or known_idle[0] < held:
                self._idle[self.call] = (held, max(ran, 0.0), involuntary)
        self.noted = True

    def say(self) -> None:
        """Log what was noted: one line per kind of call and verdict."""
        limit = slow_slice_limit()
        for (call, verdict), envs in self._blamed.items():
            self._said.add((call, verdict))
            also = self._also[call, verdict] if verdict is Verdict.BLOCKED else 0
            logger.warning(
                "%s held the event loop %s for up to %.3f s without awaiting, in %s() (the limit "
                "is the loop's slow_callback_duration, %g s)%s: every other env waited meanwhile. "
                "%s (said once per vector env and call)",
                say_envs(sorted(envs)),
                verdict.value,
                max(envs.values()),
                call,
                limit,
                f"; the OS also preempted it {also} time(s), so some of that time may be the OS's"
                if also > 0
                else "",
                _ADVICE[verdict],
            )
        for call, (held, ran, preempted) in self._idle.items():
            self._said.add((call, Verdict.PREEMPTED if preempted >= 0 else Verdict.UNKNOWN))
            if preempted >= 0:
                why = (
                    f"the OS preempted it {preempted} time(s) to run other work (a loaded machine)"
                )
            else:
                why = (
                    "the OS ran other work meanwhile (a loaded machine), or a call blocked "
                    "without awaiting (a synchronous sleep or I/O: run blocking envs with "
                    "backend='thread'); this platform does not count which"
                )
            logger.warning(
                "the event loop was held for %.3f s in %s() (the limit is the loop's "
                "slow_callback_duration, %g s), but its thread ran on a CPU for only %.3f s of "
                "it: %s; no env is named (said once per vector env and call)",
                held,
                call,
                limit,
                ran,
                why,
            )
        self._blamed.clear()
        self._also.clear()
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
