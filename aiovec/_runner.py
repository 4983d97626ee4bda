"""The one place where synchronous code enters aiovec's event loop.

Two strategies, chosen once, when the runner is made:

``same-thread`` (a plain script; no loop runs in this thread)
    The runner owns an ``asyncio.Runner`` (for the loop's set-up and
    tear-down).  Each call first drives the coroutine *without running the
    loop*: the loop is only marked as this thread's running loop while the
    coroutine is sent ``None``.  A vector call whose envs all finish without
    waiting (sync envs, CPU-bound async envs) completes right there, costing
    no loop iteration (docs/performance.md: a few us, against ``Runner.run``'s
    ~50).  A
    coroutine that suspends is wrapped, with the future it waits on, in a task
    (``Resume``) that ``loop.run_until_complete`` finishes.  Not
    ``Runner.run``: it swaps the SIGINT handler on every call, which on 3.11
    builds the repr of the finished task and its result (milliseconds for a
    batch of observations).  Ctrl-C, however it arrives (the default handler
    raising ``KeyboardInterrupt`` out of the loop, or an env raising it),
    cancels that task and lets it unwind before ``KeyboardInterrupt``
    propagates, so nothing is orphaned.  While the loop runs in the main
    thread, the runner's `_SignalWakeup` is the process's signal wakeup fd: a
    SIGINT that hits another thread (an env's), or lands just before the loop
    sleeps in ``epoll_wait``, still wakes the loop at once (CPython runs the
    Python-level handler only in the main thread, when it next runs bytecode).
    The fast path runs only on the
    default loop, whose clock is ``time.monotonic``: uvloop caches its clock
    between iterations, so timers started outside it can fire early.

The blocking front end also *builds* its vector env through `Runner.run`, so
env factories run on the loop that will run their envs (the factory rule).  A
Ctrl-C while the loop itself is being made is held until it is whole
(`_ctrl_c_deferred`).

``loop-thread`` (a loop already runs in this thread, e.g. Jupyter)
    The runner starts an anyio blocking portal: an event loop on a thread of
    its own, and each call runs there (a round trip between threads per call).
    Ctrl-C cancels the call on that loop and waits for it to unwind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
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
        self._wakeup: _SignalWakeup | None = None
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
            try:  # a Ctrl-C at any bytecode from here closes coro and leaves no loop marked
                loop = self._loop or self._first_loop()
                asyncio._set_running_loop(loop)
                first = coro.send(None)
            except StopIteration as stop:
                result: T = stop.value
                return result
            except BaseException:
                coro.close()  # perhaps never started (Ctrl-C before the send)
                raise
            finally:
                asyncio._set_running_loop(None)
            return cast(T, self._run_on_loop(Resume(coro, first)))
        return cast(T, self._run_on_loop(coro))

    def _run_on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` as a task; Ctrl-C (or any escape) cancels it and lets it unwind."""
        loop = self._loop or self._first_loop()
        wakeup = self._signal_wakeup(loop)
        task = loop.create_task(coro)
        try:  # from here on, a KeyboardInterrupt at any bytecode unwinds the task
            with contextlib.nullcontext() if wakeup is None else wakeup.installed():
                return loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                # KeyboardInterrupt raised out of the loop (a signal handler that is
                # not asyncio's): the call must still cancel its envs and unwind.
                task.cancel()
                with contextlib.suppress(BaseException):
                    loop.run_until_complete(task)
            raise

    def _signal_wakeup(self, loop: asyncio.AbstractEventLoop) -> _SignalWakeup | None:
        """The wakeup fd for signals while the loop runs (main thread only, made once)."""
        if threading.get_ident() != threading.main_thread().ident:
            return None  # signal handlers run in the main thread only: nothing to wake here
        if self._wakeup is None:
            with _ctrl_c_deferred():  # never half made
                self._wakeup = _SignalWakeup(loop)
        return self._wakeup

    def _first_loop(self) -> asyncio.AbstractEventLoop:
        assert self._runner is not None
        with _ctrl_c_deferred():  # a loop interrupted half-way through its __init__ is broken
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
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None
        if self._runner is not None:
            with _loop_set_aside():
                self._runner.close()  # runs its loop a last time (async generators, executor)
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)


@contextlib.contextmanager
def _loop_set_aside() -> Iterator[None]:
    """No loop marked as running in this thread for the block; the one there is, back after.

    A runner whose vector env is garbage collected while another vector env's
    call runs a loop in this thread (an env's step dropped the last reference)
    must still run its own loop to close it; asyncio refuses to while another
    is marked as running.  The two loops share nothing, and the other one's
    call is suspended in this thread until the block ends.
    """
    running = asyncio._get_running_loop()
    if running is None:
        yield
        return
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(running)


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold a SIGINT that comes during the block, and deliver it as the block ends.

    For set-up that a ``KeyboardInterrupt`` must not cut in half (an event loop's
    ``__init__``).  Python runs signal handlers in the main thread only, so
    elsewhere there is nothing to defer.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, caught[0])  # KeyboardInterrupt, for the default handler
        elif caught and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


class _SignalWakeup:
    """A socket pair whose read end wakes ``loop``; installed as the signal wakeup fd.

    CPython's C-level signal handler, in whatever thread the signal hits, writes
    the signal's number to the wakeup fd; reading it here wakes the loop, and the
    Python-level handler (``KeyboardInterrupt`` for SIGINT) runs in the main
    thread as soon as it runs bytecode again.  A wakeup fd set before (another
    loop's signal handling) is restored afterwards and gets the bytes read here,
    so its owner still learns which signals came.

    A signal's handler can raise between any two bytecodes, also while this is
    being installed or restored: the restore runs however the block ends, our
    own fd is never taken for a previous owner's (forwarding to it would loop),
    and `close` uninstalls it if it is still installed (a closed fd's number is
    soon reused, and the handler would write into whatever file got it).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._fd = self._writer.fileno()
        self._forward_to = -1
        loop.add_reader(self._reader.fileno(), self._drain)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Be the wakeup fd for the duration of the block (main thread only)."""
        self._forward_to = -1
        try:
            previous = signal.set_wakeup_fd(self._fd, warn_on_full_buffer=False)
            if previous != self._fd:  # else left installed by an interrupted block
                self._forward_to = previous
            yield
        finally:
            previous, self._forward_to = self._forward_to, -1
            signal.set_wakeup_fd(previous)
            if previous != -1:
                self._forward(previous)  # signals caught in the block: tell its owner now

    def _drain(self) -> None:
        self._forward(self._forward_to)

    def _forward(self, fd: int) -> None:
        """Read every byte waiting; write it to ``fd`` (unless -1)."""
        while True:
            try:
                data = self._reader.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            if fd != -1:
                with contextlib.suppress(OSError):  # its owner may have closed it
                    os.write(fd, data)

    def close(self) -> None:
        if threading.get_ident() == threading.main_thread().ident:
            current = signal.set_wakeup_fd(-1)
            if current != self._fd:  # someone else's: leave it as it was
                signal.set_wakeup_fd(current)
        if not self._loop.is_closed():
            self._loop.remove_reader(self._reader.fileno())
        self._reader.close()
        self._writer.close()
