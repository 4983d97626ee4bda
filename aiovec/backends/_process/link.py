"""The parent's link to one worker process: start it, write to it, read from it, reap it.

A `Link` owns one worker process and its two pipes (requests out, replies
in).  It knows nothing of envs in flight or of the event loop: it writes
what it is given (queueing what a full pipe cannot take yet in its
``outbox``), reads what has come, and says how its process died.  Starting
a worker (`start`) and waiting for its first word without a loop
(`first_message`) happen at construction; `reap` is the last resort of a
backend that was never closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import select
import signal
import time
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from aiovec._core.ops import CallOp, Op
from aiovec._errors import WorkerDiedError
from aiovec.backends._base import EnvTraits
from aiovec.backends._grouped import ready_traits
from aiovec.backends._host import child
from aiovec.backends._messages import Call, LeanStep, Reply, StepRequest, Stop
from aiovec.backends._wire import READ_SIZE, Frames, SharedFile, frame

__all__ = (
    "GRACE",
    "PROTOCOL",
    "Link",
    "check_ready",
    "first_message",
    "framed",
    "reap",
    "request_frame",
    "start",
)

GRACE = 2.0  # seconds workers get to exit once asked, before terminate, then kill
PROTOCOL = pickle.HIGHEST_PROTOCOL
_STOP = frame(pickle.dumps(Stop(), PROTOCOL))


class Link:
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

    def kill(self, why: str, cause: BaseException | None = None) -> ChildProcessError:
        """Kill the process now; the cause of its envs' `WorkerDiedError` (``why``)."""
        self.process.kill()
        died = ChildProcessError(f"{self.describe()} was killed: {why}")
        died.__cause__ = cause
        return died

    def last_words(self) -> Iterator[bytes]:
        """The replies it sent before dying, still in its pipe."""
        os.set_blocking(self.reply_fd, False)
        while data := os.read(self.reply_fd, READ_SIZE):
            yield from self.frames.feed(data)

    def write(self, data: bytes) -> bool:
        """Write framed ``data``, queueing what the pipe has no room for; whether some waits.

        Raises ``OSError`` (a broken pipe) if the worker is gone.
        """
        if not self.outbox:
            try:
                written = os.write(self.request_fd, data)
            except BlockingIOError:
                written = 0
            if written == len(data):
                return False
            data = data[written:]
        self.outbox += data
        return True

    def flush(self) -> bool:
        """The request pipe has room again: write what waited; whether some still waits."""
        try:
            written = os.write(self.request_fd, self.outbox)
        except BlockingIOError:
            return True
        except OSError:  # the worker died: its sentinel says so
            return True
        del self.outbox[:written]
        return bool(self.outbox)

    def flush_blocking(self) -> None:
        """Without a loop (construction): wait until the outbox is written, a while at most."""
        deadline = time.monotonic() + GRACE
        while self.outbox and time.monotonic() < deadline:
            select.select([self.sentinel], [self.request_fd], [], GRACE)
            if self.process.exitcode is not None:
                raise BrokenPipeError(self.describe())
            self.flush()

    def read(self) -> bytes | None:
        """What the reply pipe holds (``b""``: it is closed; ``None``: nothing yet)."""
        try:
            return os.read(self.reply_fd, READ_SIZE)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def ask_blocking(self, data: bytes) -> Any:
        """Without a loop: write framed ``data`` and wait for the reply's body.

        Raises ``EOFError`` or ``OSError`` if the worker died instead.
        """
        if self.write(data):
            self.flush_blocking()
        wait([self.replies, self.sentinel])
        reply: Reply = pickle.loads(self.replies.recv_bytes())
        return reply.body


