"""A worker process: its entry point, its serving loop, and the sink that writes its replies.

The parent starts the worker (`main`) with two pipes (requests in, replies
out; framed by ``_wire.py``), the shared step file (a descriptor, not yet
sized), the group's factories (cloudpickled) and the global index of its
first env.  The worker builds the envs on a loop of its own and answers
``Reply(0, Ready(...))`` or ``Reply(0, Failed(...))``.  Then it reads requests,
in order, and hands each to `Worker.handle`; every reply leaves through one
`PipeSink`: a pickled `Reply`, or the fixed-size `LeanReply`.

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
import os
import pickle
import signal
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from aiovec.backends._host.envs import build_flow, run
from aiovec.backends._host.jobs import Body, Jobs
from aiovec.backends._host.worker import Worker
from aiovec.backends._messages import (
    LEAN,
    CallReply,
    Failed,
    LeanReply,
    LeanStep,
    Outcome,
    Reply,
    StepReply,
    Stop,
)
from aiovec.backends._wire import READ_SIZE, Frames, SharedFile, frame, write_all

__all__ = ("Loop", "PipeSink", "main", "new_loop", "serve")


def main(
    requests: Connection, replies: Connection, shared: SharedFile, factories: bytes, first: int
) -> None:
    """Entry point of a worker process (``multiprocessing.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sink = PipeSink(replies.fileno())
    loop = Loop()
    try:
        built = run(build_flow(cloudpickle.loads(factories), first), loop)
        if isinstance(built, Failed):
            sink.reply(0, built)
            return
        if not any(built.is_async):  # sync envs run off the loop: release it until needed
            loop.close()
        worker = Worker(built, sink, loop, alarm=_alarm, shared_fd=shared.fd)
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


def serve(worker: Worker, requests: int, loop: Loop) -> None:
    """Hand each request to ``worker`` until told to stop or the request pipe closes."""
    frames = Frames()
    while True:
        data = _next(worker.jobs, requests, loop)
        if not data:  # the parent is gone
            return
        for payload in frames.feed(data):
            request = LeanStep.parse(payload) if payload[0] == LEAN else pickle.loads(payload)
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
    return os.read(requests, READ_SIZE)


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


class PipeSink:
    """Writes a worker's replies to its reply pipe, framed."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def reply(self, seq: int, body: Body) -> None:
        """Write ``Reply(seq, body)``, pickled (values that cannot be, replaced by errors)."""
        message = Reply(seq, body)
        try:
            data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps(_portable_message(message), pickle.HIGHEST_PROTOCOL)
        write_all(self.fd, frame(data))

    def clean(self, seq: int) -> None:
        """Write the lean reply to request ``seq``."""
        write_all(self.fd, LeanReply.frame(seq))


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
