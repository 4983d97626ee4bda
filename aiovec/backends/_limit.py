"""``max_concurrency``: at most K env calls in flight, through an anyio ``CapacityLimiter``.

The limiter may be shared by several vector envs that talk to one server.  A
call takes a token without waiting when one is free (so an eager call stays
eager) and otherwise waits for one; the time it spends queued counts neither
for its deadline nor for its latency, and it gives the token back when it
has finished.  This module is the only place that touches a limiter: inline
wraps a call's coroutine in `limited`; the thread backend, whose calls run on
threads, takes and gives back tokens around each job with the functions below;
a backend whose envs live elsewhere (process and Ray workers, a server's
sessions) hands out `Slots`: it takes a token for an env before it sends the
env's call, and gives it back when the env's outcome has come.  A limiter
cannot cross processes, so there it is the vector env's own (an int
``max_concurrency``).  `SlottedBackend` is that arrangement as a backend:
each env's part of an op waits with it for a slot, and the envs that get
theirs together leave together, one call per op.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any

import anyio

from aiovec._core.ops import Op
from aiovec._core.rows import StepBlock
from aiovec.backends._base import Backend

__all__ = ("Slots", "SlottedBackend", "give_back", "limited", "take_now", "take_waiting")


def take_now(limiter: anyio.CapacityLimiter, token: object) -> bool:
    """Take one of ``limiter``'s tokens as ``token`` if one is free now; whether it did."""
    try:
        limiter.acquire_on_behalf_of_nowait(token)
    except anyio.WouldBlock:
        return False
    return True


async def take_waiting(
    limiter: anyio.CapacityLimiter, token: object, queue: Callable[[bool], None] | None = None
) -> None:
    """Wait for one of ``limiter``'s tokens as ``token``.

    ``queue(True)`` is called before the wait and ``queue(False)`` once it is
    over (the token is held, or the wait was cancelled), so that neither the
    env's deadline nor its latency counts the time spent queued.  A caller that
    marks the queued time itself passes no ``queue``.
    """
    if queue is None:
        await limiter.acquire_on_behalf_of(token)
        return
    queue(True)
    try:
        await limiter.acquire_on_behalf_of(token)
    finally:
        queue(False)


def give_back(limiter: anyio.CapacityLimiter, token: object) -> None:
    """Return the token held as ``token``."""
    limiter.release_on_behalf_of(token)


async def limited(
    limiter: anyio.CapacityLimiter,
    token: object,
    coro: Coroutine[Any, Any, Any],
    queue: Callable[[bool], None],
) -> Any:
    """Await ``coro`` holding one of ``limiter``'s tokens (borrowed as ``token``).

    ``queue`` is told when the call starts and stops waiting for a token
    (`take_waiting`).
    """
    if not take_now(limiter, token):
        try:
            await take_waiting(limiter, token, queue)
        except BaseException:
            coro.close()  # never started: close it rather than leak it
            raise
    try:
        return await coro
    finally:
        give_back(limiter, token)


