"""``Resume``: carry on a coroutine that was started by hand and has suspended.

aiovec drives coroutines eagerly (``coro.send(None)``); one that waits is
handed, with what it yielded, to a task.  ``Resume(coro, yielded)`` is itself a
coroutine object: as a task's coroutine (``loop.create_task(Resume(...))``) or
awaited (``await Resume(...)``), its first step re-yields what ``coro`` is
waiting on, and from then on every ``send``/``throw``/``close`` goes straight to
``coro``, as if the task had run it from the start.  A cancellation that
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
        return self  # a coroutine object is its own iterator

    def __next__(self) -> Any:
        return self.send(None)

    def __iter__(self) -> Resume:
        return self
