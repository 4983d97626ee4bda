"""The Ray actor that hosts one group of envs: a thin shell over the pool's `Worker`.

An actor starts empty: `GroupActor.placed` answers once Ray has placed it,
and `GroupActor.load` builds a group in it (again for each vector env that
takes it from an ``ActorPool``).  Each remote call is one request, handed to
the same dispatch a worker process uses (`Worker.handle`, ``backends/pool/host/``); the actor's sink
(`_Waiting`) hands each reply to the call that waits for it, which returns
it, merges a step's parts into one reply, or yields them (a streamed step, a
Ray generator).  The actor is an async actor that takes many calls at once:
its sync envs run one at a time on its event loop (which they hold while
they run), and its async envs' calls run as tasks there, so that a `cancel`
can end one env's call while the others go on.  Each call carries the
parent's request number: a cancel that overtakes its call is kept until the
call starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import cloudpickle
import numpy as np
import ray

from aiovec._core.layout import StepLayout
from aiovec._core.ops import CallOp
from aiovec.backends.pool.host.envs import GroupFlow, build_flow, drive, gather_outcomes
from aiovec.backends.pool.host.jobs import Body
from aiovec.backends.pool.host.worker import Worker
from aiovec.backends.pool.messages import (
    Call,
    CallReply,
    Cancel,
    Failed,
    Ready,
    Rebuild,
    RebuildReply,
    StepReply,
    StepRequest,
)

__all__ = ("GroupActor",)


class _Waiting(dict[int, "asyncio.Queue[Body]"]):
    """The actor's sink: the replies of each call in progress, by request number."""

    def stepped(self, seq: int, done: list[int], reply: StepReply) -> None:
        self.reply(seq, reply)

    def called(self, seq: int, locals_: Sequence[int], reply: CallReply) -> None:
        self.reply(seq, reply)

    def reply(self, seq: int, body: Body) -> None:
        parts = self.get(seq)
        if parts is not None:
            parts.put_nowait(body)


class GroupActor:
    """The Ray actor hosting one group of envs (an async actor: envs may be async)."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self.raw: np.ndarray | None = None  # the group's step arrays, as bytes
        self.failed = Failed(0, RuntimeError("no group loaded"), False)
        self._forget_calls()

    def _forget_calls(self) -> None:
        """No call in progress, none cancelled ahead (a new actor, or a new group)."""
        self.waiting = _Waiting()
        self.early: dict[int, list[int]] = {}  # cancels of calls not started yet
        self.newest = 0  # the number of the newest call started
        self.own = 0  # the number of the newest call the parent numbers not (below 0)

    async def placed(self) -> None:
        """Answers once the actor runs (for a bounded wait on its placement)."""

    async def load(self, factories: bytes, first: int) -> Ready | Failed:
        """Build the group of envs ``factories`` (the first is env ``first``); as `ready`."""
        self.worker = self.raw = None
        self._forget_calls()  # a pooled actor: the new vector env numbers its calls anew
        fns = cloudpickle.loads(factories)  # built on this loop (the factory rule)
        built = await drive(build_flow(fns, first))
        if isinstance(built, Failed):
            self.failed = built
            return built
        self.worker = Worker(built, self.waiting, asyncio.get_running_loop)
        layout = StepLayout.of(*built.spaces, len(built.envs))
        if layout is not None:
            self.raw = np.zeros(layout.nbytes, dtype=np.uint8)
            self.worker.rows.use(layout, self.raw.data, 0)
        return await self.ready()

    async def ready(self) -> Ready | Failed:
        """The group's traits and this actor's node, or why the group could not be built."""
        if self.worker is None:
            return self.failed
        return self.worker.envs.ready(ray.get_runtime_context().get_node_id())

    async def cancel(self, seq: int, locals_: list[int]) -> None:
        """Cancel the calls of async envs ``locals_`` in call ``seq`` (when it starts, if not yet).

        A call already over is left alone: its reply is on its way.
        """
        if seq in self.waiting and self.worker is not None:
            self.worker.handle(Cancel(seq, locals_))
        elif seq > self.newest:
            self.early.setdefault(seq, []).extend(locals_)

    async def step(self, request: StepRequest) -> StepReply:
        """A whole step: one reply, whatever the order its envs finish in."""
        parts: list[StepReply] = [part async for part in self._replies(request)]
        if len(parts) == 1:
            reply = parts[0]
        else:  # the parts it published as envs ended, as one reply
            reply = StepReply({}, {}, {}, {})
            for part in parts:
                reply.errors.update(part.errors)
                reply.infos.update(part.infos)
                reply.finals.update(part.finals)
                reply.odd.update(part.odd)
        return reply._replace(rows=self.raw, envs=None)

    async def step_stream(self, request: StepRequest) -> AsyncIterator[StepReply]:
        """A streamed step (``send()``): a part as envs finish, the last covering the rest.

        Each part carries a copy of the step rows.
        """
        async for part in self._replies(request):
            yield part._replace(rows=None if self.raw is None else self.raw.copy())

    async def call(self, seq: int, locals_: Sequence[int], op: CallOp) -> CallReply:
        """One call per env of ``locals_``."""
        (reply,) = [reply async for reply in self._replies(Call(seq, locals_, op))]
        assert isinstance(reply, CallReply)
        return reply

    async def rebuild(self, locals_: Sequence[int]) -> RebuildReply:
        """Close the envs ``locals_`` and build new ones."""
        self.own -= 1
        (reply,) = [reply async for reply in self._replies(Rebuild(self.own, locals_))]
        assert isinstance(reply, RebuildReply)
        return reply

    async def _replies(self, request: StepRequest | Call | Rebuild) -> AsyncIterator[Any]:
        """Hand ``request`` to the worker; its replies, the last one last."""
        worker = self.worker
        assert worker is not None
        seq = request.seq
        parts = self.waiting[seq] = asyncio.Queue()
        self.newest = max(self.newest, seq)
        try:
            flow = worker.handle(request)
            coros = _advance(flow, None)
            self._started(worker, seq)  # its async envs' calls are tasks now
            while coros is not None:  # a pause, or coroutines to await
                while not parts.empty():  # a sync env's part: sent before the next runs
                    yield parts.get_nowait()
                coros = _advance(flow, await gather_outcomes(coros) if coros else [])
            while True:
                body = await parts.get()
                yield body
                if not (isinstance(body, StepReply) and body.envs is not None):
                    return
        finally:
            del self.waiting[seq]

    def _started(self, worker: Worker, seq: int) -> None:
        """Call ``seq``'s async envs are tasks now: cancel those whose cancel came first."""
        cancelled = self.early.pop(seq, None)
        if cancelled:
            worker.handle(Cancel(seq, cancelled))


def _advance(flow: GroupFlow[None] | None, results: list[Any] | None) -> list[Any] | None:
    """Start ``flow`` (``results`` None) or send it ``results``; what it yields (None: it ended)."""
    if flow is None:
        return None
    try:
        return next(flow) if results is None else flow.send(results)
    except StopIteration:
        return None
