"""``Resume``: carry on a coroutine that was started by hand and has suspended.

Used where aiovec drives a coroutine eagerly (``coro.send(None)``) and it turns
out to wait: the coroutine and the future it yielded are handed to a task,
which awaits ``Resume(coro, yielded)``; from then on the task drives it as if
it had run it from the start (values, exceptions and cancellation pass through).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ("Resume",)


class Resume:
    """Awaitable that carries on ``coro``, which last yielded ``first``."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.first
        self.first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # delivered to the task: pass it on
                try:
                    value = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
