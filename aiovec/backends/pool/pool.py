"""The pool: envs grouped on workers, for ``backend="process"`` and ``backend="ray"`` alike.

Theory of operation.  The envs are split into W contiguous groups, one per
worker (a process, or a Ray actor).  `Pool` keeps everything about that
arrangement that does not depend on how a worker is reached, and drives a
`Transport` (``transport.py``) for the rest: ``backends/process/`` carries
requests through pipes and a shared completion table, ``backends/ray/``
through actor calls and object refs.  Its state lives in one `WorkTable`
(``table.py``: pure, no loop, no transport); the pool acts on its answers.

- **Who owns an env.**  ``owner[i]`` is the worker hosting env ``i``, for the
  vector env's whole life: a worker that is replaced hosts the same group.
  `parts` splits a call into one request per worker, by local index.
- **What is in flight.**  Each request is a `Request`: its worker, its envs,
  when it started.  ``waiting_on[i]`` is the request env ``i`` waits on; a
  reply is delivered only to the envs still waiting on it (`WorkTable.waiting`).
- **Streamed results.**  A request may be answered in parts (``send()``'s
  steps are): each `StepReply` names the envs it covers, the last one covers
  the rest; `deliver_step` hands over only those.
- **Cancel.**  `cancel` reports the envs as cancelled at once, marks their
  request *partial*, and keeps it in ``stuck`` until the worker's late
  outcome for them comes (then dropped).  An async env's call is cancelled
  in its worker (`Transport.interrupt`), and the worker goes on with its
  other envs.  A sync env cannot be interrupted: its worker is *blocked*
  until that call ends, and a call on any env of a blocked worker fails at
  once with a ``TimeoutError`` naming the abandoned call; its envs count as
  lost, so ``reset()`` and restarts replace the worker.
- **A worker dies** (killed, crashed, its node lost, or its reply unreadable):
  `lose` fails its envs in flight with one `WorkerDiedError` whose cause is a
  ``ChildProcessError`` saying which worker died and how, and leaves all its
  envs *lost*.  Any later call on a lost env fails at once with a
  `WorkerDiedError` too (`fail_lost`), until `rebuild` replaces the worker.
- **Replies to outcomes.**  `deliver_calls` and `deliver_step` turn a worker's
  typed reply (``messages.py``) into one outcome per waiting env: a value, an
  error, or a row of a step block (a transport may hand a whole step whose
  every result is in the step rows over as one block: `_finish_block`).
- **Rebuild.**  `rebuild` rebuilds envs inside a healthy worker; a dead or
  stuck worker is replaced by a new one (logged as a warning on the
  ``aiovec`` logger), whose envs must have the spaces of the others.
- **Close.**  `close_live_envs` gives blocked workers `STUCK_GRACE` seconds
  to end their abandoned call, kills those still blocked (their envs'
  failures were reported already: nothing is raised for them), then closes
  every env not lost within `CLOSE_TIMEOUT`; the transport then stops its
  workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import anyio

from aiovec._core.ops import Op
from aiovec._core.rows import Rows, StepBlock
from aiovec._errors import WorkerDiedError
from aiovec._log import logger
from aiovec.backends._base import Outcomes
from aiovec.backends._limit import SlottedBackend
from aiovec.backends.pool.messages import CallReply, Outcome, StepReply
from aiovec.backends.pool.table import Request, WorkTable
from aiovec.backends.pool.transport import (
    Part,
    Transport,
    check_replaced,
    join_traits,
    split,
)

__all__ = ("STUCK_GRACE", "Pool")


STUCK_GRACE = 0.5
"""Seconds ``close()`` waits for a worker blocked in an abandoned sync call before killing it."""


class Pool(SlottedBackend):
    """A backend whose envs live in groups on workers, reached through a `Transport`.

    A backend name binds a transport to it (``TRANSPORT``): ``backends/process/``
    and ``backends/ray/``.
    """

    TRANSPORT: ClassVar[type[Any]]
    """The transport's class: made with the pool and its ``backend_options`` (a `Transport`)."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Make the transport, start one worker per group, learn the envs' traits."""
        super().__init__(env_fns, num_workers, limiter, options)
        self.fns = list(env_fns)
        self.transport: Transport = type(self).TRANSPORT(self, dict(options or {}))
        count = num_workers or self.transport.default_workers
        self.groups = groups = split(self.num_envs, min(count, self.num_envs))
        self.all = range(self.num_envs)
        self.table = WorkTable(self.groups, self.transport.INTERRUPTS, self._on_unblocked)
        self._every: list[Part] = [(w, g, range(g.start, g.stop)) for w, g in enumerate(groups)]
        """Every whole group, as the parts of a call on every env."""
        self._every_env = set(self.all)
        self.owner = self.table.owner
        self._unblocked: asyncio.Future[None] | None = None  # a blocked worker came back
        try:
            self.traits = join_traits(self.transport.start())
        except BaseException:
            self.close_now()
            raise

    @property
    def workers(self) -> list[Any]:
        """The workers, ``workers[w]`` hosting ``groups[w]``."""
        return self.transport.workers

    @property
    def num_workers(self) -> int:
        """How many workers host the envs."""
        return len(self.workers)

    def _new_results(self) -> Rows:
        return Rows()

    def _on_unblocked(self) -> None:
        waiter = self._unblocked
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def lost(self) -> frozenset[int]:
        """Envs whose worker died or is blocked, until `rebuild` replaces it."""
        if self.table.blocked:
            self.refresh()
        return self.table.lost_envs()

    def refresh(self) -> None:
        """Take in, without waiting, the outcomes that have come (no collect waits now)."""
        self._wanted = 0
        self.transport.receive(_nothing, None)

    # -- calls -------------------------------------------------------------------------

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Start ``op`` on ``indices``: one request per worker hosting some; returns at once.

        Under ``max_concurrency`` each env's call is sent once it holds a slot
        (`_launch_limited`).
        """
        since = time.perf_counter()
        if self._slots is not None:
            self._launch_limited(indices, op, since)
            return
        table = self.table
        if indices == self.all and not table.lost and not table.blocked:  # every whole group
            if self.pending:
                self.pending.update(indices)
            else:  # (a copy of a set of the same size: no hashing, the step's hot path)
                self.pending = self._every_env.copy()
            self.transport.send(self._every, op, since, True)
            return
        self.pending.update(indices)
        for i in indices:
            self._started[i] = since
        self.transport.send(self.parts(indices), op, since, False)

    def _launch_limited(self, indices: Sequence[int], op: Op, since: float) -> None:
        """Ask a slot for each env of ``indices`` (`WorkTable.turns`); those given one go now.

        An env that must wait is queued (`Backend._queue`): its clock starts with its slot.
        """
        self.pending.update(indices)
        started = self._started
        for i in indices:
            started[i] = since
        self.launch_op(indices, op, since, self.table.turns(indices))

    def send_op(self, indices: Sequence[int], op: Op, since: float) -> None:
        """Send the calls of ``indices``, which got their slots together: a request per worker."""
        self.transport.send(self.parts(indices), op, since, False)

    def started_at(self, i: int) -> float | None:
        """As `Backend.started_at`; ``None`` too once env ``i`` is done, its result held back."""
        request = self.table.waiting_on[i]
        if request is not None and request.done and i in request.done:
            return None
        return super().started_at(i)

    def unsendable(self, envs: Sequence[int], op: Op, error: Exception) -> None:
        """``op`` cannot be sent to ``envs`` (e.g. an argument that does not pickle)."""
        for i in envs:
            self._finish(i, None, TypeError(f"cannot send {op.name}() to env {i}: {error}"))

    def parts(self, indices: Sequence[int]) -> list[Part]:
        """Each worker's part of a call (`WorkTable.parts`); unreachable envs fail now."""
        sends, blocked, lost = self.table.parts(indices)
        for w, envs in blocked.items():
            self.fail_blocked(w, envs)
        if lost:
            self.fail_lost(lost)
        return sends

    def fail_lost(self, lost: list[int]) -> None:
        """Fail ``lost`` (envs that are lost), as their worker's death did."""
        self._fail_gone(lost, self.table.lost_error(lost))

    def fail_blocked(self, w: int, envs: Sequence[int]) -> None:
        """Fail ``envs`` at once: their worker ``w`` still runs an abandoned sync call."""
        for i in envs:
            self._finish(i, None, self.table.blocked_error(i, self.workers[w]))

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Abandon the calls in flight (of ``indices``, or all).

        An async env's call is cancelled in its worker (where the transport can);
        a sync env's runs to its end and blocks its worker until then.  The
        envs that worker can no longer answer for (those that wait behind the
        blocking call, and those whose results it held back) are lost with it,
        each with a `LostWithWorkerError` error naming the env that blocks it.
        """
        self.refresh()  # what came in time is not abandoned
        targets = sorted(self.pending if indices is None else self.pending.intersection(indices))
        slots = self._slots
        if slots is None:
            self._abandon(targets)
            return
        self.forget_queued(targets)  # a queued env is not sent now only to be cancelled
        with slots.deferred():
            self._abandon(targets)

    def _abandon(self, targets: list[int]) -> None:
        lost, interrupt = self.table.abandon(targets, self.workers)
        for i in targets:
            if i not in lost:
                self._finish(i, None, asyncio.CancelledError(f"env {i}'s call was abandoned"))
        for i, error in lost.items():
            self._finish(i, None, error)
        for w, locals_ in interrupt.items():
            self.transport.interrupt(self.workers[w], locals_)

    # -- waiting -----------------------------------------------------------------------

    async def collect(
        self,
        min_done: int,
        timeout: float | None = None,  # noqa: ASYNC109  (returns what finished by then)
    ) -> Outcomes:
        """As `Backend.collect`; where the loop is parked, the transport waits by itself.

        Out of time, what has come is taken in once more: an outcome that came
        in time is never taken for late.
        """
        self._start_collect(min_done)
        deadline = None if timeout is None else time.monotonic() + timeout
        if (
            not self.transport.receive(self._needed, deadline)
            and self._needed()
            and not await self._sleep(timeout)
        ):
            self.refresh()
        return self.take()

    def _needed(self) -> int:
        """How many more outcomes the collect in progress waits for (0: none)."""
        if not self.pending:
            return 0
        return max(0, self._wanted - len(self._results) - len(self._errors))

    # -- replies -----------------------------------------------------------------------

    def deliver(self, request: Request, body: Any) -> None:
        """A worker's reply to ``request``: a control request's value, or its envs' outcomes."""
        if request.future is not None:
            if not request.future.done():
                request.future.set_result(body)
        elif type(body) is StepReply:
            self.deliver_step(request, body)
        else:
            assert isinstance(body, CallReply)
            self.deliver_calls(request, body.outcomes)

    def deliver_calls(self, request: Request, outcomes: list[Outcome]) -> None:
        """A call's reply: each waiting env's outcome."""
        waiting = set(self.table.waiting(request))
        slots = self._slots
        with contextlib.nullcontext() if slots is None else slots.deferred():
            for i, (value, error) in zip(request.envs, outcomes, strict=True):
                if i in waiting:
                    self._finish(i, value, error)

    def deliver_step(self, request: Request, reply: StepReply) -> None:
        """A step's reply: errors and odd transitions one by one, the rest as one block.

        A part of a streamed request (``reply.envs``) delivers only its envs;
        one of a request that holds (`WorkTable.unhold`) waits for its last part.
        """
        parts = self.table.unhold(request, reply)
        slots = self._slots
        if parts and (len(parts) > 1 or slots is not None):
            with contextlib.nullcontext() if slots is None else slots.deferred():
                for part in parts:
                    self._deliver_part(request, part)
        elif parts is None:
            self._deliver_part(request, reply)
        elif parts:
            self._deliver_part(request, parts[0])

    def _deliver_part(self, request: Request, reply: StepReply) -> None:
        errors, odd, part = reply.errors, reply.odd, reply.envs
        first = request.worker.group.start
        envs = None if part is None else [first + j for j in part]
        waiting = self.table.waiting(request, envs)
        if errors or odd or request.partial:
            waiting_set = set(waiting)
            for j, error in errors.items():
                if first + j in waiting_set:
                    self._finish(first + j, None, error)
            for j, transition in odd.items():
                if first + j in waiting_set:
                    self._finish(first + j, transition, None)
            waiting = [i for i in waiting if i - first not in errors and i - first not in odd]
        if not waiting:
            return
        rows, arrays = self.transport.rows_of(request, waiting, reply)
        infos, finals = reply.infos, reply.finals
        block = StepBlock(
            rows,
            arrays,
            {first + j: info for j, info in infos.items()} if infos else {},
            {first + j: final for j, final in finals.items()} if finals else {},
        )
        self._finish_block(block, request.since)

    # -- deaths ------------------------------------------------------------------------

    def lose(self, worker: Any, cause: ChildProcessError) -> None:
        """``worker`` died (``cause`` says how): lose its envs, fail those in flight."""
        self.table.lose(worker.group)
        self.fail_waiting(worker, cause)

    def fail_waiting(self, worker: Any, cause: ChildProcessError) -> None:
        """Fail the envs waiting on ``worker`` (not on a worker that replaced it).

        Results it held back are delivered first: those envs finished before
        it died (they are lost with it, and their next call says so).
        """
        for request in self.table.holding(worker):
            held, request.held, request.done = request.held, None, set()
            for part in held or ():
                self._deliver_part(request, part)
        waiting = self.table.take_waiting(worker)
        if waiting:
            error = WorkerDiedError(dict.fromkeys(waiting, cause), worker.describe())
            for i in waiting:
                self._finish(i, None, error)

    # -- rebuilding ------------------------------------------------------------------

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Rebuild envs in their worker; a dead or stuck worker is replaced by a new one."""
        by_worker = self.table.by_owner(indices)
        calls = [self._rebuild_group(w, envs) for w, envs in by_worker.items()]
        errors: dict[int, BaseException] = {}
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for envs, outcome in zip(by_worker.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                errors.update(dict.fromkeys(envs, outcome))
            else:
                errors.update(outcome)
        return errors

    async def _rebuild_group(self, w: int, envs: list[int]) -> dict[int, BaseException]:
        first = self.groups[w].start
        table = self.table
        if table.healthy(w, self.workers[w].alive):
            failed = await self.transport.rebuild_in_place(w, [i - first for i in envs])
            if failed is not None:
                table.lost.difference_update(i for i in envs if i - first not in failed)
                return {first + j: error for j, error in failed.items()}
        logger.warning(
            "replacing the %s (envs %s): it died or is stuck in an abandoned call",
            self.workers[w].describe(),
            envs,
        )
        if w in table.blocked:  # its other envs go with it: lost until rebuilt too
            table.lost.update(self.groups[w])
        check_replaced(envs, first, await self.transport.replace(w), self.traits)
        table.lost.difference_update(envs)
        return {}

    # -- closing ---------------------------------------------------------------------

    async def settle_cancelled(self) -> None:
        """Let the transport's own work for cancelled calls end (Ray's streamed steps)."""
        await self.transport.settle_cancelled()

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env still hosted, then stop every worker."""
        errors: dict[int, BaseException] | None = None
        try:
            errors = await self.close_live_envs()
            return errors
        finally:
            await self.transport.aclose(errors)

    def close_now(self) -> None:
        """Without a loop (construction failed): close the envs, best effort; stop everything."""
        self.transport.close_now()

    async def close_live_envs(self) -> dict[int, BaseException]:
        """Close every env not lost (within `CLOSE_TIMEOUT`); errors by env.

        A worker still blocked in an abandoned sync call `STUCK_GRACE` seconds
        from now is killed: its envs are not closed, and nothing is raised for
        them (the call that abandoned them raised already).
        """
        await self.drain()  # calls still in flight are abandoned now
        await self.settle(self.all)
        for w, what in list(self.table.blocked.items()):
            worker = self.workers[w]
            text = "killing the %s: it still runs %s, abandoned; envs %s are not closed"
            logger.warning(text, worker.describe(), what, list(worker.group))
            self.transport.kill(w)
        alive = [i for i in range(self.num_envs) if i not in self.table.lost]
        return await self._close_envs(alive)

    async def settle(self, indices: Sequence[int]) -> None:
        """Give the workers of ``indices`` blocked in an abandoned call `STUCK_GRACE` s to end it.

        A call that was abandoned just before it ended (a Ctrl-C, a deadline met
        by a hair) usually ends within milliseconds: its worker is then not
        replaced (by ``reset()``) or killed (by ``close()``) for nothing.
        """
        owners = {self.owner[i] for i in indices}
        blocked = self.table.blocked

        def stuck() -> int:
            return 0 if owners.isdisjoint(blocked) else 1

        deadline = time.monotonic() + STUCK_GRACE
        while stuck() and (left := deadline - time.monotonic()) > 0:
            if self.transport.receive(stuck, deadline) or not stuck():
                continue
            self._unblocked = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait([self._unblocked], timeout=left)
            finally:
                self._unblocked = None


def _nothing() -> int:
    """No outcome is waited for (a `Transport.receive` that takes in what came, only)."""
    return 0
