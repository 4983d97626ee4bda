"""``backend="process"``: CPU-bound envs in worker processes, several envs per worker.

Theory of operation.  The envs are split into W contiguous groups, one per
worker process (``_host/child.py``), which builds its group from cloudpickled
factories.  What envs grouped on workers mean (who owns an env, cancel, a
worker's death, lost envs, rebuild, close) is `GroupedBackend`'s
(``_grouped.py``).  This module assembles the transport from three parts in
``_process/``: a `Link` per worker (its process and pipes: start, write,
read, how it died), the `Reactor` (the one table of descriptors that both
the event loop and a blocking caller's ``poll`` wait on) and the
`SharedBuffer` (step data).  ``launch`` writes one request
(``_messages.py``) per worker; the worker runs every env of its part through
the same drivers and flows as the inline backend and answers (a streamed
request in parts).  A reply, or a worker's death (SIGKILL, segfault, OOM),
wakes whichever waits; writing a request never takes a reply in.

Step data goes through one shared buffer (``_core/layout.py``), sized once
the parent has learnt the spaces.  A full ``step()`` copies the batch of
actions into it at once; each worker reads its rows, steps its envs, writes
its results into its rows, and answers with one small message holding only
what the rows cannot (infos, errors, odd transitions).  A whole step whose
actions fit the buffer is the *lean step* (`LeanStep`): the reset flags go
into the buffer too, each worker gets an 11-byte request, and a worker with
nothing to say beyond the buffer answers with 13 bytes (`LeanReply`).  A
blocking caller's wait (`_collect_lean`) compares each reply with the clean
one its request expects and delivers the whole step as one block.

Every request has a sequence number, which its reply repeats.  A worker is
seen dead by its sentinel, an end of file on its reply pipe, or a reply that
cannot be read (then it is killed): `GroupedBackend.lose` does the rest.
Replacing a worker (`replace`) kills the old one, starts a new one for the
same group and, once it is ready, maps the shared buffer in it.

The start method is `START_METHOD`; with ``"forkserver"`` the server
preloads aiovec, so a worker starts in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from aiovec._core import validate
from aiovec._core.layout import StepArrays, StepLayout
from aiovec._core.ops import Op, StepOp
from aiovec._core.rows import StepBlock
from aiovec.backends._base import EnvTraits
from aiovec.backends._grouped import GroupedBackend, close_op
from aiovec.backends._host import child
from aiovec.backends._messages import (
    CLEAN_STEP,
    LEAN,
    Attach,
    AttachReply,
    Call,
    Cancel,
    LeanReply,
    Rebuild,
    RebuildReply,
    Reply,
    StepReply,
    Stop,
)
from aiovec.backends._process import link as links
from aiovec.backends._process.lean import LeanSteps
from aiovec.backends._process.link import Link, framed
from aiovec.backends._process.reactor import Reactor, loop_parked
from aiovec.backends._process.shared import SharedBuffer
from aiovec.backends._table import Request

__all__ = ("START_METHOD", "ProcessBackend")

START_METHOD: str = os.environ.get("AIOVEC_START_METHOD") or (
    "forkserver" if sys.platform.startswith("linux") else "spawn"
)
"""The ``multiprocessing`` start method of new workers (read when a backend is built).

