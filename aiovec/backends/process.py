"""``backend="process"``: CPU-bound envs in worker processes, several envs per worker.

Theory of operation.  The envs are split into W contiguous groups, one per
worker process (``_host/child.py``), which builds its group from cloudpickled
factories.  What envs grouped on workers mean (who owns an env, cancel, a
worker's death, lost envs, rebuild, close) is `GroupedBackend`'s
(``_grouped.py``); this module is the transport: pipes, the shared buffer and
the process sentinels.  ``launch`` writes one request (``_messages.py``) per
worker; the worker runs every env of its part through the same drivers and
flows as the inline backend and answers once.  Nothing here ever waits on a
worker outside the event loop: each worker's reply pipe and its process
sentinel are registered with ``loop.add_reader``, so a reply, or a worker's
death (SIGKILL, segfault, OOM), wakes the loop at once; requests that do not
fit the request pipe wait for it with ``loop.add_writer``.  No thread, no
spinning.

Step data goes through one shared buffer (``_core/layout.py``): an anonymous
``memfd`` (an unlinked temporary file where there is none) that every worker
receives as it starts, and maps once the parent has learnt the spaces and sized
it.  It has no name, so nothing can be left in ``/dev/shm``, whatever dies.  A full ``step()``
copies the batch of actions into it at once; each worker reads its rows, steps
its envs and writes observations, rewards and flags into its rows, and answers
with one small message holding only the infos that were not empty (and
whatever did not fit the buffer exactly, which is then batched by the usual
rules).  Its envs' results come back as one `StepBlock`,
which the batcher copies out of the buffer at once.  Other calls (reset,
render, ...) and spaces that cannot be laid out travel pickled.  A whole step
whose actions fit the buffer is the *lean step* (`LeanStep`): the reset flags
go into the buffer too, each worker gets a 10-byte request, and a worker with
nothing to say beyond the buffer answers with 9 bytes.

When the running loop is *parked* (marked as this thread's running loop but
not running: a blocking caller drives the coroutine by hand, see
`_loop_parked`), nothing else can run on it, so `collect` waits in ``poll`` on
the pipes and sentinels itself, without a task or a loop iteration.  The
backend asks the loop, not who drives it.  For a
whole step it listens to the newest request's worker first and reads the
others after it: one wake-up per step.  Replies that are exactly the expected
lean replies are taken as they are and the step is delivered as one block;
anything else is read by the general wait.

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
import math
import mmap
import multiprocessing
import os
import pickle
import select
import signal
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, ClassVar

import cloudpickle

from aiovec._core import validate
from aiovec._core.layout import Filler, StepArrays, StepLayout
from aiovec._core.ops import CallOp, Op, StepOp
from aiovec._core.rows import StepBlock
from aiovec._errors import WorkerDiedError
from aiovec.backends._base import EnvTraits
from aiovec.backends._grouped import (
    GroupedBackend,
    Request,
    close_op,
    ready_traits,
)
from aiovec.backends._host import child
from aiovec.backends._messages import (
    CLEAN_STEP,
    LEAN,
    Attach,
    AttachReply,
    Call,
    CallReply,
    Cancel,
    LeanReply,
    LeanStep,
    Rebuild,
    RebuildReply,
    Reply,
    StepReply,
    StepRequest,
    Stop,
)
from aiovec.backends._wire import READ_SIZE, Frames, SharedFile, frame

__all__ = ("START_METHOD", "ProcessBackend")

START_METHOD: str = os.environ.get("AIOVEC_START_METHOD") or (
    "forkserver" if sys.platform.startswith("linux") else "spawn"
)
"""The ``multiprocessing`` start method of new workers (read when a backend is built).

