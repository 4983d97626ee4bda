"""The one place where synchronous code enters aiovec's event loop.

Two strategies, chosen once, when the runner is made:

``same-thread`` (a plain script; no loop runs in this thread)
    The runner owns an ``asyncio.Runner`` (for the loop's set-up and
    tear-down).  Each call drives the coroutine *by hand*, as a task would,
    with the loop marked as this thread's running loop meanwhile.  A vector
    call whose envs all finish without waiting (sync envs, CPU-bound async
    envs) completes at once, costing no loop iteration (~1.5 us instead of
    the ~50 us of ``Runner.run``).  While the coroutine waits on a future,
    the runner runs loop iterations until that future is done, then drives
    the coroutine on: no task, and none of ``run_until_complete``'s set-up
    per call (a process-backend step waits on every call).  Not
    ``Runner.run``: it swaps the SIGINT handler on every call, which on 3.11
    builds the repr of the finished task and its result (milliseconds for a
    batch of observations).  Ctrl-C, however it arrives (the default handler
    raising ``KeyboardInterrupt`` out of a loop iteration, or an env raising
    it), is thrown into the coroutine as a cancellation, which is driven until
    it has unwound before ``KeyboardInterrupt`` propagates, so nothing is
    orphaned.  This path runs only on the default loop, whose clock is
    ``time.monotonic`` and whose iterations it can run one at a time; with
    another loop (uvloop caches its clock between iterations, so timers
    started outside it can fire early) each call is a task that
    ``loop.run_until_complete`` finishes.

``loop-thread`` (a loop already runs in this thread, e.g. Jupyter)
    The runner starts an anyio blocking portal: an event loop on a thread of
    its own, and each call runs there (~130 us a call).  Ctrl-C cancels the
    call on that loop and waits for it to unwind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

from aiovec._errors import ClosedError

__all__ = ("Runner",)

T = TypeVar("T")


class Runner:
    """Runs aiovec coroutines to completion for synchronous callers.

    Args:
        loop_factory: Event loop factory for the same-thread strategy (e.g.
            ``uvloop.new_event_loop``); the default asyncio loop if ``None``.
    """

    def __init__(self, loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> None:
        self._portal: Any = None
        self._portal_cm: contextlib.AbstractContextManager[Any] | None = None
        self._runner: asyncio.Runner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        if asyncio._get_running_loop() is not None:
            from anyio.from_thread import start_blocking_portal  # noqa: PLC0415  (only if needed)

            self.strategy = "loop-thread"
            self._portal_cm = start_blocking_portal("asyncio")
            self._portal = self._portal_cm.__enter__()
            self._fast = False
        else:
            self.strategy = "same-thread"
            self._runner = asyncio.Runner(loop_factory=loop_factory)
            self._fast = loop_factory is None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion and return its result (or raise its error)."""
        if self._closed:
            coro.close()
            raise ClosedError("cannot run a call: the vector env's runner is closed")
        if self._runner is None:
            return self._run_in_portal(coro)
        if asyncio._get_running_loop() is not None:
            coro.close()
            raise RuntimeError(
                "this BlockingVectorEnv was created where no event loop was running, and is now "
                "called from inside a running loop; create it inside the loop (it then runs its "
                "envs on a helper thread) or use AsyncioVectorEnv with `await`"
            )
        if self._fast:
            return self._drive(coro)
        return cast(T, self._run_on_loop(coro))

    def _drive(self, coro: Coroutine[Any, Any, T]) -> T:
        """Drive ``coro`` by hand; while it waits on a future, run loop iterations.

        This is what a task would do, without the task: the loop is marked
        running only while this thread drives it, and each wait costs loop
        iterations only (no task, no ``run_until_complete`` set-up and
        tear-down).  Ctrl-C that arrives while the loop runs is thrown into
        ``coro`` as a cancellation, which is driven until it has unwound.
        """
        loop = self._loop or self._first_loop()
        run_once = loop._run_once  # type: ignore[attr-defined]
        asyncio._set_running_loop(loop)
        try:
            waiting = coro.send(None)
            while True:
                try:
                    if waiting is None:  # a bare yield (asyncio.sleep(0)): let others run
                        run_once()
                    else:
                        waiting._asyncio_future_blocking = False
                        while not waiting.done():
                            run_once()
                except BaseException:
                    self._unwind(coro, run_once)
                    raise
                waiting = coro.send(None)
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            asyncio._set_running_loop(None)

    @staticmethod
    def _unwind(coro: Coroutine[Any, Any, Any], run_once: Callable[[], None]) -> None:
        """Cancel ``coro`` (Ctrl-C escaped the loop) and drive it until it has unwound."""
        try:
            waiting = coro.throw(asyncio.CancelledError())
            while True:
                while waiting is not None and not waiting.done():
                    run_once()
                waiting = coro.send(None)
        except BaseException:  # its end, or the cancellation (the interrupt matters more)
            return

    def _run_on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` as a task; Ctrl-C (or any escape) cancels it and lets it unwind."""
        loop = self._loop or self._first_loop()
        task = loop.create_task(coro)
        try:
            return loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                # KeyboardInterrupt raised out of the loop (a signal handler that is
                # not asyncio's): the call must still cancel its envs and unwind.
                task.cancel()
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(task)
            raise

    def _first_loop(self) -> asyncio.AbstractEventLoop:
        assert self._runner is not None
        self._loop = self._runner.get_loop()
        return self._loop

    def _run_in_portal(self, coro: Coroutine[Any, Any, T]) -> T:
        async def call() -> T:
            return await coro

        future = self._portal.start_task_soon(call)
        try:
            result: T = future.result()
            return result
        except KeyboardInterrupt:
            future.cancel()
            with contextlib.suppress(BaseException):
                future.result()
            raise

    def close(self) -> None:
        """Close the loop (or stop the portal thread); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            self._runner.close()
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)
