"""``backend="inline"``: envs live in the caller's event loop.

Synchronous envs are called directly; async envs are driven eagerly on their
lanes (see ``_lanes``), so a batch of envs that never suspend costs no task at
all, and envs that wait overlap their waits.

An env that holds the loop (one stretch of a call, without awaiting, longer
than the loop's ``slow_callback_duration``, on the CPU or blocked in a
synchronous call) is named in a warning, once per kind of call
(``aiovec._log.LoopHogs``, which tells it from a stretch the OS took).  Timing
is one clock read per env and call, except on the hot path of synchronous
steps: there the whole batch is timed (two reads), and each env only once a
batch has taken longer than the limit.  The thread's counters (a system call)
are read when a stretch was over the limit, and as the reference for the
next one at the start of a batch when the last reading is over
``aiovec._log.MARK_EVERY`` old.  Steps are timed env by env for
`TIMED_BATCHES` batches after one held the loop, then as a whole again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import CoroutineType
from typing import Any, Self

import anyio

from aiovec._core.calls import STEP, flow_at
from aiovec._core.ops import Op, StepOp
from aiovec._env import is_async_env
from aiovec._log import (
    GC_PAUSES,
    MARK_EVERY,
    MIN_SLOW_SLICE,
    LoopHogs,
    held_by_env,
    slow_slice_limit,
)
from aiovec.backends._base import Backend, EnvTraits, build_envs, make_env
from aiovec.backends._drive import (
    StepFlow,
    aclose_quietly,
    async_call,
    close_quietly,
    coroutine_of,
    perform_async,
    perform_sync,
    step_async,
    step_sync,
)
from aiovec.backends._lanes import PENDING, Lanes
from aiovec.backends._limit import limited

__all__ = ("InlineBackend",)

TIMED_BATCHES = 100
"""After a batch of sync steps that held the loop, how many batches are timed env by env.