Set it with the ``AIOVEC_START_METHOD`` environment variable or by assigning
this attribute: ``"forkserver"`` (Linux default), ``"spawn"`` or ``"fork"``.
"""


class ProcessBackend(GroupedBackend):
    """Hosts envs in worker processes; waits on them through the event loop.

    Args:
        env_fns: The env factories.
        num_workers: How many worker processes (default: one per usable CPU).
        limiter: ``max_concurrency`` (this vector env's own): an env's call is
            sent to its worker once it holds a slot (`GroupedBackend.launch`).
        options: ``{"cpus": [...]}`` pins worker ``k`` to CPU
            ``cpus[k % len(cpus)]`` (Linux); ``None`` lets the OS place every
            worker; ``"auto"`` (the default) pins them when there is one
            worker per usable CPU, and lets the OS place them otherwise.
    """

    OPTIONS: ClassVar[frozenset[str]] = frozenset({"cpus"})
    INTERRUPTS = True
    workers: list[Link]

    def configure(self, num_workers: int | None, options: dict[str, Any]) -> int:
        """Read the options; one worker per usable CPU by default."""
        self._cpus_option = validate.check_cpus(options.get("cpus", "auto"))
        self._method = START_METHOD
        self._ctx = multiprocessing.get_context(self._method)
        if self._method == "forkserver":
            self._ctx.set_forkserver_preload([child.__name__])
        self._usable = validate.usable_cpus()
        self._seq = 0
        self._lean = LeanSteps()
        self._reactor = Reactor(self.workers, self._on_data, self._on_exit)
        self._buffer = SharedBuffer()
        self._in_buffer = False  # the step being launched is in the buffer already
        self._shared: SharedBuffer | None = None  # the buffer, once it is in use
        self._finalizer = weakref.finalize(self, links.reap, self.workers, self._buffer.close)
        return num_workers or len(self._usable)

    def start_workers(self) -> list[EnvTraits]:
        """A worker process per group (pinned, if so chosen); their reports."""
        cpus = self._cpus_option
        if cpus == "auto":  # one worker per usable CPU: each on its own
            pin = len(self.groups) == len(self._usable) and hasattr(os, "sched_setaffinity")
            cpus = tuple(self._usable) if pin else None
        assert not isinstance(cpus, str)
        self._cpus = cpus
        for w in range(len(self.groups)):
            self.workers.append(self._start(w))
        return [self._ready(w, links.first_message(link)) for w, link in enumerate(self.workers)]

    def _start(self, w: int) -> Link:
        group = self.groups[w]
        fns = [self._fns[i] for i in group]
        cpu = None if self._cpus is None else self._cpus[w % len(self._cpus)]
        return links.start(self._ctx, fns, group, self._buffer.fd, cpu)

    def _ready(self, w: int, body: Any) -> EnvTraits:
        """Worker ``w``'s traits, from its first word (``None``: it died first)."""
        traits = links.check_ready(self.workers[w], body, self._method)
        self.table.note_ready(w, body)
        return traits

    def started(self) -> None:
        """Share the step buffer; from now on replies are only read with ``os.read``."""
        traits = self.traits
        layout = StepLayout.of(traits.observation_spaces[0], traits.action_spaces[0], self.num_envs)
        if layout is not None:
            self._shared = self._buffer
            self._buffer.share(layout, self.workers, self._seq)
            self._seq += len(self.workers)
        for link in self.workers:
            os.set_blocking(link.reply_fd, False)

    @property
    def pids(self) -> tuple[int | None, ...]:
        """The process id of each worker (for diagnostics and tests)."""
        return tuple(link.process.pid for link in self.workers)

    @property
    def shares_memory(self) -> bool:
        """Whether step data goes through shared memory (else it is pickled)."""
        return self._shared is not None

    def step_arrays(self) -> StepArrays:
        """The shared buffer's arrays: every worker writes its rows there."""
        shared = self._shared
        assert shared is not None  # else every env is odd
        assert shared.arrays is not None
        return shared.arrays

    # -- requests ----------------------------------------------------------------------

    def _post_framed(self, link: Link, data: bytes) -> None:
        """Write a framed request (what the pipe cannot take waits for room).

        A broken pipe is ignored here: the worker's sentinel tells whichever waits next.
        """
        try:
            if link.write(data):
                self._reactor.wait_to_write(link)
        except OSError:
            pass

    def launch_whole(self, op: Op, since: float) -> bool:
        """A whole step whose actions fit the buffer is a lean step (`_lean_step`)."""
        if type(op) is not StepOp or op.stream or not self._buffer.put_step(op):
            return False
        self._lean_step(op, since)
        return True

    def _lean_step(self, op: StepOp, since: float) -> None:
        """A whole step whose actions are in the buffer: its reset flags go there too.

        Each request is in flight once written, as any request (`_written`).  A
        blocking caller's `_collect_lean` usually delivers the whole step at
        once, so each env's state (its request, when it started) is written
        only if that wait hands over to the general one (`_settle_lean`).
        """
        out = LeanSteps.frames(self.workers, self._seq, op.mode.value, op.timed)
        self._seq += len(out)
        for link, seq, data, clean in out:  # each in flight once written (see `_written`)
            self._post_framed(link, data)
            self.table.requests[seq] = self.table.track(link, link.group, since, op)
            self._lean.inflight.append((link, seq, clean))
        if not loop_parked():  # the loop delivers each reply: no lean wait
            self._settle_lean()

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Write one request per worker hosting some of ``indices``; returns at once.

        A streamed step's (``send()``) actions and reset flags go to the buffer if they fit.
        """
        self._reactor.attach()
        if self._lean:
            self._settle_lean()
        self._in_buffer = (
            type(op) is StepOp
            and op.stream
            and self._slots is None  # a call waiting for a slot is sent on its own
            and self._buffer.put_step(op, list(indices))
        )
        super().launch(indices, op)

    def part_of(self, op: Op, positions: list[int]) -> Op:
        """A part of ``op``; of a streamed step in the buffer, only its mode is sent."""
        return op if self._in_buffer else op.subset(positions)

    def request(self, worker: Link, envs: Sequence[int], op: Op, since: float) -> None:
        """Send ``op`` for ``envs`` (all hosted by ``worker``), pickled or lean."""
        self._seq += 1
        try:  # a call's argument may not pickle
            data = links.request_frame(self._seq, worker.group, envs, op, self._in_buffer)
        except Exception as exc:
            self.unsendable(envs, op, exc)
            return
        self._written(self._seq, self.table.track(worker, envs, since, op), data)

    def _written(self, seq: int, request: Request, data: bytes) -> None:
        """Write request ``seq`` (framed ``data``); only then is it in flight, its envs waiting.

        In that order, a Ctrl-C between two workers' requests (or between a
        write and its bookkeeping) can leave a request written and forgotten,
        whose reply is then dropped, but never one awaited that was never
        written: its worker would count as blocked in a call it never got, and
        ``reset()`` would replace it.  A write never reads: if the pipe is
        broken, the worker's sentinel tells whichever waits next (`_on_exit`).
        """
        self._post_framed(request.worker, data)
        self.table.requests[seq] = request
        self.table.wait_on(request, request.envs)

    def _control(self, link: Link, kind: type[Rebuild | Attach], arg: Any) -> asyncio.Future[Any]:
        """Send a request that no env waits on; its reply resolves the future."""
        loop = self._reactor.attach()
        self._seq += 1
        future: asyncio.Future[Any] = loop.create_future()
        self._written(self._seq, Request(link, (), 0.0, future), framed(kind(self._seq, arg)))
        return future

    def interrupt(self, worker: Link, locals_: list[int]) -> None:
        """Ask ``worker`` to cancel the calls of its async envs ``locals_``."""
        if worker.alive:
            self._post_framed(
                worker, framed(Cancel(0, locals_))
            )  # if it died: its sentinel says so

    # -- replies -----------------------------------------------------------------------

    def _on_data(self, link: Link, data: bytes) -> None:
        """Deliver the replies in ``data``, read from ``link`` (empty: it is exiting)."""
        if not data:  # the worker closed its end: it is exiting
            self._on_exit(link)
            return
        for payload in link.frames.feed(data):
            try:
                self._receive(link, payload)
            except Exception as exc:  # any: its envs must not wait forever
                self._unreadable(link, exc)
                return

    def _unreadable(self, link: Link, error: Exception) -> None:
        """A reply of ``link`` could not be delivered (corrupt, or a bug here): kill it.

        Its replies can no longer be trusted: its envs fail with `WorkerDiedError`
        (caused by ``error``) and are rebuilt on a new worker, as after a crash.
        """
        if link.alive:
            self._on_exit(link, link.kill(f"a reply of it could not be read ({error!r})", error))

    def _receive(self, link: Link, payload: bytes) -> None:
        """One reply: to a step, a call, or a control request (a future), by its ``seq``."""
        if payload[0] == LEAN:  # a step whose every result is in the buffer
            request = self.table.requests.pop(LeanReply.parse(payload).seq, None)
            if request is not None:
                self.deliver_step(request, CLEAN_STEP)
            return
        message: Reply = pickle.loads(payload)
        body = message.body
        if message.seq == 0:  # a respawned worker is ready (or failed to build)
            if link.ready is not None and not link.ready.done():
                link.ready.set_result(body)
            return
        if type(body) is StepReply and body.envs is not None:  # a part: more to come
            request = self.table.requests.get(message.seq)
        else:
            request = self.table.requests.pop(message.seq, None)
        if request is not None:  # else a reply to a request abandoned with its worker
            self.deliver(request, body)

    def _on_exit(self, link: Link, killed: ChildProcessError | None = None) -> None:
        """The worker's process ended (``killed``: why this side killed it): lose its envs."""
        if not link.alive:
            return
        self._settle_lean()
        self._reactor.changed()
        if killed is None:  # replies it sent before dying still count
            with contextlib.suppress(Exception):  # one that cannot be read is dropped
                for payload in link.last_words():
                    self._receive(link, payload)
        self._reactor.unwatch(link)
        link.alive = False
        link.close_pipes()
        link.process.join(1.0)  # its sentinel is ready: this reaps it at once
        died = killed if killed is not None else link.death()
        for request in self.table.forget(link):
            if request.future is not None and not request.future.done():
                request.future.set_exception(died)
        self.lose(link, died)
        for waiter in (link.ready, link.exited):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # -- waiting -----------------------------------------------------------------------

    async def collect(
        self,
        min_done: int,
        timeout: float | None = None,  # noqa: ASYNC109  (returns what finished by then)
    ) -> tuple[Any, dict[int, BaseException]]:
        """As `Backend.collect`; a blocking caller's wait is a plain ``poll``.

        While the loop is parked (`loop_parked`), nothing else can run on it,
        and every outcome comes through this backend's own pipes and
        sentinels: waiting on them here spares the task and the loop
        iterations a suspension costs.  Out of time, every worker's pipe is
        read once more, so that no reply that came in time is taken for late.
        """
        if not loop_parked():
            return await super().collect(min_done, timeout)
        self._wanted = min_done
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._lean.inflight:
            if min_done >= self.num_envs:
                self._collect_lean(deadline)
            self._settle_lean()
        while not self._satisfied():
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._reactor.wait(self.workers if wait_s == 0.0 else self._awaited(), wait_s)
            if wait_s == 0.0:
                break
        return self.take()

    def _collect_lean(self, deadline: float | None) -> None:
        """Wait for a lean step's clean replies (`LeanSteps.wait`) and deliver what came.

        Anything else ends it early; the general wait of `collect` reads the rest.
        """
        done: list[tuple[int, Request]] = []
        news = None
        try:
            news = self._lean.wait(self.table.requests, self._reactor, deadline, done)
        finally:
            self._deliver_clean(done)
            self._settle_lean()  # the rest, if any, waits in the general way
            if news is not None:
                self._on_data(*news)

    def _deliver_clean(self, done: list[tuple[int, Request]]) -> None:
        """Deliver requests whose every env's result is in the buffer (`_collect_lean`)."""
        for seq, _ in done:
            del self.table.requests[seq]
        if len(done) < len(self.workers):
            for _, request in done:
                self.deliver_step(request, CLEAN_STEP)
            return
        # Every worker's whole group, none cancelled: the whole step, as one block
        # (its envs' state was never written: nothing to clear).
        self._finish_block(StepBlock(self.all, self.step_arrays(), {}, {}), done[0][1].since)

    def _settle_lean(self) -> None:
        """Write the per-env state of the lean requests still in flight (see `_lean_step`)."""
        self._lean.settle(self.table, self._started)

    def _awaited(self) -> Sequence[Link]:
        """The workers a blocking wait listens to: the newest's alone for a whole step.

        When every outcome in flight is wanted (and none waits for a slot), the
        newest request's worker (`WorkTable.newest`) started last and usually
        ends last; the others are read once it has answered.  One wake-up per
        step: a parent woken early runs on some worker's core while it steps.
        """
        done = len(self._results) + len(self._errors)
        if self._slots is None and self._wanted >= len(self.pending) + done:
            newest = self.table.newest()
            return self.workers if newest is None else (newest,)
        return self.workers

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Abandon the calls in flight (of ``indices``, or all); async envs' are cancelled."""
        self._settle_lean()
        super().cancel(indices)

    def refresh(self) -> None:
        """Take in the replies blocked workers have sent (their late outcomes), if any."""
        for w in list(self.table.blocked):
            link = self.workers[w]
            if link.alive and (data := link.read()) is not None:
                self._on_data(link, data)

    def kill(self, w: int) -> None:
        """Kill worker ``w`` now (its envs are lost)."""
        link = self.workers[w]
        if link.alive:
            self._on_exit(link, link.kill("it was blocked"))

    # -- rebuilding and closing ----------------------------------------------------------

    async def rebuild_in_place(self, w: int, locals_: list[int]) -> dict[int, BaseException]:
        """Rebuild envs ``locals_`` in worker ``w`` (if it dies meanwhile: raises)."""
        reply: RebuildReply = await self._control(self.workers[w], Rebuild, locals_)
        return self.table.note_rebuilt(w, reply)

    async def replace(self, w: int) -> EnvTraits:
        """Kill worker ``w`` (if it still runs) and start a new one for its group."""
        loop = self._reactor.attach()
        link = self.workers[w]
        if link.alive:
            link.process.kill()
            self._on_exit(link)
        link = self.workers[w] = self._start(w)
        os.set_blocking(link.reply_fd, False)
        self._reactor.changed()
        link.ready = loop.create_future()
        self._reactor.watch(link)
        traits = self._ready(w, await link.ready)
        if self._shared is not None:
            attached: AttachReply = await self._control(link, Attach, self._shared.layout)
            if attached.error is not None:
                raise attached.error
        return traits

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env, ask every worker to exit, then terminate or kill stragglers."""
        loop = self._reactor.attach()
        try:
            errors = await self.close_live_envs()
        finally:
            exits = []
            for link in self.workers:
                if link.alive:
                    link.exited = loop.create_future()
                    exits.append(link.exited)
                    self._post_framed(link, framed(Stop()))
            if exits:
                await asyncio.wait(exits, timeout=links.GRACE)
            self._reactor.detach()
            self._buffer.fill = None  # it writes through views of the buffer unmapped next
            self._finalizer()
        return errors

    def close_now(self) -> None:
        """Without a loop (construction failed): ask workers to close their envs and exit.

        Workers get a grace period to do so; then they are terminated, killed, reaped.
        """
        self._reactor.detach()
        for link in self.workers:
            if link.alive:
                local = list(range(len(link.group)))
                self._post_framed(link, framed(Call(-1, local, close_op(len(local)))))
        self._buffer.fill = None  # it writes through views of the buffer unmapped next
        self._finalizer()
