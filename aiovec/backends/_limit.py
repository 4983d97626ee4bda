"""``max_concurrency``: at most K env calls in flight, through an anyio ``CapacityLimiter``.

The limiter may be shared by several vector envs that talk to one server.  A
call takes a token without waiting when one is free (so an eager call stays
eager) and otherwise waits for one; its latency clock restarts once it holds
the token (time queued is not the env's), and it gives the token back when it
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
    limiter: anyio.CapacityLimiter, token: object, started: Callable[[], None]
) -> None:
    """Wait for one of ``limiter``'s tokens as ``token``; then call ``started``.

    ``started`` restarts the env's latency clock: the time spent queued is not
    the env's.
    """
    await limiter.acquire_on_behalf_of(token)
    started()


def give_back(limiter: anyio.CapacityLimiter, token: object) -> None:
    """Return the token held as ``token``."""
    limiter.release_on_behalf_of(token)


async def limited(
    limiter: anyio.CapacityLimiter,
    token: object,
    coro: Coroutine[Any, Any, Any],
    started: Callable[[], None],
) -> Any:
    """Await ``coro`` holding one of ``limiter``'s tokens (borrowed as ``token``).

    ``started`` is called once the token is held after waiting for it.
    """
    if not take_now(limiter, token):
        try:
            await take_waiting(limiter, token, started)
        except BaseException:
            coro.close()  # never started: close it rather than leak it
            raise
    try:
        return await coro
    finally:
        give_back(limiter, token)
