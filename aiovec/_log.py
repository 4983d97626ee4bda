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
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import time
from typing import Any

__all__ = (
    "DEFAULT_SLOW_SLICE",
    "MIN_SLOW_SLICE",
    "GcPauses",
    "held_by_env",
    "logger",
    "slow_slice_limit",
    "warn_slow_slice",
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


def warn_slow_slice(i: int, operation: str, seconds: float, limit: float) -> None:
    """Say that env ``i`` held the loop for ``seconds`` in one stretch of ``operation``."""
    logger.warning(
        "env %d held the event loop for %.3f s without awaiting, in %s() (the limit is the "
        "loop's slow_callback_duration, %g s): every other env waited meanwhile. Run a "
        "blocking env with backend='thread', a CPU-bound one with backend='process' "
        "(this is said once per env)",
        i,
        seconds,
        operation,
        limit,
    )


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