Each such batch starts the count again; after this many in a row in which no
env held the loop, the batch is timed as a whole again: one stall (the OS
took the CPU away from a loaded machine) does not slow every later step.
"""

# Backends not closed yet.  Their lane tasks are reachable from here, never only
# through a vector env that was forgotten: collected together with it, a pending
# task would be "destroyed but pending".  The vector env's finalizer cancels them.
_OPEN: set[InlineBackend] = set()


class InlineBackend(Backend):
    """Hosts envs in this thread, on the caller's event loop."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None,
        envs: list[Any],
    ) -> None:
        """Host ``envs``, built from ``env_fns`` on this loop (`open` builds them)."""
        super().__init__(env_fns, num_workers, limiter)
        self._env_fns = list(env_fns)
        self._envs = envs
        try:
            self._is_async = [is_async_env(env) for env in self._envs]
        except TypeError:
            close_quietly(self._envs)
            raise
        self._any_async = any(self._is_async)
        self._flows: list[StepFlow | None] = [None] * self.num_envs
        self._actions: list[Any] = [None] * self.num_envs  # of each async env's step in flight
        self._hogs = LoopHogs()  # stretches that held the loop, said once per kind of call
        self._lanes = Lanes(self.num_envs, self._finish, self._hogs, self.lag)
        GC_PAUSES.install()  # a collection inside an env's stretch is not the env's doing
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the lanes
        self._time_each_step = 0  # batches of sync steps still to time env by env
        self.traits = EnvTraits.of(self._envs)
        _OPEN.add(self)

    @classmethod
    async def open(
        cls,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None,
        options: Mapping[str, Any] | None,
    ) -> Self:
        """Build the envs on this loop, awaiting each factory (`build_envs`), and host them."""
        return cls(env_fns, num_workers, limiter, await build_envs(env_fns))

    @property
    def envs(self) -> tuple[Any, ...]:
        """The env objects."""
        return tuple(self._envs)

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Run ``op``: sync envs to completion now, async envs eagerly until they wait."""
        envs, flows, results = self._envs, self._flows, self._results
        self._hogs.call = op.name
        if not isinstance(op, StepOp):
            self._run_each(
                (
                    (i, perform_sync, perform_async, (envs[i], call))
                    for i, call in zip(indices, op.calls, strict=True)
                ),
                measure=True,
            )
        elif self._any_async and self.limiter is None:
            self._step_each(indices, op)
        elif self._any_async or self._time_each_step:  # a token per call, or timed env by env
            slow = self._run_each(
                (i, step_sync, step_async, (envs[i], flows[i] or flow_at(flows, i, op.mode), rf, a))
                for i, rf, a in zip(indices, op.reset_first, op.actions, strict=True)
            )
            if slow:
                self._time_each_step = TIMED_BATCHES
            elif self._time_each_step:
                self._time_each_step -= 1  # back to the hot path once it reaches 0
        else:  # the hot path of synchronous envs: one tight loop, timed as a whole
            since = time.perf_counter()
            for i, first, action in zip(indices, op.reset_first, op.actions, strict=True):
                try:  # `step_sync`, written out: a Python call less per env-step
                    send = (flows[i] or flow_at(flows, i, op.mode)).send
                    call: Any = send(first)  # a call (typed, with no cast on this path)
                    while type(call) is not tuple:
                        env = envs[i]
                        call = send(env.step(action) if call is STEP else perform_sync(env, call))
                    results[i] = call
                except BaseException as exc:
                    self._fail(i, exc)
            now = time.perf_counter()
            if now - since > MIN_SLOW_SLICE and held_by_env(since, now) > slow_slice_limit():
                self._time_each_step = TIMED_BATCHES  # some env may hold the loop: find which
        if self._hogs.noted and not self.pending:
            self._hogs.say()

    def _run_each(
        self, jobs: Iterable[tuple[int, Any, Any, tuple[Any, ...]]], *, measure: bool = False
    ) -> bool:
        """Run each ``(i, sync_fn, async_fn, args)``: sync envs now, async ones eagerly.

        Each env's stretch on the loop is timed (one clock read per env); the
        thread's counters are read first if ``measure``, else only if the last
        reading is old (`LoopHogs.refresh`).

        Returns:
            Whether some env's stretch held the loop over the limit.
        """
        is_async, lanes, results, hogs = self._is_async, self._lanes, self._results, self._hogs
        clock, limit = time.perf_counter, slow_slice_limit()
        since = last = clock()
        if measure:
            hogs.mark = hogs.read()
        else:
            hogs.refresh(since)
        loop: asyncio.AbstractEventLoop | None = None
        caller = None
        slow = False
        try:
            for i, sync_fn, async_fn, args in jobs:
                try:
                    if is_async[i]:
                        if loop is None:
                            loop = self._loop = asyncio.get_running_loop()
                            caller = lanes.enter(loop)
                        coro = async_fn(*args)
                        if self.limiter is not None:
                            coro = limited(self.limiter, object(), coro, self._queuer(i))
                        value = lanes.start(i, coro)
                        if value is PENDING:
                            self._mark_waiting(i, since, last)
                        else:
                            results[i] = value
                    else:
                        results[i] = sync_fn(*args)
                except BaseException as exc:
                    self._fail(i, exc)
                finally:
                    now = clock()
                    if now - last > limit:
                        hogs.slow(i, last, now)
                        slow = True
                    last = now
        finally:
            if loop is not None:
                lanes.leave(caller)
        return slow

    def _queuer(self, i: int) -> Callable[[bool], None]:
        """Env ``i``'s hook for `limited`: it waits for a concurrency slot, or no longer."""
        return lambda waiting: self._queue(i, waiting)

    def _step_each(self, indices: Sequence[int], op: StepOp) -> None:
        """Step envs, sync ones now and async ones eagerly, with no coroutine of aiovec's.

        Each env's stretch on the loop is timed, as in `_run_each`.

        An async env's step coroutines are its own: each is driven on the env's
        lane and its value is sent into the env's flow by a plain call (here,
        or by `_advance` in the lane once it waited), so a step allocates
        nothing per env beyond the env's coroutine.
        """
        envs, flows, is_async, results = self._envs, self._flows, self._is_async, self._results
        lanes, actions, advance, hogs = self._lanes, self._actions, self._advance, self._hogs
        clock, limit = time.perf_counter, slow_slice_limit()
        since = last = clock()
        if since - hogs.mark.at > MARK_EVERY:  # `LoopHogs.refresh`, inline: once per step
            hogs.mark = hogs.read()
        loop = self._loop = asyncio.get_running_loop()
        caller = lanes.enter(loop)
        try:
            for i, first, action in zip(indices, op.reset_first, op.actions, strict=True):
                try:
                    flow = flows[i] or flow_at(flows, i, op.mode)
                    if not is_async[i]:
                        results[i] = step_sync(envs[i], flow, first, action)
                        continue
                    actions[i] = action
                    call: Any = flow.send(first)  # a call (typed, with no cast on this path)
                    while type(call) is not tuple:
                        # STEP inline (as `step_sync` does): a Python call less per env-step
                        env = envs[i]
                        coro = env.step(action) if call is STEP else async_call(env, call)
                        if type(coro) is not CoroutineType:  # another kind of awaitable
                            coro = coroutine_of(coro)
                        value = lanes.start(i, coro, advance)
                        if value is PENDING:
                            self._mark_waiting(i, since, last)
                            break
                        call = flow.send(value)
                    else:
                        results[i] = call
                except BaseException as exc:
                    self._fail(i, exc)
                finally:  # each env's stretch on the loop is timed (one clock read per env)
                    now = clock()
                    if now - last > limit:
                        hogs.slow(i, last, now)
                    last = now
        finally:
            lanes.leave(caller)

    def _advance(self, i: int, value: Any) -> Any:
        """Send the value of env ``i``'s call into its flow; the next call's coroutine, or the end.

        The end is the env's transition (a tuple), its step's value.
        """
        flow = self._flows[i]
        assert flow is not None
        call: Any = flow.send(value)
        if type(call) is tuple:
            return call
        return async_call(self._envs[i], call, self._actions[i])

    def _fail(self, i: int, error: BaseException) -> None:
        self._flows[i] = None  # it still expects the failed call's result
        self._errors[i] = error
        if not isinstance(error, Exception):  # Ctrl-C or exit: start nothing more
            raise error

    def _finish(self, i: int, value: Any, error: BaseException | None) -> None:
        if error is not None:
            self._flows[i] = None
        super()._finish(i, value, error)
        if self._hogs.noted and not self.pending:  # the call is over: say what held the loop
            self._hogs.say()

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Close, then rebuild each env from its factory (on this loop: `make_env`)."""
        errors: dict[int, BaseException] = {}
        for i in indices:
            self._lanes.cancel(i)  # an idle lane ends; a new one comes with the next call
            self._flows[i] = None
            await aclose_quietly(self._envs[i])
            try:
                env = await make_env(self._env_fns[i])
                self._check_rebuilt(i, env)
                self._is_async[i] = is_async_env(env)
            except Exception as exc:
                errors[i] = exc
                continue
            self._envs[i] = env
        self._any_async = any(self._is_async)
        return errors

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Cancel the lanes of the envs in flight (of ``indices``, or all)."""
        for i in list(self.pending if indices is None else self.pending.intersection(indices)):
            self._lanes.cancel(i)

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env (concurrently), then end every lane."""
        _OPEN.discard(self)
        errors = await self._close_envs(range(self.num_envs))
        await self._lanes.aclose()
        return errors

    def close_now(self) -> None:
        """Without awaiting: cancel every lane (on its loop's thread), close the envs."""
        _OPEN.discard(self)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            if loop.is_running() and asyncio._get_running_loop() is not loop:
                loop.call_soon_threadsafe(self._cancel_lanes)  # collected on another thread
            else:
                self._cancel_lanes()  # each lane ends when its loop runs next
        close_quietly(self._envs)

    def _cancel_lanes(self) -> None:
        for i in range(self.num_envs):
            self._lanes.cancel(i)
