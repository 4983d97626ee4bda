"""One worker: its envs, its rows and its jobs, composed; the one dispatch of its requests.

A worker process (``backends/process/child.py``) and a Ray actor
(``backends/ray/actor.py``) both hand
each request to `Worker.handle`; they differ only in how they read requests,
where their `Sink` sends replies, and how they drive what `handle` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiovec._core.layout import StepLayout
from aiovec.backends.pool.host.envs import Envs, GroupFlow, portable
from aiovec.backends.pool.host.jobs import Jobs, Sink
from aiovec.backends.pool.host.rows import RowWriter
from aiovec.backends.pool.messages import (
    Attach,
    AttachReply,
    Call,
    Cancel,
    Rebuild,
    RebuildReply,
    StepRequest,
    WorkerRequest,
)

__all__ = ("Worker",)


class Worker:
    """The envs of one worker, the rows they write and the jobs they run.

    ``loop`` and ``alarm`` are the job engine's (`Jobs`); ``shared_fd`` is the
    step rows' file a worker process maps on `Attach` (a Ray actor has none:
    it gives its own rows to `RowWriter.use`).
    """

    def __init__(
        self,
        envs: Envs,
        sink: Sink,
        loop: Callable[[], asyncio.AbstractEventLoop],
        *,
        alarm: Callable[[float], None] | None = None,
        shared_fd: int = -1,
    ) -> None:
        self.envs, self.sink, self.shared_fd = envs, sink, shared_fd
        self.rows = RowWriter()
        self.jobs = Jobs(envs, self.rows, sink, loop, alarm)

    def handle(self, request: WorkerRequest) -> GroupFlow[None] | None:
        """Start ``request``; its replies go to the sink.

        Returns the flow that its driver must run to its end before the next
        request (``None``: nothing left to drive; calls of async envs may still
        run as tasks on the loop).  `Stop` is the transport's to act on.
        """
        if isinstance(request, StepRequest):
            return self.jobs.step(request)
        if isinstance(request, Call):
            self.jobs.call(request)
        elif isinstance(request, Cancel):
            self.jobs.cancel(request.locals, request.seq)
        elif isinstance(request, Rebuild):
            return self._rebuild(request)
        elif isinstance(request, Attach):
            self.sink.reply(request.seq, AttachReply(self._attach(request.layout)))
        else:
            raise TypeError(f"a worker cannot handle {request!r}")
        return None

    def _rebuild(self, request: Rebuild) -> GroupFlow[None]:
        """Close and rebuild the envs, once their cancelled calls have unwound."""
        tasks = self.jobs.in_flight(request.locals)
        if tasks:
            yield [asyncio.wait(tasks)]
        errors = yield from self.envs.rebuild_flow(request.locals)
        asyncs = {j: self.envs.is_async[j] for j in request.locals}
        self.sink.reply(request.seq, RebuildReply(errors, asyncs))

    def _attach(self, layout: StepLayout) -> BaseException | None:
        """Map the shared step file, which the parent has sized for ``layout``."""
        try:
            self.rows.map(self.shared_fd, layout, self.envs.first)
        except (OSError, ValueError) as exc:
            return portable(exc)
        return None
