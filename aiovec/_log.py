"""aiovec's logger, and what it says when an env holds the event loop.

Everything is logged on the ``aiovec`` logger with the standard ``logging``
module, at WARNING and only off the per-step path: a restart, giving up, a
timeout, an env that held the loop.  As the logging HOWTO advises libraries,
aiovec adds no handler: with no logging configured, Python's last-resort
handler prints these warnings to stderr; an application configures or silences
them like any other logger (``logging.getLogger("aiovec").setLevel(...)``).
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ("DEFAULT_SLOW_SLICE", "MIN_SLOW_SLICE", "logger", "slow_slice_limit", "warn_slow_slice")

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