def start(ctx: Any, fns: Sequence[Any], group: range, shared: int, cpu: int | None) -> Link:
    """Start a worker hosting ``group``, built by ``fns`` (pinned to ``cpu``, if given).

    ``shared``: the step buffer's descriptor, handed to the worker as it starts.
    """
    payload = cloudpickle.dumps(list(fns))
    child_requests, requests = ctx.Pipe(duplex=False)
    replies, child_replies = ctx.Pipe(duplex=False)
    try:
        process = ctx.Process(
            target=child.main,
            args=(child_requests, child_replies, SharedFile(shared), payload, group.start),
            name=f"aiovec-worker-{group.start}",
            daemon=True,
        )
        process.start()
        if cpu is not None:
            with contextlib.suppress(ProcessLookupError):  # it died at once: seen later
                os.sched_setaffinity(process.pid, {cpu})
    except BaseException:
        requests.close()
        replies.close()
        raise
    finally:
        child_requests.close()
        child_replies.close()
    return Link(process, requests, replies, group)


def first_message(link: Link) -> Any:
    """Wait (blocking: construction has no loop to wait on) for a new worker's first word."""
    wait([link.replies, link.sentinel])
    try:
        if link.replies.poll():
            reply: Reply = pickle.loads(link.replies.recv_bytes())
            return reply.body
    except (EOFError, OSError):
        pass
    link.process.join(1.0)
    return None


def check_ready(link: Link, body: Any, method: str) -> EnvTraits:
    """A new worker's traits, from its first word ``body`` (``None``: it died first).

    A worker that exits with code 1 before its first word, under a start method
    that imports the main module anew (``method``), most likely ran into
    unguarded code there: the error says so.
    """
    if body is None:
        text = str(link.death())
        if link.process.exitcode == 1 and method != "fork":
            text += (
                f"; under the {method!r} start method a worker imports the main module anew: "
                "does it guard its code with `if __name__ == '__main__':`? (the worker's "
                "traceback is above)"
            )
        died = ChildProcessError(text)
        raise WorkerDiedError(dict.fromkeys(link.group, died), "env_fns[...]()") from died
    return ready_traits(body)


def request_frame(seq: int, group: range, envs: Sequence[int], op: Op, in_buffer: bool) -> bytes:
    """The framed request ``seq`` of ``op`` for ``envs`` of a worker hosting ``group``.

    ``in_buffer``: a streamed step's actions and reset flags are in the shared
    rows already; only its mode is sent (the 11-byte `LeanStep` for a whole group).
    """
    first = group.start
    locals_: Sequence[int] = (
        range(envs.start - first, envs.stop - first)
        if isinstance(envs, range)
        else [i - first for i in envs]
    )
    if isinstance(op, CallOp):
        return framed(Call(seq, locals_, op))
    mode = op.mode.value
    if not in_buffer:
        return framed(
            StepRequest(seq, locals_, mode, op.reset_first, op.actions, op.stream, op.timed)
        )
    if len(locals_) == len(group):
        return LeanStep.frame(seq, mode, stream=True)
    return framed(StepRequest(seq, locals_, mode, None, None, True))


def framed(message: Any) -> bytes:
    """``message`` pickled (cloudpickled if it must be: a lambda among call() arguments), framed."""
    try:
        return frame(pickle.dumps(message, PROTOCOL))
    except Exception:
        return frame(cloudpickle.dumps(message, PROTOCOL))


def reap(links: list[Link], close_buffer: Any) -> None:
    """Terminate, then kill, every worker still running; close every pipe, then the buffer."""
    for link in links:
        if not link.requests.closed and not link.outbox:
            with contextlib.suppress(OSError):  # a full pipe: it gets terminated below
                os.write(link.request_fd, _STOP)
    deadline = time.monotonic() + GRACE
    for link in links:  # asked to stop, they get a grace period
        link.process.join(max(0.0, deadline - time.monotonic()))
    for link in links:
        link.alive = False
        link.close_pipes()
        process = link.process
        if process.exitcode is None:
            process.terminate()
            process.join(GRACE)
        if process.exitcode is None:
            process.kill()
            process.join()
        process.close()  # its sentinel pipe
    close_buffer()
