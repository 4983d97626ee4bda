"""Worker processes that run aiovec's worker code, for a minimal parent to drive.

`GroupServers` is the floor that ``cpu.py`` and ``_parent.py`` measure aiovec's
parent against: the same envs, stepped by aiovec's own worker code on rows of one
shared buffer, driven by a parent that only writes actions, pokes each worker with
a byte and reads its byte back.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

from aiovec._core.layout import StepLayout
from aiovec.backends.pool.host.envs import Envs, build_flow, run
from aiovec.backends.pool.host.worker import Worker
from aiovec.backends.pool.messages import StepRequest
from aiovec.backends.pool.transport import split
from aiovec.backends.process.child import Loop

__all__ = ("GroupServers",)


def _group_server(
    requests: int,
    replies: int,
    inherited: Sequence[int],
    buffer: Any,
    layout: Any,
    make: Any,
    group: range,
    parts: int,
) -> None:
    """A worker of `GroupServers`: each byte ``k`` it reads steps part ``k`` of its group.

    ``inherited``: the parent's ends of the pipes, which a forked child holds too:
    closed first, so that the request pipe ends when the parent closes it.
    """
    for fd in inherited:
        os.close(fd)
    loop = Loop()
    envs = run(build_flow([make] * len(group), group.start), loop)
    assert isinstance(envs, Envs)
    served = Worker(envs, _Discard(), loop)
    served.rows.use(layout, buffer, group.start)
    for j, env in enumerate(envs.envs):
        env.reset(seed=group.start + j)
    pieces = split(len(group), parts)
    seq = 0
    while data := os.read(requests, 1):
        seq += 1
        flow = served.handle(StepRequest(seq, pieces[data[0]], "NextStep", None, None))
        if flow is not None:
            run(flow, loop)
        os.write(replies, data)


class _Discard:
    """A worker's sink that drops what it publishes (the byte echoed says the step is done)."""

    def stepped(self, seq: int, done: list[int], reply: Any) -> None:
        """Drop the step's news."""

    def called(self, seq: int, locals_: Any, reply: Any) -> None:
        """Drop the call's outcomes."""

    def reply(self, seq: int, body: Any) -> None:
        """Drop the reply."""


class GroupServers:
    """Worker processes running aiovec's worker code, for a minimal parent to drive.

    Each of ``workers`` processes holds a `Worker` of its share of
    ``num_envs`` envs, cut into ``parts`` parts of contiguous rows of one shared
    buffer.  A byte ``k`` on a worker's request pipe steps its part ``k``
    (a `StepRequest`: actions and reset flags read from the buffer, transitions
    written to it); the worker echoes the byte on its reply pipe once done.  No
    rules, no checks, no event loop: what is left of a step is the envs, aiovec's
    worker code and the pipes.
    """

    def __init__(
        self, make: Callable[[], Any], num_envs: int, workers: int = 2, parts: int = 1
    ) -> None:
        probe = make()
        layout = StepLayout.of(probe.observation_space, probe.action_space, num_envs)
        probe.close()
        assert layout is not None
        self.buffer = mmap.mmap(-1, layout.nbytes)  # anonymous and shared: inherited by fork
        self.arrays = layout.arrays(self.buffer)
        self.parts_per_worker = parts
        self.parts: list[slice] = []  # the rows of each part, worker after worker
        self.requests: list[int] = []  # each worker's request pipe (its write end)
        self.replies: list[int] = []  # each worker's reply pipe (its read end)
        self.procs: list[Any] = []
        context = multiprocessing.get_context("fork")
        try:
            for group in split(num_envs, workers):
                req_r, req_w = os.pipe()
                rep_r, rep_w = os.pipe()
                self.requests.append(req_w)
                self.replies.append(rep_r)
                inherited = [*self.requests, *self.replies]
                args = (req_r, rep_w, inherited, self.buffer, layout, make, group, parts)
                proc = context.Process(target=_group_server, args=args, daemon=True)
                try:
                    proc.start()
                finally:
                    os.close(req_r)
                    os.close(rep_w)
                self.procs.append(proc)
                self.parts += [
                    slice(group.start + piece.start, group.start + piece.stop)
                    for piece in split(len(group), parts)
                ]
        except BaseException:
            self.close()
            raise

    def poke(self, part: int) -> None:
        """Start stepping part ``part`` (parts are numbered worker after worker)."""
        worker, k = divmod(part, self.parts_per_worker)
        os.write(self.requests[worker], bytes((k,)))

    def close(self) -> None:
        """End each worker (end of file on its requests), reap it, close the pipes."""
        for fd in self.requests:
            os.close(fd)
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for fd in self.replies:
            os.close(fd)
        self.requests, self.replies, self.procs = [], [], []
        # the views in ``arrays`` keep the mapping until they are collected