Set it with the ``AIOVEC_START_METHOD`` environment variable or by assigning
this attribute: ``"forkserver"`` (Linux default), ``"spawn"`` or ``"fork"``.
"""

_GRACE = 2.0  # seconds workers get to exit once asked, before terminate, then kill
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_STOP = frame(pickle.dumps(Stop(), _PROTOCOL))


class _Worker:
    """The parent's handle on one worker process and its two pipes."""

    __slots__ = (
        "alive",
        "exited",
        "frames",
        "group",
        "outbox",
        "process",
        "ready",
        "replies",
        "reply_fd",
        "request_fd",
        "requests",
        "sentinel",
    )

    def __init__(
        self, process: Any, requests: Connection, replies: Connection, group: range
    ) -> None:
        self.process, self.requests, self.replies, self.group = process, requests, replies, group
        # Read once: a Connection's fileno() and a process's sentinel are Python-level calls.
        self.request_fd, self.reply_fd = requests.fileno(), replies.fileno()
        self.sentinel: int = process.sentinel
        os.set_blocking(self.request_fd, False)  # a full pipe never blocks the loop
        self.alive = True
        self.frames = Frames()
        self.outbox = bytearray()  # requests the pipe had no room for yet
        self.ready: asyncio.Future[Any] | None = None  # a respawned worker's first message
        self.exited: asyncio.Future[None] | None = None  # set once it is seen dead

    def close_pipes(self) -> None:
        self.requests.close()
        self.replies.close()

    def describe(self) -> str:
        return (
            f"worker process {self.process.pid} hosting envs {self.group.start}-"
            f"{self.group.stop - 1}"
        )

    def death(self) -> ChildProcessError:
        """How it died, as the cause of its envs' `WorkerDiedError`."""
        code = self.process.exitcode
        how = "exit code unknown" if code is None else f"exit code {code}"
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        return ChildProcessError(f"{self.describe()} died ({how})")


