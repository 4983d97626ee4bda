"""A worker process: its entry point, its serving loop, and the sink that publishes its results.

The parent starts the worker (`main`) with its request pipe, its reply pipe,
the completion table and the doorbell (descriptors), the step rows' file (not
sized yet), the group's factories (cloudpickled), the global index of its
first env and its own index.  It imports aiovec's worker code and what the
factories need, never the parent's main module (``link.py`` sees to that).
The worker builds the envs on a loop of its own and answers ``Reply(0,
Ready(...))`` or ``Reply(0, Failed(...))``.  Then it reads requests, in order,
and hands each to `Worker.handle`.

Every result leaves through one `TableSink`: a step's rows and a call's
outcomes are *published* in the completion table (``table.py``), each env's
``done`` set to the request's number, and negated where the env has more to
say than its rows (an info, a final, an error, an odd transition; a call's
outcome): that is written first, as a message on the reply pipe.  The worker
rings the parent's doorbell only when the table says its completions are the
ones the parent waits for.  A reply to a control request (a rebuild, an
attach) is a message counted in ``notes`` and always rings.  A message that
does not fit the reply pipe rings too, so the parent reads while the worker
waits for room: no write ever waits on a parent that sleeps.

While no call runs on the loop, the worker waits in a plain ``read``, so that
a group of sync envs pays nothing for the loop; otherwise it runs its loop
until a request comes.  A run of sync envs is cut by ``SIGALRM`` (set only
while such a run goes on; ``SA_RESTART``, so an env's system calls go on).
Errors that do not survive pickling are replaced by errors that do.  The
worker ignores SIGINT (Ctrl-C is the parent's to handle, and the parent
reaps its workers) and exits when its request pipe closes: the parent is gone
(under ``fork``, workers started later hold copies of earlier workers'
pipes; they exit too, so the closing cascades).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import pickle
import select
import signal
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from aiovec.backends.pool.host.envs import build_flow, run
from aiovec.backends.pool.host.jobs import Body, Jobs
from aiovec.backends.pool.host.worker import Worker
from aiovec.backends.pool.messages import (
    CallReply,
    Failed,
    Outcome,
    Reply,
    StepReply,
    StepRequest,
    Stop,
)
from aiovec.backends.process.table import CompletionTable
from aiovec.backends.process.wire import WHOLE, Frames, SharedFile, WholeStep, frame

__all__ = ("RING", "Boot", "Loop", "TableSink", "main", "new_loop", "register", "serve")

RING = (1).to_bytes(8, sys.byteorder)
"""What a worker writes to the doorbell: an eventfd adds it to its count; a pipe is readable."""


class Boot:
    """What a new worker is started with, besides its pipes (pickled into the process)."""

    __slots__ = (
        "bell",
        "factories",
        "first",
        "num_envs",
        "num_workers",
        "parent_ends",
        "rows",
        "specs",
        "table",
        "w",
    )

    def __init__(  # noqa: PLR0917  (one value, many parts)
        self,
        table: SharedFile,
        bell: SharedFile,
        rows: SharedFile,
        factories: bytes,
        first: int,
        w: int,
        num_envs: int,
        num_workers: int,
    ) -> None:
        self.table, self.bell, self.rows, self.factories = table, bell, rows, factories
        self.first, self.w, self.num_envs, self.num_workers = first, w, num_envs, num_workers
        self.specs: list[bytes] = []
        """The parent's gymnasium ids beyond gymnasium's own (`link.foreign_specs`)."""
        self.parent_ends: tuple[int, ...] = ()
        """Under ``fork``, the parent's ends of this worker's pipes, inherited: closed first,
        so that the request pipe ends when the parent is gone."""

    def __getstate__(self) -> tuple[Any, ...]:
        """Its fields, in order."""
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        """Its fields, from `__getstate__`."""
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)


def main(requests: Connection, replies: Connection, boot: Boot) -> None:
    """Entry point of a worker process (``multiprocessing.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in boot.parent_ends:
        os.close(fd)
    size = CompletionTable.nbytes(boot.num_envs, boot.num_workers)
    table = CompletionTable(mmap.mmap(boot.table.fd, size), boot.num_envs, boot.num_workers)
    sink = TableSink(replies.fileno(), table, boot.w, boot.first, boot.bell.fd)
    loop = Loop()
    try:
        register(boot.specs)
        built = run(build_flow(cloudpickle.loads(boot.factories), boot.first), loop)
        if isinstance(built, Failed):
            sink.reply(0, built)
            return
        if not any(built.is_async):  # sync envs run off the loop: release it until needed
            loop.close()
        worker = Worker(built, sink, loop, alarm=_alarm, shared_fd=boot.rows.fd)
        jobs = worker.jobs
        signal.signal(signal.SIGALRM, lambda signum, frame: jobs.on_alarm())
        signal.siginterrupt(signal.SIGALRM, False)  # a sync env's system calls go on
        try:
            sink.reply(0, built.ready())
            serve(worker, requests.fileno(), loop)
        finally:
            jobs.close()
    finally:
        loop.close()


def register(specs: list[bytes]) -> None:
    """Add the parent's gymnasium ids this process lacks (see ``link.py``)."""
    if not specs:
        return
    from gymnasium.envs.registration import registry  # noqa: PLC0415

    for data in specs:
        try:
            spec = cloudpickle.loads(data)
        except Exception:
            continue
        registry.setdefault(spec.id, spec)


def serve(worker: Worker, requests: int, loop: Loop) -> None:
    """Hand each request to ``worker`` until told to stop or the request pipe closes."""
    frames = Frames()
    group = range(len(worker.envs.envs))
    while True:
        data = _next(worker.jobs, requests, loop)
        if not data:  # the parent is gone
            return
        for payload in frames.feed(data):
            if payload[0] == WHOLE:
                seq, mode, stream, timed = WholeStep.parse(payload)
                request: Any = StepRequest(seq, group, mode, None, None, stream, timed)
            else:
                request = pickle.loads(payload)
                if type(request) is Stop:
                    return
            flow = worker.handle(request)
            if flow is not None:
                run(flow, loop)


def _next(jobs: Jobs, requests: int, loop: Loop) -> bytes:
    """The next bytes of requests; meanwhile the loop runs the calls in flight."""
    if jobs.running:
        running = loop()
        readable: asyncio.Future[None] = running.create_future()
        running.add_reader(requests, _resolve, readable)
        try:
            running.run_until_complete(jobs.until(readable))
        finally:
            running.remove_reader(requests)
            os.set_blocking(requests, True)  # uvloop's add_reader made it non-blocking
    return os.read(requests, 1 << 18)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _alarm(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_REAL, seconds)


class Loop:
    """The worker's own event loop, made when first needed."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> asyncio.AbstractEventLoop:
        """The loop (made now if there is none)."""
        if self._loop is None:
            self._loop = new_loop()
        return self._loop

    def close(self) -> None:
        """Close the loop (a later call makes a new one)."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def new_loop() -> asyncio.AbstractEventLoop:
    """A worker's event loop: uvloop's where it is installed (less per waiting env)."""
    try:
        import uvloop  # noqa: PLC0415  (an optional extra)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class TableSink:
    """Publishes a worker's results in the completion table; writes what is left to its pipe.

    Args:
        fd: The reply pipe (made non-blocking here: a full pipe rings, see `_write`).
        table: The completion table.
        w: This worker's index.
        first: The global index of its first env (its rows start there).
        bell: The doorbell's descriptor.
    """

    __slots__ = ("bell", "fd", "first", "table", "w")

    def __init__(self, fd: int, table: CompletionTable, w: int, first: int, bell: int) -> None:
        self.fd, self.table, self.w, self.first, self.bell = fd, table, w, first, bell
        os.set_blocking(fd, False)

    def stepped(self, seq: int, done: list[int], reply: StepReply) -> None:
        """Envs ``done`` of step request ``seq`` are done: publish them (and what they say)."""
        if not done:
            return
        first = self.first
        if not (reply.errors or reply.infos or reply.finals or reply.odd):
            rows: Any = _rows(first, done)
            marks: Any = seq
        else:
            said = {*reply.errors, *reply.infos, *reply.finals, *reply.odd}
            self._write(Reply(seq, reply._replace(envs=sorted(said))))
            rows = [first + j for j in done]
            marks = [-seq if j in said else seq for j in done]
        self._publish(rows, marks, len(done))

    def called(self, seq: int, locals_: Sequence[int], reply: CallReply) -> None:
        """Call request ``seq`` is done: its outcomes go by message, its envs marked as such."""
        self._write(Reply(seq, reply))
        self._publish(_rows(self.first, locals_), -seq, len(locals_))

    def reply(self, seq: int, body: Body) -> None:
        """A reply to control request ``seq`` (0: a new worker's first word): counted, rung.

        Counted once written: a parent that sees the count move before the
        message is in the pipe would read nothing, and never look again.
        """
        self._write(Reply(seq, body))
        self.table.note(self.w)
        self._ring()

    def _publish(self, rows: Any, marks: Any, count: int) -> None:
        if self.table.publish(self.w, rows, marks, count):
            self._ring()

    def _ring(self) -> None:
        try:  # noqa: SIM105  (a worker's hot path: no context manager)
            os.write(self.bell, RING)
        except BlockingIOError:  # a pipe doorbell that is full is rung already
            pass

    def _write(self, message: Reply) -> None:
        """Write ``message``, pickled (values that cannot be, replaced by errors), framed.

        While the pipe has no room, the parent is told (``notes``, the doorbell):
        it reads the pipe, so this never waits on a parent that sleeps.
        """
        try:
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps(_portable_message(message), pickle.HIGHEST_PROTOCOL)
        view = memoryview(frame(data))
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                self.table.note(self.w)
                self._ring()
                select.select([], [self.fd], [])


def _rows(first: int, locals_: Sequence[int]) -> Any:
    """The rows of envs ``locals_`` of a group starting at ``first``: a slice if contiguous."""
    if isinstance(locals_, range):
        return slice(first + locals_.start, first + locals_.stop)
    return [first + j for j in locals_]


def _portable_message(message: Reply) -> Reply:
    """``message`` with every value that cannot be pickled replaced by an error."""
    body = message.body
    if isinstance(body, CallReply):
        outcomes = [_portable_outcome(value, error) for value, error in body.outcomes]
        return message._replace(body=CallReply(outcomes))
    if isinstance(body, StepReply):
        errors = dict(body.errors)
        parts = body.infos, body.finals, body.odd
        for part in parts:
            for j in list(part):
                _, error = _portable_outcome(part[j], None)
                if error is not None:
                    del part[j]
                    errors[j] = error
        return message._replace(body=body._replace(errors=errors))
    return message


def _portable_outcome(value: Any, error: BaseException | None) -> Outcome:
    if error is not None:
        return None, error
    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return None, TypeError(f"the env's result {value!r} cannot be sent to the parent: {exc}")
    return value, None
