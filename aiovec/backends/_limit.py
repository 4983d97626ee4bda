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
    started: Callable[[], None],
) -> Any:
    """Await ``coro`` holding one of ``limiter``'s tokens (borrowed as ``token``).

    ``started`` is called once the token is held after waiting for it, so that
    the time spent queued is not counted as the env's latency.
    """
    try:
        limiter.acquire_on_behalf_of_nowait(token)
    except anyio.WouldBlock:
        try:
            await limiter.acquire_on_behalf_of(token)
        except BaseException:
            coro.close()  # never started: close it rather than leak it
            raise
        started()
    try:
        return await coro
    finally:
        limiter.release_on_behalf_of(token)