class _SharedBuffer:
    """The step buffer: an anonymous file, sized and mapped once the spaces are known."""

    def __init__(self) -> None:
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("aiovec-steps", os.MFD_CLOEXEC)
        else:  # an unlinked temporary file: just as nameless
            with tempfile.TemporaryFile() as file:
                self.fd = os.dup(file.fileno())
        self.layout: StepLayout | None = None
        self.map: mmap.mmap | None = None
        self.arrays: StepArrays | None = None

    def size(self, layout: StepLayout) -> StepArrays:
        """Size the file for ``layout`` and map it here."""
        os.ftruncate(self.fd, layout.nbytes)
        self.map = mmap.mmap(self.fd, layout.nbytes)
        self.layout = layout
        self.arrays = layout.arrays(self.map)
        return self.arrays

    def close(self) -> None:
        """Drop this process's mapping and descriptor (workers drop theirs on exit)."""
        self.arrays = None
        if self.map is not None:
            with contextlib.suppress(BufferError):  # views still alive: unmapped when collected
                self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


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

    def configure(self, num_workers: int | None, options: dict[str, Any]) -> int:
        """Read the options; one worker per usable CPU by default."""
        self._cpus_option = validate.check_cpus(options.get("cpus", "auto"))
        self._ctx = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            self._ctx.set_forkserver_preload([child.__name__])
        self._usable = validate.usable_cpus()
        self._seq = 0
        self._requests: dict[int, Request] = {}
        self._lean: list[tuple[_Worker, int, bytes]] = []  # (worker, seq, its clean reply)
        # a blocking wait's poll objects, by worker (lean) or by what they listen to
        self._pollers: dict[Any, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buffer = _SharedBuffer()
        self._in_buffer = False  # the step being launched is in the buffer already
        self._shared: _SharedBuffer | None = None  # the buffer, once it is in use
        self._fill_actions: Filler | None = None  # actions into the buffer
        self._finalizer = weakref.finalize(self, _reap, self.workers, self._buffer)
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
        return [self._ready(w, _first_message(worker)) for w, worker in enumerate(self.workers)]

    def _ready(self, w: int, reply: Any) -> EnvTraits:
        """Worker ``w``'s traits, from its first word."""
        traits = _check_ready(self.workers[w], reply)
        self.note_ready(w, reply)
        return traits

    def started(self) -> None:
        """Share the step buffer; from now on replies are only read with ``os.read``."""
        self._share(self.traits)
        for worker in self.workers:
            os.set_blocking(worker.reply_fd, False)

    @property
    def pids(self) -> tuple[int | None, ...]:
        """The process id of each worker (for diagnostics and tests)."""
        return tuple(worker.process.pid for worker in self.workers)

    @property
    def shares_memory(self) -> bool:
        """Whether step data goes through shared memory (else it is pickled)."""
        return self._shared is not None

    def _start(self, w: int) -> _Worker:
        """Start worker ``w``, hosting the ``w``-th group (on its CPU, if pinned)."""
        group = self.groups[w]
        payload = cloudpickle.dumps([self._fns[i] for i in group])
        child_requests, requests = self._ctx.Pipe(duplex=False)
        replies, child_replies = self._ctx.Pipe(duplex=False)
        shared = SharedFile(self._buffer.fd)
        try:
            process = self._ctx.Process(  # type: ignore[attr-defined]
                target=child.main,
                args=(child_requests, child_replies, shared, payload, group.start),
                name=f"aiovec-worker-{group.start}",
                daemon=True,
            )
            process.start()
            if self._cpus is not None:
                with contextlib.suppress(ProcessLookupError):  # it died at once: seen later
                    os.sched_setaffinity(process.pid, {self._cpus[w % len(self._cpus)]})
        except BaseException:
            requests.close()
            replies.close()
            raise
        finally:
            child_requests.close()
            child_replies.close()
        return _Worker(process, requests, replies, group)

    # -- the shared step buffer --------------------------------------------------------

    def _share(self, traits: EnvTraits) -> None:
        """Size the step buffer (if the spaces can be laid out) and map it in every worker."""
        layout = StepLayout.of(traits.observation_spaces[0], traits.action_spaces[0], self.num_envs)
        if layout is None:
            return
        arrays = self._buffer.size(layout)
        self._shared = self._buffer
        if layout.actions is not None:
            self._fill_actions = layout.actions.filler(arrays.actions)
        for worker in self.workers:  # construction has no loop: wait here for each answer
            self._seq += 1
            self._post(worker, Attach(self._seq, layout))
            wait([worker.replies, worker.process.sentinel])
            try:
                reply: Reply = pickle.loads(worker.replies.recv_bytes())
                assert isinstance(reply.body, AttachReply)
                error = reply.body.error
            except (EOFError, OSError):
                worker.process.join(1.0)
                died = worker.death()
                raise WorkerDiedError(dict.fromkeys(worker.group, died), "setup") from died
            if error is not None:
                raise error

    def _post(self, worker: _Worker, message: Any, data: bytes | None = None) -> None:
        """Send a request (``data``: already pickled), queueing what the pipe cannot take."""
        if data is None:
            data = pickle.dumps(message, _PROTOCOL)
        self._post_framed(worker, frame(data))

    def _post_framed(self, worker: _Worker, data: bytes) -> None:
        """`_post` a message already framed."""
        if not worker.outbox:
            try:
                written = os.write(worker.request_fd, data)
            except BlockingIOError:
                written = 0
            if written == len(data):
                return
            data = data[written:]
            if self._loop is not None:
                self._loop.add_writer(worker.requests.fileno(), self._flush, worker)
        worker.outbox += data
        if self._loop is None:  # no loop (construction): wait here, a while at most
            deadline = time.monotonic() + _GRACE
            while worker.outbox and time.monotonic() < deadline:
                select.select([worker.process.sentinel], [worker.requests], [], _GRACE)
                if worker.process.exitcode is not None:
                    raise BrokenPipeError(worker.describe())
                self._flush(worker)

    def _flush(self, worker: _Worker) -> None:
        """The request pipe has room again: write what waited."""
        fd = worker.request_fd
        try:
            written = os.write(fd, worker.outbox)
        except BlockingIOError:
            return
        except OSError:  # the worker died: its sentinel says so
            return
        del worker.outbox[:written]
        if not worker.outbox and self._loop is not None:
            self._loop.remove_writer(fd)

    # -- the event loop watches every worker ---------------------------------------------

    def _attach(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._detach()
            self._loop = loop
            for worker in self.workers:
                if worker.alive:
                    self._watch(worker)
        return loop

    def _watch(self, worker: _Worker) -> None:
        assert self._loop is not None
        self._loop.add_reader(worker.replies.fileno(), self._on_readable, worker)
        self._loop.add_reader(worker.process.sentinel, self._on_exit, worker)
        if worker.outbox:
            self._loop.add_writer(worker.requests.fileno(), self._flush, worker)

    def _unwatch(self, worker: _Worker) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(worker.replies.fileno())
            loop.remove_reader(worker.process.sentinel)
            loop.remove_writer(worker.requests.fileno())

    def _detach(self) -> None:
        for worker in self.workers:
            if worker.alive:
                self._unwatch(worker)
        self._loop = None

    def _on_readable(self, worker: _Worker) -> None:
        data = _read(worker)
        if data is not None:
            self._on_data(worker, data)

    def _on_data(self, worker: _Worker, data: bytes) -> None:
        """Deliver the replies in ``data``, read from ``worker`` (empty: it is exiting)."""
        if not data:  # the worker closed its end: it is exiting
            self._on_exit(worker)
            return
        for payload in worker.frames.feed(data):
            try:
                self._receive(worker, payload)
            except Exception as exc:  # any: its envs must not wait forever
                self._unreadable(worker, exc)
                return

    def _unreadable(self, worker: _Worker, error: Exception) -> None:
        """A reply of ``worker`` could not be delivered: kill it and lose its envs.

        A corrupt message, or a bug on this side: either way the worker's replies
        can no longer be trusted, and its envs in flight would wait forever.  They
        fail with `WorkerDiedError` (caused by ``error``), and the vector env's
        ``reset()`` or a restart rebuilds them on a new worker, as after a crash.
        """
        if not worker.alive:
            return
        worker.process.kill()
        died = ChildProcessError(
            f"{worker.describe()} was killed: a reply of it could not be read "
            f"({type(error).__name__}: {error})"
        )
        died.__cause__ = error
        self._on_exit(worker, died)

    def _receive(self, worker: _Worker, payload: bytes) -> None:
        if payload[0] == LEAN:  # a step whose every result is in the buffer
            seq = LeanReply.parse(payload).seq
            request = self._requests.pop(seq, None)
            if request is not None:
                self.deliver_step(request, CLEAN_STEP)
            return
        self._deliver(worker, pickle.loads(payload))

    def _deliver(self, worker: _Worker, message: Reply) -> None:
        seq, reply = message
        if seq == 0:  # a respawned worker is ready (or failed to build)
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(reply)
            return
        if type(reply) is StepReply and reply.envs is not None:  # a part: more to come
            request = self._requests.get(seq)
        else:
            request = self._requests.pop(seq, None)
        if request is None:  # a reply to a request abandoned with its worker
            return
        if request.future is not None:
            if not request.future.done():
                request.future.set_result(reply)
        elif type(reply) is StepReply:
            self.deliver_step(request, reply)
        else:
            assert isinstance(reply, CallReply)
            self.deliver_calls(request, reply.outcomes)

    def step_arrays(self) -> StepArrays:
        """The shared buffer's arrays: every worker writes its rows there."""
        shared = self._shared
        assert shared is not None  # else every env is odd
        assert shared.arrays is not None
        return shared.arrays

    def _on_exit(self, worker: _Worker, killed: ChildProcessError | None = None) -> None:
        """The worker's process ended (or its pipe broke): fail and lose its envs.

        ``killed``: why this side killed it (its replies are not read any more).
        """
        if not worker.alive:
            return
        self._settle_lean()
        self._pollers.clear()
        if killed is None:
            # Replies it sent before dying still count; one that cannot be read is
            # dropped (its envs fail below with the others).
            with contextlib.suppress(Exception):
                os.set_blocking(worker.replies.fileno(), False)
                while data := os.read(worker.replies.fileno(), READ_SIZE):
                    for payload in worker.frames.feed(data):
                        self._receive(worker, payload)
        self._unwatch(worker)
        worker.alive = False
        worker.close_pipes()
        worker.process.join(1.0)  # its sentinel is ready: this reaps it at once
        died = killed if killed is not None else worker.death()
        for seq, request in list(self._requests.items()):
            if request.worker is worker:
                del self._requests[seq]
                if request.future is not None and not request.future.done():
                    request.future.set_exception(died)
        self.lose(worker, died)
        for waiter in (worker.ready, worker.exited):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # -- running ops -------------------------------------------------------------------

    def launch_whole(self, op: Op, since: float) -> bool:
        """A whole step whose actions fit the buffer is a lean step (`_lean_step`)."""
        if not self._actions_in_buffer(op):
            return False
        self._lean_step(op, since)
        return True

    def _actions_in_buffer(self, op: Op) -> bool:
        """Copy a whole step's batch of actions into the shared buffer, if it fits exactly.

        Not a streamed step's: the lean step answers once, when every env is done.
        """
        fill = self._fill_actions
        if fill is None or not isinstance(op, StepOp) or op.batch is None or op.stream:
            return False
        return fill(op.batch)

    def _lean_step(self, op: Op, since: float) -> None:
        """A whole step whose actions are in the buffer: its reset flags go there too.

        Every request is made before any is written, so that the workers start
        together: a worker woken while the parent still works shares its core.
        Each is in flight once written, as any request (`_written`).
        A blocking caller's `_collect_lean` usually delivers the whole step at
        once, so each env's state (its request, when it started) is written only
        if that wait hands over to the general one (`_settle_lean`).
        """
        assert isinstance(op, StepOp)
        assert self._shared is not None
        assert self._shared.arrays is not None
        self._shared.arrays.resets[:] = op.reset_first
        mode = op.mode.value
        out = []
        for worker in self.workers:
            self._seq += 1
            seq = self._seq
            data = LeanStep.frame(seq, mode, timed=op.timed)
            out.append((worker, seq, data, LeanReply.frame(seq)))
        for worker, seq, data, clean in out:  # each in flight once written (see `_written`)
            died = not self._try_post(worker, data)
            self._requests[seq] = self.track(worker, worker.group, since, op)
            self._lean.append((worker, seq, clean))
            if died:  # its sentinel may not have woken the loop yet
                self._on_exit(worker)
        if not _loop_parked():  # the loop delivers each reply: no lean wait
            self._settle_lean()

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Write one request per worker hosting some of ``indices``; returns at once.

        A streamed step (``send()``) whose actions fit the shared buffer puts
        them there, with its reset flags, for every env at once.
        """
        self._attach()
        if self._lean:
            self._settle_lean()
        self._in_buffer = (
            isinstance(op, StepOp)
            and op.stream
            and self._slots is None  # a call waiting for a slot is sent on its own
            and self._fill_actions is not None
            and op.batch is not None
            and self._stream_into_buffer(indices, op)
        )
        super().launch(indices, op)

    def _stream_into_buffer(self, indices: Sequence[int], op: StepOp) -> bool:
        """Copy a streamed step's actions and reset flags into the rows of ``indices``."""
        assert self._fill_actions is not None
        assert self._shared is not None
        assert self._shared.arrays is not None
        rows = list(indices)
        if not self._fill_actions(op.batch, rows):
            return False
        self._shared.arrays.resets[rows] = op.reset_first
        return True

    def part_of(self, op: Op, positions: list[int]) -> Op:
        """A part of ``op``; of a streamed step in the buffer, only its mode is sent."""
        return op if self._in_buffer else op.subset(positions)

    def request(self, worker: _Worker, envs: Sequence[int], op: Op, since: float) -> None:
        """Send ``op`` for ``envs`` (all hosted by ``worker``), pickled or lean."""
        self._seq += 1
        seq = self._seq
        first = worker.group.start
        locals_: Sequence[int] = (
            range(envs.start - first, envs.stop - first)
            if isinstance(envs, range)
            else [i - first for i in envs]
        )
        message: StepRequest | Call
        if isinstance(op, StepOp):
            if self._in_buffer:  # a streamed step: its actions are in the rows already
                if len(locals_) == len(worker.group):  # distinct envs: its whole group
                    data = LeanStep.frame(seq, op.mode.value, stream=True)
                else:
                    message = StepRequest(seq, locals_, op.mode.value, None, None, True)
                    data = frame(pickle.dumps(message, _PROTOCOL))
                self._written(seq, self.track(worker, envs, since, op), data)
                return
            message = StepRequest(
                seq, locals_, op.mode.value, op.reset_first, op.actions, op.stream, op.timed
            )
        else:
            assert isinstance(op, CallOp)
            message = Call(seq, locals_, op)
        try:
            try:
                data = pickle.dumps(message, _PROTOCOL)
            except Exception:  # e.g. a lambda among call() arguments
                data = cloudpickle.dumps(message, _PROTOCOL)
        except Exception as exc:
            self.unsendable(envs, op, exc)
            return
        self._written(seq, self.track(worker, envs, since, op), frame(data))

    def _written(self, seq: int, request: Request, data: bytes) -> None:
        """Write request ``seq`` (framed ``data``); only then is it in flight, its envs waiting.

        In that order, a Ctrl-C between two workers' requests (or between a
        write and its bookkeeping) can leave a request written and forgotten,
        whose reply is then dropped, but never one awaited that was never
        written: its worker would count as blocked in a call it never got, and
        ``reset()`` would replace it.
        """
        died = not self._try_post(request.worker, data)
        self._requests[seq] = request
        self.wait_on(request, request.envs)
        if died:  # its sentinel may not have woken the loop yet
            self._on_exit(request.worker)

    def _try_post(self, worker: _Worker, data: bytes) -> bool:
        """`_post_framed`; ``False`` if the worker is gone (the pipe is broken)."""
        try:
            self._post_framed(worker, data)
        except OSError:
            return False
        return True

    def _control(
        self, worker: _Worker, kind: type[Rebuild | Attach], arg: Any
    ) -> asyncio.Future[Any]:
        """Send a request that no env waits on; its reply resolves the future."""
        assert self._loop is not None
        self._seq += 1
        future: asyncio.Future[Any] = self._loop.create_future()
        data = frame(pickle.dumps(kind(self._seq, arg), _PROTOCOL))
        self._written(self._seq, Request(worker, (), 0.0, future), data)
        return future

    async def collect(
        self,
        min_done: int,
        timeout: float | None = None,  # noqa: ASYNC109  (returns what finished by then)
    ) -> tuple[Any, dict[int, BaseException]]:
        """As `Backend.collect`; a blocking caller's wait is a plain ``poll``.

        While the loop is parked (`_loop_parked`), nothing else can run on it,
        and every outcome comes through this backend's own pipes and
        sentinels: waiting on them here spares the task and the loop
        iterations a suspension costs.
        """
        if not _loop_parked():
            return await super().collect(min_done, timeout)
        self._wanted = min_done
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._lean and min_done >= self.num_envs:
            self._collect_lean(deadline)
        self._settle_lean()
        while not self._satisfied():
            wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
            # Out of time: one last look at every worker, so that no reply that came
            # in time is taken for late.
            awaited = self.workers if wait_s == 0.0 else self._awaited()
            poller, handlers = self._general_poller(awaited)
            events = poller.poll(None if wait_s is None else math.ceil(wait_s * 1000))
            if len(events) > 1:  # deaths first
                events.sort(key=lambda event: handlers[event[0]][0] != self._on_exit)
            for fd, _ in events:
                handler, worker = handlers[fd]
                if worker.alive:  # else seen dead by its sentinel just before
                    handler(worker)
            if wait_s == 0.0:
                break
        return self.take()

    def _collect_lean(self, deadline: float | None) -> None:
        """Wait by hand for the replies of a lean step, the newest request's first.

        The usual case, and the one worth a path of its own: each worker
        answers with exactly its clean lean reply, the whole step is in the
        buffer, and the step is delivered as one block.  Each worker is waited
        on in turn, with every sentinel.  Anything else (a reply with news, a
        death, the deadline) ends this wait early: what it took is delivered,
        and the general wait of `collect` reads the rest.
        """
        lean = self._lean
        if any(worker.outbox for worker, _, _ in lean):  # a request still waits to be written
            return
        done: list[tuple[int, Request]] = []
        news: tuple[_Worker, bytes] | None = None
        try:
            for k, (worker, seq, clean) in enumerate(reversed(lean)):
                request = self._requests.get(seq)
                if request is None or request.partial or not worker.alive or worker.frames.partial:
                    return
                # Once the newest has answered, the others usually have too: read first.
                data = _read(worker) if k else None
                if data is None:
                    wait_ms = None
                    if deadline is not None:
                        wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
                    events = self._poller(worker).poll(wait_ms)
                    if len(events) != 1 or events[0][0] != worker.reply_fd:  # death, time up
                        return
                    data = _read(worker)
                if data != clean:
                    if data is not None:
                        news = worker, data
                    return
                done.append((seq, request))
        finally:
            self._deliver_clean(done)
            self._settle_lean()  # the rest, if any, waits in the general way
            if news is not None:
                self._on_data(*news)

    def _general_poller(
        self, awaited: Sequence[_Worker]
    ) -> tuple[Any, dict[int, tuple[Callable[[_Worker], None], _Worker]]]:
        """A poll object for a blocking wait, and which handler each of its descriptors calls.

        It listens to every live worker's sentinel, the replies of ``awaited``
        and the request pipes with messages waiting (``outbox``).  Poll, not
        select: a busy process's descriptors may be numbered past 1023.  Kept
        by what it listens to, until a worker dies or is replaced.
        """
        key = tuple(
            (worker, worker in awaited, bool(worker.outbox))
            for worker in self.workers
            if worker.alive
        )
        found = self._pollers.get(key)
        if found is not None:
            return found  # type: ignore[no-any-return]
        if len(self._pollers) > 64:  # outboxes that come and go with many workers
            self._pollers.clear()
        poller = select.poll()
        handlers: dict[int, tuple[Callable[[_Worker], None], _Worker]] = {}
        for worker, listened, outbox in key:
            poller.register(worker.sentinel, select.POLLIN)
            handlers[worker.sentinel] = (self._on_exit, worker)
            if listened:
                poller.register(worker.reply_fd, select.POLLIN)
                handlers[worker.reply_fd] = (self._on_readable, worker)
            if outbox:
                poller.register(worker.request_fd, select.POLLOUT)
                handlers[worker.request_fd] = (self._flush, worker)
        self._pollers[key] = poller, handlers
        return poller, handlers

    def _poller(self, worker: _Worker) -> Any:
        """A poll object on ``worker``'s replies and every live worker's sentinel."""
        poller = self._pollers.get(worker)
        if poller is None:
            poller = self._pollers[worker] = select.poll()
            poller.register(worker.reply_fd, select.POLLIN)
            for other in self.workers:
                if other.alive:
                    poller.register(other.sentinel, select.POLLIN)
        return poller

    def _deliver_clean(self, done: list[tuple[int, Request]]) -> None:
        """Deliver requests whose every env's result is in the buffer (`_collect_lean`)."""
        for seq, _ in done:
            del self._requests[seq]
        if len(done) < len(self.workers):
            for _, request in done:
                self.deliver_step(request, CLEAN_STEP)
            return
        # Every worker's whole group, none cancelled: the whole step, as one block
        # (its envs' state was never written: nothing to clear).
        assert self._shared is not None
        assert self._shared.arrays is not None
        block = StepBlock(self.all, self._shared.arrays, {}, {})
        self._finish_block(block, done[0][1].since)

    def _settle_lean(self) -> None:
        """Write the per-env state of the lean requests still in flight (see `_lean_step`)."""
        lean, self._lean = self._lean, []
        for worker, seq, _ in lean:
            request = self._requests.get(seq)
            if request is not None:
                group = worker.group
                self.wait_on(request, group)
                self._started[group.start : group.stop] = [request.since] * len(group)

    def _awaited(self) -> Sequence[_Worker]:
        """The workers whose replies a blocking wait listens to.

        When every outcome in flight is wanted (a whole step, whose envs do not
        wait for ``max_concurrency`` slots as others come back), only the newest
        request's worker: it was started last and usually ends last, and the
        others' replies are read once it has answered.  One wake-up per step,
        not one per worker: a parent woken early runs on some worker's core
        while that worker still steps its envs.
        """
        if (
            self._requests
            and self._slots is None
            and self._wanted >= (len(self.pending) + len(self._results) + len(self._errors))
        ):
            request = self._requests[next(reversed(self._requests))]
            if request.future is None and not request.partial and request.worker.alive:
                return (request.worker,)
        return self.workers

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Abandon the calls in flight (of ``indices``, or all); async envs' are cancelled."""
        self._settle_lean()
        super().cancel(indices)

    def interrupt(self, worker: _Worker, locals_: list[int]) -> None:
        """Ask ``worker`` to cancel the calls of its async envs ``locals_``."""
        if worker.alive:
            try:
                self._post(worker, Cancel(0, locals_))
            except OSError:  # it died; its sentinel says so
                self._on_exit(worker)

    def refresh(self) -> None:
        """Take in the replies blocked workers have sent (their late outcomes), if any."""
        for w in list(self.blocked):
            worker = self.workers[w]
            if worker.alive and (data := _read(worker)) is not None:
                self._on_data(worker, data)

    def kill(self, w: int) -> None:
        """Kill worker ``w`` now (its envs are lost)."""
        worker = self.workers[w]
        if worker.alive:
            worker.process.kill()
            self._on_exit(
                worker,
                ChildProcessError(f"{worker.describe()} was killed: it was blocked"),
            )

    # -- rebuilding ------------------------------------------------------------------

    async def rebuild_in_place(self, w: int, locals_: list[int]) -> dict[int, BaseException]:
        """Rebuild envs ``locals_`` in worker ``w`` (if it dies meanwhile: raises)."""
        self._attach()
        reply: RebuildReply = await self._control(self.workers[w], Rebuild, locals_)
        return self.note_rebuilt(w, reply)

    async def replace(self, w: int) -> EnvTraits:
        """Kill worker ``w`` (if it still runs) and start a new one for its group."""
        loop = self._attach()
        worker = self.workers[w]
        if worker.alive:
            worker.process.kill()
            self._on_exit(worker)
        worker = self.workers[w] = self._start(w)
        os.set_blocking(worker.reply_fd, False)
        self._pollers.clear()
        worker.ready = loop.create_future()
        self._watch(worker)
        traits = self._ready(w, await worker.ready)
        if self._shared is not None:
            attached: AttachReply = await self._control(worker, Attach, self._shared.layout)
            if attached.error is not None:
                raise attached.error
        return traits

    # -- closing ---------------------------------------------------------------------

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env, ask every worker to exit, then terminate or kill stragglers."""
        loop = self._attach()
        try:
            errors = await self.close_live_envs()
        finally:
            exits = []
            for worker in self.workers:
                if worker.alive:
                    worker.exited = loop.create_future()
                    exits.append(worker.exited)
                    try:
                        self._post(worker, Stop())
                    except OSError:
                        continue
            if exits:
                await asyncio.wait(exits, timeout=_GRACE)
            self._detach()
            self._fill_actions = None  # it writes through views of the buffer unmapped next
            self._finalizer()
        return errors

    def close_now(self) -> None:
        """Without a loop (construction failed): ask workers to close their envs and exit.

        Workers get a grace period to do so; then they are terminated, killed, reaped.
        """
        self._detach()
        for worker in self.workers:
            if worker.alive:
                local = list(range(len(worker.group)))
                with contextlib.suppress(OSError):
                    self._post(worker, Call(-1, local, close_op(len(local))))
        self._fill_actions = None  # it writes through views of the buffer unmapped next
        self._finalizer()


def _loop_parked() -> bool:
    """Whether the running loop is marked as running but is not running.

    So it is while a caller drives a coroutine by hand (``coro.send``) with its
    loop only marked as this thread's running loop: nothing else can make
    progress until the coroutine suspends, so a wait that is all this
    backend's own (its pipes and sentinels) may be a plain blocking ``poll``.
    """
    return not asyncio.get_running_loop().is_running()


def _read(worker: _Worker) -> bytes | None:
    """What ``worker``'s reply pipe holds (``b""``: it is closed; ``None``: nothing yet)."""
    try:
        return os.read(worker.reply_fd, READ_SIZE)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _first_message(worker: _Worker) -> Any:
    """Wait (blocking: construction has no loop to wait on) for a new worker's first word."""
    wait([worker.replies, worker.process.sentinel])
    try:
        if worker.replies.poll():
            reply: Reply = pickle.loads(worker.replies.recv_bytes())
            return reply.body
    except (EOFError, OSError):
        pass
    worker.process.join(1.0)
    return None


def _check_ready(worker: _Worker, reply: Any) -> EnvTraits:
    """The traits a new worker reported, or the error of its construction."""
    if reply is None:
        text = str(worker.death())
        if worker.process.exitcode == 1 and START_METHOD != "fork":
            text += (
                f"; under the {START_METHOD!r} start method a worker imports the main module "
                "anew: does it guard its code with `if __name__ == '__main__':`? (the worker's "
                "traceback is above)"
            )
        died = ChildProcessError(text)
        raise WorkerDiedError(dict.fromkeys(worker.group, died), "env_fns[...]()") from died
    return ready_traits(reply)


def _reap(workers: list[_Worker], buffer: _SharedBuffer) -> None:
    """Terminate, then kill, every worker still running; close every pipe and the buffer."""
    for worker in workers:
        if not worker.requests.closed and not worker.outbox:
            with contextlib.suppress(OSError):  # a full pipe: it gets terminated below
                os.write(worker.requests.fileno(), _STOP)
    deadline = time.monotonic() + _GRACE
    for worker in workers:  # asked to stop, they get a grace period
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        worker.alive = False
        worker.close_pipes()
        process = worker.process
        if process.exitcode is None:
            process.terminate()
            process.join(_GRACE)
        if process.exitcode is None:
            process.kill()
            process.join()
        process.close()  # its sentinel pipe
    buffer.close()
