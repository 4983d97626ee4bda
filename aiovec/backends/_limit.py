"""``max_concurrency``: at most K env calls in flight, through an anyio ``CapacityLimiter``.

The limiter may be shared by several vector envs that talk to one server.  A
call takes a token without waiting when one is free (so an eager call stays
eager) and otherwise waits for one; it gives it back when it has finished.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio

__all__ = ("limited",)


async def limited(
    limiter: anyio.CapacityLimiter,
    token: object,
    coro: Coroutine[Any, Any, Any],
    queue: Callable[[bool], None],
) -> Any:
    """Await ``coro`` holding one of ``limiter``'s tokens (borrowed as ``token``).

    When no token is free, ``queue(True)`` is called before waiting for one
    and ``queue(False)`` once the wait is over (the token is held, or the wait
    was cancelled), so that neither the env's deadline nor its latency counts
    the time spent queued.
    """
    try:
        limiter.acquire_on_behalf_of_nowait(token)
    except anyio.WouldBlock:
        queue(True)
        try:
            await limiter.acquire_on_behalf_of(token)
        except BaseException:
            coro.close()  # never started: close it rather than leak it
            raise
        finally:
            queue(False)
    try:
        return await coro
    finally:
        limiter.release_on_behalf_of(token)
