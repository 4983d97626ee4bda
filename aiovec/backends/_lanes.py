"""Lanes: run each env's coroutine eagerly, inside a task of its own.

Theory of operation.  ``asyncio.gather`` costs one new Task per env per step
(docs/performance.md compares the two); an env whose coroutine finishes
without suspending needs no Task at all.  So each call is first driven
*eagerly* with ``coro.send(None)`` from the caller's loop.  Most finish right
there.  One that suspends is handed, with the future it yielded, to its env's
*lane*: a long-lived task that resumes it.

Two things keep this indistinguishable from a real task per call:

- During the eager part the env's lane task is made the loop's *current task*
  (``asyncio.current_task()``), so ``asyncio.timeout()``, ``anyio`` cancel
  scopes and friends bind to the task that will really carry on the coroutine.
- Each lane runs in its own ``contextvars.Context``, and the eager part runs in
  that same context, so context variables set before a suspension are there
  after it.

A lane carries a coroutine on one slice at a time (``coro.send``/``throw``
between two suspensions) and times each slice with two clock reads: a slice
longer than the loop's ``slow_callback_duration`` is reported to the vector
env's `aiovec._log.LoopHogs` (an env that may hold the loop), and the first
resumption of each loop iteration keeps its reference counters recent
(`LoopHogs.refresh`), so that a slow slice can be judged.

A lane is cancelled to cancel its env's call; cancellation ends the lane, and a
new one is made for the env's next call.  Python 3.12 made eager tasks a
built-in feature; this module gives Python 3.11 the same semantics, using
``asyncio.tasks._enter_task``/``_leave_task`` (falling back to a plain task per
suspended call where they do not exist).
"""

from __future__ import annotations

import asyncio
import asyncio.tasks as _asyncio_tasks
import contextvars
import inspect
import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, cast

from aiovec._log import MARK_EVERY, LoopHogs, slow_slice_limit

_Swap = Callable[[asyncio.AbstractEventLoop, "asyncio.Task[Any]"], None]
# The same hooks asyncio's own eager tasks use; absent on other interpreters.
_enter_task: _Swap | None = getattr(_asyncio_tasks, "_enter_task", None)
_leave_task: _Swap | None = getattr(_asyncio_tasks, "_leave_task", None)

__all__ = ("PENDING", "Lanes")

_FRESH = object()  # marks a coroutine the lane must start itself
PENDING: Any = object()
"""Returned by `Lanes.start` for a coroutine that suspended."""

OnDone = Callable[[int, Any, BaseException | None], None]
Then = Callable[[int, Any], Any]
"""``then(i, value)``: the next coroutine (``async def``) of env ``i``'s call, or its value."""


