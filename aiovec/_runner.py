"""The one place where synchronous code enters aiovec's event loop.

Two strategies, chosen once, when the runner is made:

``same-thread`` (a plain script; no loop runs in this thread)
    The runner owns an ``asyncio.Runner`` (for the loop's set-up and
    tear-down).  Each call first drives the coroutine *without running the
    loop*: the loop is only marked as this thread's running loop while the
    coroutine is sent ``None``.  A vector call whose envs all finish without
    waiting (sync envs, CPU-bound async envs) completes right there, costing
    no loop iteration (~1.5 us instead of the ~50 us of ``Runner.run``).  A
    coroutine that suspends is wrapped, with the future it waits on, in a task
    (``Resume``) that ``loop.run_until_complete`` finishes.  Not
    ``Runner.run``: it swaps the SIGINT handler on every call, which on 3.11
    builds the repr of the finished task and its result (milliseconds for a
    batch of observations).  Ctrl-C, however it arrives (the default handler
    raising ``KeyboardInterrupt`` out of the loop, or an env raising it),
    cancels that task and lets it unwind before ``KeyboardInterrupt``
    propagates, so nothing is orphaned.  The fast path runs only on the
    default loop, whose clock is ``time.monotonic``: uvloop caches its clock
    between iterations, so timers started outside it can fire early.

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
from aiovec._resume import Resume

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
            loop = self._loop or self._first_loop()
            asyncio._set_running_loop(loop)
            try:
                first = coro.send(None)
            except StopIteration as stop:
                result: T = stop.value
                return result
            finally:
                asyncio._set_running_loop(None)
            return cast(T, self._run_on_loop(Resume(coro, first)))
        return cast(T, self._run_on_loop(coro))

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
