"""``max_concurrency``: at most K env calls in flight, through an anyio ``CapacityLimiter``.

The limiter may be shared by several vector envs that talk to one server.  A
call takes a token without waiting when one is free (so an eager call stays
eager) and otherwise waits for one; the time it spends queued counts neither
for its deadline nor for its latency, and it gives the token back when it
has finished.  This module is the only place that touches a limiter: inline
wraps a call's coroutine in `limited`; the thread backend, whose calls run on
threads, takes and gives back tokens around each job with the functions below.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio

__all__ = ("give_back", "limited", "take_now", "take_waiting")


def take_now(limiter: anyio.CapacityLimiter, token: object) -> bool:
    """Take one of ``limiter``'s tokens as ``token`` if one is free now; whether it did."""
    try:
        limiter.acquire_on_behalf_of_nowait(token)
    except anyio.WouldBlock:
        return False
    return True


async def take_waiting(
    limiter: anyio.CapacityLimiter, token: object, queue: Callable[[bool], None] | None = None
) -> None:
    """Wait for one of ``limiter``'s tokens as ``token``.

    ``queue(True)`` is called before the wait and ``queue(False)`` once it is
    over (the token is held, or the wait was cancelled), so that neither the
    env's deadline nor its latency counts the time spent queued.  A caller that
    marks the queued time itself passes no ``queue``.
    """
    if queue is None:
        await limiter.acquire_on_behalf_of(token)
        return
    queue(True)
    try:
        await limiter.acquire_on_behalf_of(token)
    finally:
        queue(False)


def give_back(limiter: anyio.CapacityLimiter, token: object) -> None:
    """Return the token held as ``token``."""
    limiter.release_on_behalf_of(token)


async def limited(
    limiter: anyio.CapacityLimiter,
    token: object,
    coro: Coroutine[Any, Any, Any],
    queue: Callable[[bool], None],
) -> Any:
    """Await ``coro`` holding one of ``limiter``'s tokens (borrowed as ``token``).

    ``queue`` is told when the call starts and stops waiting for a token
    (`take_waiting`).
    """
    if not take_now(limiter, token):
        try:
            await take_waiting(limiter, token, queue)
        except BaseException:
            coro.close()  # never started: close it rather than leak it
            raise
    try:
        return await coro
    finally:
        give_back(limiter, token)