class Lanes:
    """One lane per env; results are reported through ``on_done``."""

    def __init__(
        self, num_envs: int, on_done: OnDone, hogs: LoopHogs, lag: list[float] | None = None
    ) -> None:
        """Slow slices go to ``hogs``; ``lag[i]`` is added each wait of env ``i`` for its turn."""
        self._on_done = on_done
        self._hogs = hogs
        self._lag = [0.0] * num_envs if lag is None else lag
        self._turn: float | None = None  # when this loop iteration's first resumption came
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None] | None] = [None] * num_envs
        self._wakes: list[asyncio.Future[Any] | None] = [None] * num_envs
        self._contexts: list[contextvars.Context | None] = [None] * num_envs
        # What `start` hands over to a lane: the coroutine, what it waits on, ``then``.
        self._coros: list[Coroutine[Any, Any, Any] | None] = [None] * num_envs
        self._firsts: list[Any] = [None] * num_envs
        self._thens: list[Then | None] = [None] * num_envs

    def start(self, i: int, coro: Coroutine[Any, Any, Any], then: Then | None = None) -> Any:
        """Drive ``coro`` eagerly on env ``i``'s lane.

        Must be called from code running in the event loop, between
        `enter` and `leave`.  ``then`` (if given) continues the call when
        ``coro`` has suspended: the lane calls ``then(i, value)`` with the
        value ``coro`` returns, and carries on with the native coroutine it
        returns, or reports anything else it returns as the call's value.  (A step is
        its env's flow around one or two env calls: the flow is pushed by a
        plain call, not by a coroutine wrapped around the env's.)

        Returns:
            The coroutine's value when it finished eagerly (its exception
            propagates), else `PENDING`: it carries on in the lane and
            its outcome arrives through ``on_done``.
        """
        task = self._tasks[i]
        if task is None or task.done():
            task = self._new_lane(i)
        loop = self._loop
        assert loop is not None
        if _enter_task is None or _leave_task is None:  # cannot swap: the lane starts it
            yielded: Any = _FRESH
        else:
            _enter_task(loop, task)
            try:
                yielded = self._contexts[i].run(coro.send, None)  # type: ignore[union-attr]
            except StopIteration as stop:
                return stop.value
            finally:
                _leave_task(loop, task)
        # Handed over in per-lane slots, not a tuple: nothing allocated but the wake-up.
        self._coros[i], self._firsts[i], self._thens[i] = coro, yielded, then
        wake = self._wakes[i]
        assert wake is not None
        wake.set_result(None)
        return PENDING

    def enter(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
        """Prepare to start coroutines from ``loop``; returns the caller's task to restore."""
        if loop is not self._loop:
            self._rebind(loop)
        caller = asyncio.current_task(loop)
        if caller is not None and _leave_task is not None:
            _leave_task(loop, caller)
        return caller

    def leave(self, caller: asyncio.Task[Any] | None) -> None:
        """Restore the caller's task as the loop's current task."""
        if caller is not None and _enter_task is not None and self._loop is not None:
            _enter_task(self._loop, caller)

    def cancel(self, i: int) -> None:
        """Cancel env ``i``'s call in flight (its ``on_done`` reports the cancellation)."""
        task = self._tasks[i]
        if task is None:
            return
        waits_on = self._firsts[i]
        if (
            self._coros[i] is not None
            and inspect.getcoroutinestate(cast(Coroutine[Any, Any, None], task.get_coro()))
            == inspect.CORO_CREATED
            and hasattr(waits_on, "cancel")
        ):
            # Handed a call, but not started yet (no loop iteration ran since): a task
            # cancelled before its first step never runs its body, and the call would
            # never unwind nor be reported.  Cancel what the call waits on instead, as
            # Task.cancel() does: the lane starts, resumes it, and it sees the cancellation.
            waits_on.cancel()
            return
        task.cancel()

    async def aclose(self) -> None:
        """Cancel every lane and wait until each has ended."""
        loop = asyncio.get_running_loop()
        tasks = [t for t in self._tasks if t is not None and not t.done()]
        self._tasks = [None] * len(self._tasks)
        if self._loop is not loop:
            for task in tasks:  # a loop that is gone or not ours: nothing to wait on
                task.cancel()
            return
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _rebind(self, loop: asyncio.AbstractEventLoop) -> None:
        # Used from a new event loop (e.g. a second asyncio.run): lanes of the
        # old loop cannot run here.  Their envs have no call in flight (a call
        # never spans two loops), so they are simply dropped.
        for task in self._tasks:
            if task is not None and not task.done() and not task.get_loop().is_closed():
                task.cancel()
        self._loop = loop
        self._tasks = [None] * len(self._tasks)

    def _new_lane(self, i: int) -> asyncio.Task[None]:
        loop = self._loop
        assert loop is not None
        context = self._contexts[i]
        if context is None:
            context = self._contexts[i] = contextvars.copy_context()
        self._wakes[i] = loop.create_future()
        task = loop.create_task(self._lane(i), context=context)
        self._tasks[i] = task
        return task

    async def _lane(self, i: int) -> None:
        await self._serve(i)

    def _close_unstarted(self, i: int, cancelled: BaseException) -> None:
        """Env ``i``'s lane was cancelled before it started the coroutine handed over."""
        coro = self._coros[i]
        self._coros[i] = self._thens[i] = None
        assert coro is not None
        coro.close()
        self._on_done(i, None, cancelled)

    def _start_turn(self, now: float) -> None:
        """The first resumption of this loop iteration came ``now``.

        Lanes resumed later in the same iteration waited for the ones before
        them (their results were ready when it began): that wait is added to
        their ``lag``.  The iteration is over when a callback scheduled now
        runs, after every resumption that was ready with it.
        """
        self._turn = now
        hogs = self._hogs
        if now - hogs.mark.at > MARK_EVERY:  # `LoopHogs.refresh`, inline: once per iteration
            hogs.mark = hogs.read()
        assert self._loop is not None
        self._loop.call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._turn = None

    @types.coroutine
    def _serve(self, i: int) -> Generator[Any, Any, None]:  # noqa: PLR0915  (one hot loop)
        """The lane's body: a generator, so that carrying on a call allocates nothing.

        It yields what the coroutine waits on, as a task would, and resumes the
        coroutine one slice at a time, timing each slice; ``then`` continues
        the call with more coroutines, in this same task.
        """
        loop = self._loop
        assert loop is not None
        on_done, on_slow, clock = self._on_done, self._hogs.slow, time.perf_counter
        coros, firsts, thens, lag = self._coros, self._firsts, self._thens, self._lag
        while True:
            wake = self._wakes[i]
            assert wake is not None
            try:
                yield from wake
            except asyncio.CancelledError as exc:
                if not wake.done() or wake.cancelled():
                    raise  # an idle lane was cancelled: it just ends
                # Cancelled between the hand-over and the resumption: deliver the
                # cancellation the way a task would, then let the env unwind.
                if firsts[i] is _FRESH:
                    self._close_unstarted(i, exc)
                    raise
                _deliver_cancellation(firsts[i])
            coro, first, then = coros[i], firsts[i], thens[i]
            coros[i] = firsts[i] = thens[i] = None
            assert coro is not None
            self._wakes[i] = loop.create_future()
            limit = slow_slice_limit()
            try:
                while True:
                    while True:  # carry ``coro`` on, a slice at a time, until it returns
                        thrown: BaseException | None = None
                        if first is not _FRESH:  # wait on what the coroutine waits on
                            try:
                                yield first
                            except BaseException as exc:  # e.g. a cancellation: the coroutine's
                                thrown = exc
                        start = clock()
                        if first is not _FRESH:  # it waited: for its server, then for its turn
                            turn = self._turn
                            if turn is None:
                                self._start_turn(start)
                            else:
                                lag[i] += start - turn
                        try:
                            first = coro.send(None) if thrown is None else coro.throw(thrown)
                        except StopIteration as stop:
                            value: Any = stop.value
                            break
                        finally:
                            end = clock()
                            if end - start > limit:
                                on_slow(i, start, end)
                    if then is None:
                        break
                    # The call goes on: its next coroutine, or its value.
                    after: Any = then(i, value)
                    if type(after) is not types.CoroutineType:
                        value = after
                        break
                    coro, first = cast(Coroutine[Any, Any, Any], after), _FRESH
            except BaseException as exc:
                on_done(i, None, exc)
                if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
            else:
                on_done(i, value, None)
            coro = first = value = then = None  # an idle lane holds nothing of its last call


def _deliver_cancellation(waiting_on: Any) -> None:
    """Make a coroutine that waits on ``waiting_on`` see a cancellation when resumed."""
    cancel = getattr(waiting_on, "cancel", None)
    if cancel is not None:
        cancel()  # as Task.cancel() cancels the future the task waits on
    else:  # a bare yield (sleep(0)): cancel at the coroutine's next suspension
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
