"""The parent's link to one worker process: start it, write to it, read from it, reap it.

A `Link` owns one worker process and its two pipes (requests out, messages
in).  It knows nothing of envs in flight or of the event loop: it writes what
it is given (queueing what a full pipe cannot take yet in its ``outbox``),
reads what has come, and says how its process died.  Starting a worker
(`start`) and waiting for its first word without a loop (`first_message`)
happen at construction; `reap` is the last resort of a backend never closed.

A worker never imports the parent's main module.  Under ``spawn`` and
``forkserver`` multiprocessing would run it again in each worker (as
``__mp_main__``), so that a script without an ``if __name__ == "__main__":``
guard built its vector env again inside every worker, and a script that
imported a heavy library (torch) made every worker import it too.  The
factories travel by cloudpickle, which carries functions and classes of the
main module by value, so a worker needs only aiovec and what the factories
name: `start` leaves the main module out of what the new process prepares.
What a script did at import that a worker may need is the gymnasium ids it
registered (``gymnasium.register`` at the top of the script, or in a module
it imported): `foreign_specs` sends each worker the registry's entries that are
not gymnasium's own, and the worker adds those it lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing import spawn
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from aiovec._core.ops import CallOp, Op
from aiovec._errors import WorkerDiedError
from aiovec.backends._base import EnvTraits
from aiovec.backends.pool.messages import Call, Reply, StepRequest, Stop
from aiovec.backends.pool.transport import ready_traits
from aiovec.backends.process import child
from aiovec.backends.process.wire import READ_SIZE, Frames, WholeStep, frame

__all__ = (
    "GRACE",
    "PROTOCOL",
    "Link",
    "check_ready",
    "first_message",
    "foreign_specs",
    "framed",
    "reap",
    "request_frame",
    "start",
)

GRACE = 2.0  # seconds workers get to exit once asked, before terminate, then kill
PROTOCOL = pickle.HIGHEST_PROTOCOL
_STOP = frame(pickle.dumps(Stop(), PROTOCOL))
_STARTING = threading.Lock()  # one start at a time leaves the main module out


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
        "w",
    )

    def __init__(
        self, process: Any, requests: Connection, replies: Connection, group: range, w: int
    ) -> None:
        self.process, self.requests, self.replies, self.group = process, requests, replies, group
        self.w = w
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
        """Close this side's ends of both pipes."""
        self.requests.close()
        self.replies.close()

    def describe(self) -> str:
        """The worker in words, for errors and log lines."""
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

    def read(self) -> list[bytes]:
        """The whole messages its pipe holds now (read without waiting)."""
        payloads: list[bytes] = []
        while True:
            try:
                data = os.read(self.reply_fd, READ_SIZE)
            except BlockingIOError:
                return payloads
            except OSError:
                return payloads
            if not data:
                return payloads
            payloads += self.frames.feed(data)
            if len(data) < READ_SIZE:
                return payloads

    def ask_blocking(self, data: bytes) -> Any:
        """Without a loop: write framed ``data`` and wait for the reply's body.

        Raises ``EOFError`` or ``OSError`` if the worker died instead.
        """
        if self.write(data):
            self.flush_blocking()
        wait([self.replies, self.sentinel])
        reply: Reply = pickle.loads(self.replies.recv_bytes())
        return reply.body


@contextlib.contextmanager
def _main_left_out() -> Iterator[None]:
    """Meanwhile a process started by multiprocessing does not import the main module.

    multiprocessing tells a new ``spawn`` or ``forkserver`` process to run the
    parent's main module (``init_main_from_path`` or ``init_main_from_name`` in
    its preparation data); a worker needs nothing of it (see the module).  The
    preparation data is made by ``multiprocessing.spawn.get_preparation_data``,
    wrapped here while aiovec starts its workers.
    """
    with _STARTING:
        made = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data = made(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            spawn.get_preparation_data = made


def foreign_specs() -> list[bytes]:
    """The gymnasium ids registered in this process that are not gymnasium's own, each pickled.

    A worker adds those it lacks (`child.register`): without the main module, it
    would not know an id registered there.  An entry that does not pickle is left
    out (making that id in a worker fails as gymnasium says, as it did before).
    """
    from gymnasium.envs.registration import registry  # noqa: PLC0415  (gymnasium is loaded)

    found = []
    for spec in registry.values():
        entry = spec.entry_point
        home = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
        if home.startswith("gymnasium."):
            continue  # gymnasium registers it in every process
        try:
            found.append(cloudpickle.dumps(spec))
        except Exception:
            continue
    return found


def start(ctx: Any, boot: child.Boot, group: range, cpu: int | None) -> Link:
    """Start worker ``boot.w`` hosting ``group`` (pinned to ``cpu``, if given)."""
    child_requests, requests = ctx.Pipe(duplex=False)
    replies, child_replies = ctx.Pipe(duplex=False)
    if ctx.get_start_method() == "fork":
        boot.parent_ends = (requests.fileno(), replies.fileno())
    try:
        process = ctx.Process(
            target=child.main,
            args=(child_requests, child_replies, boot),
            name=f"aiovec-worker-{group.start}",
            daemon=True,
        )
        with _main_left_out():
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
    return Link(process, requests, replies, group, boot.w)


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


def check_ready(link: Link, body: Any) -> EnvTraits:
    """A new worker's traits, from its first word ``body`` (``None``: it died first)."""
    if body is None:
        died = link.death()
        raise WorkerDiedError(dict.fromkeys(link.group, died), "env_fns[...]()") from died
    return ready_traits(body)


def request_frame(seq: int, group: range, envs: Sequence[int], op: Op, in_rows: bool) -> bytes:
    """The framed request ``seq`` of ``op`` for ``envs`` of a worker hosting ``group``.

    ``in_rows``: a streamed step's actions and reset flags are in the step rows
    already; only its mode is sent (a `WholeStep` for a whole group).
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
    if not in_rows:
        return framed(
            StepRequest(seq, locals_, mode, op.reset_first, op.actions, op.stream, op.timed)
        )
    if len(locals_) == len(group):
        return WholeStep.frame(seq, mode, stream=True)
    return framed(StepRequest(seq, locals_, mode, None, None, True))


def framed(message: Any) -> bytes:
    """``message`` pickled (cloudpickled if it must be: a lambda among call() arguments), framed."""
    try:
        return frame(pickle.dumps(message, PROTOCOL))
    except Exception:
        return frame(cloudpickle.dumps(message, PROTOCOL))


def reap(links: list[Link], release: Any) -> None:
    """Terminate, then kill, every worker still running; close every pipe; then ``release()``."""
    for link in links:
        if not link.requests.closed and not link.outbox:
            with contextlib.suppress(OSError):  # a full pipe: it gets terminated below
                os.write(link.request_fd, _STOP)
    deadline = time.monotonic() + GRACE
    for link in links:  # asked to stop, they get a grace period
        link.process.join(max(0.0, deadline - time.monotonic()))
    for link in links:
        link.alive = False
        if not link.requests.closed:
            link.close_pipes()
        process = link.process
        if process.exitcode is None:
            process.terminate()
            process.join(GRACE)
        if process.exitcode is None:
            process.kill()
            process.join()
        process.close()  # its sentinel pipe
    release()