class Slots:
    """``max_concurrency`` for envs hosted in workers: the parent hands each env's call a slot.

    An env's call is sent to its worker only once it holds one of the
    limiter's tokens; the token comes back with the env's outcome (`release`).
    Envs that find none free wait in order (`request`), and get one as others
    come back, without a task: the limiter is this vector env's own (never
    shared), so a token only frees up when this object gives one back.

    Args:
        limiter: The vector env's own limiter.
        start: Called with the envs that got their slots together (in the order
            they asked): their calls may be sent now.
        queue: ``queue(i, True)`` when env ``i`` must wait for a slot,
            ``queue(i, False)`` when its wait is over (it got one, or gave up):
            the backend's clock for the env starts then (`Backend._queue`).
    """

    def __init__(
        self,
        limiter: anyio.CapacityLimiter,
        start: Callable[[list[int]], None],
        queue: Callable[[int, bool], None],
    ) -> None:
        self._limiter = limiter
        self._start, self._queue = start, queue
        self._held: dict[int, object] = {}  # env -> the token its call holds
        self._waiting: dict[int, bool] = {}  # envs waiting, in order -> marked queued
        self._admitting = False

    def request(self, envs: Sequence[int]) -> None:
        """``envs`` (none holding or waiting for a slot) want one, in this order."""
        waiting = self._waiting
        for i in envs:
            waiting[i] = False
        self._admit()
        for i in envs:
            if waiting.get(i) is False:
                waiting[i] = True
                self._queue(i, True)

    def release(self, i: int) -> None:
        """Env ``i``'s call is over: its slot comes back (or it no longer waits for one)."""
        token = self._held.pop(i, None)
        if token is not None:
            give_back(self._limiter, token)
            if self._waiting:
                self._admit()
        elif i in self._waiting:
            self._drop(i)

    def forget(self, envs: Iterable[int]) -> None:
        """Those of ``envs`` waiting for a slot wait no more (their calls are abandoned)."""
        for i in envs:
            if i in self._waiting:
                self._drop(i)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Meanwhile slots come back but no call starts; then those that can start, together."""
        if self._admitting:  # deferred already
            yield
            return
        self._admitting = True
        try:
            yield
        finally:
            self._admitting = False
            if self._waiting:
                self._admit()

    def _drop(self, i: int) -> None:
        if self._waiting.pop(i):
            self._queue(i, False)

    def _admit(self) -> None:
        """Give free slots to the envs waiting, in order; start each batch's calls.

        Starting a call may end it at once (its worker is lost), giving its slot
        back: the loop goes on rather than recursing.
        """
        if self._admitting:
            return
        self._admitting = True
        try:
            while self._waiting:
                batch: list[int] = []
                for i in self._waiting:
                    token = object()
                    if not take_now(self._limiter, token):
                        break
                    self._held[i] = token
                    batch.append(i)
                if not batch:
                    return
                for i in batch:
                    if self._waiting.pop(i):
                        self._queue(i, False)
                self._start(batch)
        finally:
            self._admitting = False


class SlottedBackend(Backend):
    """A backend whose envs' calls leave only once each holds a slot (``max_concurrency``).

    Without a limiter `launch_op` sends at once.  With one, each env's part of
    the op waits for a slot (in the order given); the envs that get theirs
    together are sent with one call of `send_op` per op (its subset, in env
    order), and each slot comes back with its env's outcome (`_finish`,
    `_finish_block`).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(env_fns, num_workers, limiter, options)
        self._slots = None if limiter is None else Slots(limiter, self._admitted, self._queue)
        self._ops: dict[int, tuple[Op, int]] = {}  # env -> its op and place, waiting for a slot

    @abc.abstractmethod
    def send_op(self, indices: Sequence[int], op: Op, since: float) -> None:
        """Send ``op`` for ``indices`` now (launched at ``since``)."""

    def launch_op(
        self, indices: Sequence[int], op: Op, since: float, order: Sequence[int] | None = None
    ) -> None:
        """Send ``op`` for ``indices``, each env once it holds a slot (asked in ``order``)."""
        if self._slots is None:
            self.send_op(indices, op, since)
            return
        ops = self._ops
        for k, i in enumerate(indices):
            ops[i] = (op, k)
        self._slots.request(indices if order is None else order)

    def _admitted(self, envs: list[int]) -> None:
        """``envs`` got their slots together: send their calls, one per op."""
        since = time.perf_counter()
        by_op: dict[int, tuple[Op, list[tuple[int, int]]]] = {}
        for i in envs:
            op, k = self._ops.pop(i)
            by_op.setdefault(id(op), (op, []))[1].append((i, k))
        for op, pairs in by_op.values():
            pairs.sort()
            self.send_op([i for i, _ in pairs], op.subset([k for _, k in pairs]), since)

    def forget_queued(self, envs: Iterable[int]) -> None:
        """Envs of ``envs`` still waiting for a slot are not sent (their calls are abandoned)."""
        if self._slots is not None:
            envs = list(envs)
            self._slots.forget(envs)
            for i in envs:
                self._ops.pop(i, None)

    def _finish(self, i: int, value: Any, error: BaseException | None) -> None:
        super()._finish(i, value, error)
        if self._slots is not None:
            self._slots.release(i)

    def _finish_block(self, block: StepBlock, since: float) -> None:
        super()._finish_block(block, since)
        slots = self._slots
        if slots is not None:
            with slots.deferred():
                for i in block.envs:
                    slots.release(i)
