"""``Resume``: carry on a coroutine that was started by hand and has suspended.

aiovec drives coroutines eagerly (``coro.send(None)``); one that waits is
handed, with what it yielded, to a task.  ``Resume(coro, yielded)`` is itself a
coroutine object: as a task's coroutine (``loop.create_task(Resume(...))``) or
awaited (``await Resume(...)``, which delegates to ``coro`` in C after the
first step), its first step re-yields what ``coro`` is waiting on, and from
then on every ``send``/``throw``/``close`` goes straight to ``coro``, as if the
task had run it from the start.  A cancellation that
arrives before the first step (a task cancelled before it ever ran) reaches
``coro`` too, so it always unwinds through its own ``except``/``finally``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ("Resume",)


class Resume(Coroutine[Any, Any, Any]):
    """A coroutine that carries on ``coro``, which last yielded ``first``."""

    __slots__ = ("_coro", "_first", "_started")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first
        self._started = False

    def send(self, value: Any) -> Any:
        """Re-yield what ``coro`` waits on first, then pass values to ``coro``."""
        if not self._started:
            self._started = True
            first, self._first = self._first, None
            return first
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Pass an exception (e.g. a cancellation) to ``coro``."""
        self._started = True
        self._first = None
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - legacy signature

    def close(self) -> None:
        """Close ``coro``."""
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        first, self._first = self._first, None
        self._started = True
        return _carry_on(self._coro, first)


def _carry_on(coro: Coroutine[Any, Any, Any], waiting_on: Any) -> Generator[Any, Any, Any]:
    """Re-yield what ``coro`` waits on, then delegate to it in C (``yield from``).

    A task only ever sends ``None`` (a future's result is read by the code that
    awaited it), so after the first yield ``coro`` is simply resumed; an
    exception thrown at that point (a cancellation) is delivered into it first.
    """
    try:
        yield waiting_on
    except BaseException as exc:
        try:
            waiting_on = coro.throw(exc)
        except StopIteration as stop:
            return stop.value
        return (yield from _carry_on(coro, waiting_on))
    return (yield from coro.__await__())
