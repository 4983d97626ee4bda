"""``backend="process"``: CPU-bound envs in worker processes, several envs per worker.

Theory of operation.  The envs are split into W contiguous groups, one per
worker process (``_worker.py``), which builds its group from cloudpickled
factories.  ``launch`` slices the op per worker (``op.subset``) and writes one
request per worker; the worker runs every env of its slice through the same
drivers and flows as the inline backend and answers once.  Nothing here ever
waits on a worker outside the event loop: each worker's pipe and its process
sentinel are registered with ``loop.add_reader``, so a reply, or a worker's
death (SIGKILL, segfault, OOM), wakes the loop at once.  No thread, no spinning.

Every request has a sequence number; each env remembers the one it waits on.
A worker cannot be interrupted, so ``cancel`` reports the envs as cancelled at
once and forgets their sequence number: the late reply is dropped when it
comes.  A worker that dies fails its envs in flight with ``WorkerDiedError``
and leaves all its envs *lost*: any later call on them fails the same way at
once, until ``rebuild`` starts a new worker for the group (envs of the group
not rebuilt stay lost).  ``rebuild`` of an env whose worker is still busy with
an abandoned call kills and replaces that worker (it might never answer).

Observations travel in the pickled replies (shared memory is not used yet).
The start method is :data:`START_METHOD`; with ``"forkserver"`` the server
preloads aiovec, so a worker starts in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import anyio
import cloudpickle

from aiovec._core.calls import CLOSE
from aiovec._core.ops import CallOp, Op
from aiovec._errors import EnvError, WorkerDiedError
from aiovec.backends import _worker
from aiovec.backends._base import Backend, EnvTraits

__all__ = ("START_METHOD", "ProcessBackend")

START_METHOD: str = os.environ.get("AIOVEC_START_METHOD") or (
    "forkserver" if sys.platform.startswith("linux") else "spawn"
)
"""The ``multiprocessing`` start method of new workers (read when a backend is built).

Set it with the ``AIOVEC_START_METHOD`` environment variable or by assigning
this attribute: ``"forkserver"`` (Linux default), ``"spawn"`` or ``"fork"``.
"""

_CLOSE_TIMEOUT = 10.0  # seconds for every env's close(); a hung env is abandoned
_GRACE = 2.0  # seconds workers get to exit once asked, before terminate, then kill
_STOP = pickle.dumps(None)
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class _Worker:
    """The parent's handle on one worker process and its pipe."""

    __slots__ = ("alive", "conn", "exited", "fd", "group", "process", "ready")

    def __init__(self, process: Any, conn: Connection, group: range) -> None:
        self.process, self.conn, self.group = process, conn, group
        self.fd = conn.fileno()
        self.alive = True
        self.ready: asyncio.Future[Any] | None = None  # a respawned worker's first message
        self.exited: asyncio.Future[None] | None = None  # set once it is seen dead

    def describe(self) -> str:
        code = self.process.exitcode
        how = "exit code unknown" if code is None else f"exit code {code}"
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        return (
            f"worker process {self.process.pid} hosting envs {self.group.start}-"
            f"{self.group.stop - 1} died ({how})"
        )


def split(num_envs: int, count: int) -> list[range]:
    """``count`` contiguous groups of envs whose sizes differ by one at most."""
    size, extra = divmod(num_envs, count)
    bounds = [w * size + min(w, extra) for w in range(count + 1)]
    return [range(bounds[w], bounds[w + 1]) for w in range(count)]


class ProcessBackend(Backend):
    """Hosts envs in worker processes; waits on them through the event loop."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        super().__init__(env_fns, num_workers, limiter)
        self._ctx = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            self._ctx.set_forkserver_preload([_worker.__name__])
        self._fns = list(env_fns)
        count = min(num_workers or os.cpu_count() or 1, self.num_envs)
        groups = split(self.num_envs, count)
        self._owner = [w for w, group in enumerate(groups) for _ in group]
        self._seq = 0
        self._env_seq = [0] * self.num_envs  # the request each env waits on (0: none)
        self._requests: dict[int, tuple[_Worker, list[int]]] = {}
        self._rebuilding: dict[int, tuple[_Worker, asyncio.Future[Any]]] = {}
        self._stuck: dict[int, int] = {}  # env -> its abandoned request still running
        self._lost: set[int] = set()  # envs whose worker died
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _reap, self._workers)
        try:
            for group in groups:
                self._workers.append(self._start(group))
            traits = [_check_ready(worker, _first_message(worker)) for worker in self._workers]
        except BaseException:
            self.close_now()
            raise
        self.traits = EnvTraits(
            [space for t in traits for space in t.observation_spaces],
            [space for t in traits for space in t.action_spaces],
            traits[0].metadata,
            traits[0].render_mode,
        )

    @property
    def num_workers(self) -> int:
        """How many worker processes host the envs."""
        return len(self._workers)

    @property
    def pids(self) -> tuple[int | None, ...]:
        """The process id of each worker (for diagnostics and tests)."""
        return tuple(worker.process.pid for worker in self._workers)

    def _start(self, group: range) -> _Worker:
        payload = cloudpickle.dumps([self._fns[i] for i in group])
        conn, child_conn = self._ctx.Pipe()
        try:
            process = self._ctx.Process(  # type: ignore[attr-defined]
                target=_worker.main,
                args=(child_conn, payload, group.start),
                name=f"aiovec-worker-{group.start}",
                daemon=True,
            )
            process.start()
        except BaseException:
            conn.close()
            raise
        finally:
            child_conn.close()
        return _Worker(process, conn, group)

    # -- the event loop watches every worker ---------------------------------------------

    def _attach(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._detach()
            self._loop = loop
            for worker in self._workers:
                if worker.alive:
                    self._watch(worker)
        return loop

    def _watch(self, worker: _Worker) -> None:
        assert self._loop is not None
        self._loop.add_reader(worker.fd, self._on_readable, worker)
        self._loop.add_reader(worker.process.sentinel, self._on_exit, worker)

    def _unwatch(self, worker: _Worker) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(worker.fd)
            loop.remove_reader(worker.process.sentinel)

    def _detach(self) -> None:
        for worker in self._workers:
            if worker.alive:
                self._unwatch(worker)
        self._loop = None

    def _on_readable(self, worker: _Worker) -> None:
        try:
            while worker.alive and worker.conn.poll():
                self._deliver(worker, pickle.loads(worker.conn.recv_bytes()))
        except (EOFError, OSError):
            self._on_exit(worker)

    def _deliver(self, worker: _Worker, message: tuple[int, Any]) -> None:
        seq, reply = message
        if seq == 0:  # a respawned worker is ready (or failed to build)
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(reply)
            return
        rebuilding = self._rebuilding.pop(seq, None)
        if rebuilding is not None:
            if not rebuilding[1].done():
                rebuilding[1].set_result(reply)
            return
        _, indices = self._requests.pop(seq)
        env_seq, stuck = self._env_seq, self._stuck
        for i, (value, error) in zip(indices, reply, strict=True):
            if env_seq[i] == seq:
                env_seq[i] = 0
                self._finish(i, value, error)
            elif stuck.get(i) == seq:  # an abandoned call's late outcome: dropped
                del stuck[i]

    def _on_exit(self, worker: _Worker) -> None:
        """The worker's process ended (or its pipe broke): fail and lose its envs."""
        if not worker.alive:
            return
        try:  # replies it sent before dying still count
            while worker.conn.poll():
                self._deliver(worker, pickle.loads(worker.conn.recv_bytes()))
        except (EOFError, OSError):
            pass
        self._unwatch(worker)
        worker.alive = False
        worker.conn.close()
        worker.process.join(1.0)  # its sentinel is ready: this reaps it at once
        died = ChildProcessError(worker.describe())
        self._lost.update(worker.group)
        for seq in [s for s, (w, _) in self._requests.items() if w is worker]:
            del self._requests[seq]
        for i in worker.group:
            self._stuck.pop(i, None)
        waiting = [i for i in worker.group if self._env_seq[i]]
        for i in waiting:
            self._env_seq[i] = 0
        if waiting:
            error = WorkerDiedError(dict.fromkeys(waiting, died), f"worker {worker.process.pid}")
            for i in waiting:
                self._finish(i, None, error)
        for seq, (w, future) in list(self._rebuilding.items()):
            if w is worker:
                del self._rebuilding[seq]
                future.set_exception(died)
        for waiter in (worker.ready, worker.exited):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    # -- running ops -------------------------------------------------------------------

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Write one request per worker hosting some of ``indices``; returns at once."""
        self._attach()
        since = time.perf_counter()
        by_worker: dict[int, list[int]] = {}
        owner = self._owner
        for k, i in enumerate(indices):
            by_worker.setdefault(owner[i], []).append(k)
        for w, given in by_worker.items():
            for k in given:
                self._mark_waiting(indices[k], since)
            positions = given
            if self._lost.intersection(indices[k] for k in given):
                self._fail_lost(indices[k] for k in given)
                positions = [k for k in given if indices[k] not in self._lost]
                if not positions:
                    continue
            part = op if len(positions) == len(indices) else op.subset(positions)
            self._request(self._workers[w], [indices[k] for k in positions], part)

    def _fail_lost(self, envs: Iterable[int]) -> None:
        lost = [i for i in envs if i in self._lost]
        died = ChildProcessError(
            f"the worker process hosting env(s) {lost} died; their envs are gone "
            "(on_error='restart' rebuilds them on a new worker)"
        )
        error = WorkerDiedError(dict.fromkeys(lost, died), "an earlier call")
        for i in lost:
            self._finish(i, None, error)

    def _request(self, worker: _Worker, envs: list[int], op: Op) -> None:
        self._seq += 1
        seq = self._seq
        message = (seq, [i - worker.group.start for i in envs], op)
        try:
            try:
                data = pickle.dumps(message, _PROTOCOL)
            except Exception:  # e.g. a lambda among call() arguments
                data = cloudpickle.dumps(message, _PROTOCOL)
        except Exception as exc:
            for i in envs:
                self._finish(i, None, TypeError(f"cannot send {op.name}() to env {i}: {exc}"))
            return
        for i in envs:
            self._env_seq[i] = seq
        self._requests[seq] = (worker, envs)
        try:
            worker.conn.send_bytes(data)
        except OSError:  # it died; its sentinel may not have woken the loop yet
            self._on_exit(worker)

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Abandon the calls in flight (of ``indices``, or all): workers run them to the end."""
        for i in list(self.pending if indices is None else self.pending.intersection(indices)):
            seq, self._env_seq[i] = self._env_seq[i], 0
            if seq:
                self._stuck[i] = seq
            self._finish(i, None, asyncio.CancelledError(f"env {i}'s call was abandoned"))

    # -- rebuilding ------------------------------------------------------------------

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Rebuild envs in their worker; a dead or stuck worker is replaced by a new one."""
        loop = self._attach()
        by_worker: dict[int, list[int]] = {}
        for i in indices:
            by_worker.setdefault(self._owner[i], []).append(i)
        waits: list[tuple[list[int], _Worker, bool, asyncio.Future[Any]]] = []
        for w, envs in by_worker.items():
            worker = self._workers[w]
            future: asyncio.Future[Any] = loop.create_future()
            if worker.alive and not any(i in self._stuck for i in worker.group):
                self._seq += 1
                self._rebuilding[self._seq] = (worker, future)
                local = [i - worker.group.start for i in envs]
                worker.conn.send_bytes(pickle.dumps((self._seq, local, _worker.REBUILD)))
                waits.append((envs, worker, False, future))
                continue
            if worker.alive:
                worker.process.kill()
                self._on_exit(worker)
            worker = self._workers[w] = self._start(worker.group)
            worker.ready = future
            self._watch(worker)
            waits.append((envs, worker, True, future))
        errors: dict[int, BaseException] = {}
        for envs, worker, respawned, future in waits:
            try:
                reply = await future
                if respawned:
                    self._check_respawned(worker, envs, reply)
                else:
                    errors.update((worker.group.start + j, e) for j, e in reply.items())
            except Exception as exc:
                errors.update(dict.fromkeys(envs, exc))
        return errors

    def _check_respawned(self, worker: _Worker, envs: list[int], reply: Any) -> None:
        if reply is None:
            raise ChildProcessError(worker.describe())
        traits = _check_ready(worker, reply)
        first = self.traits
        for i in envs:
            j = i - worker.group.start
            for kind, space, want in (
                ("observation_space", traits.observation_spaces[j], first.observation_spaces[0]),
                ("action_space", traits.action_spaces[j], first.action_spaces[0]),
            ):
                if space != want:
                    raise ValueError(f"the rebuilt env {i} has {kind} {space}, the others {want}")
        self._lost.difference_update(envs)

    # -- closing ---------------------------------------------------------------------

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env, ask every worker to exit, then terminate or kill stragglers."""
        loop = self._attach()
        alive = [i for i in range(self.num_envs) if i not in self._lost]
        try:
            errors = await self._close_envs(alive, _CLOSE_TIMEOUT)
        finally:
            exits = []
            for worker in self._workers:
                if worker.alive:
                    worker.exited = loop.create_future()
                    exits.append(worker.exited)
                    try:
                        worker.conn.send_bytes(_STOP)
                    except OSError:
                        continue
            if exits:
                await asyncio.wait(exits, timeout=_GRACE)
            self._detach()
            self._finalizer()
        return errors

    def close_now(self) -> None:
        """Without a loop (construction failed): ask workers to close their envs and exit.

        Workers get a grace period to do so; then they are terminated, killed, reaped.
        """
        self._detach()
        for worker in self._workers:
            if worker.alive:
                local = list(range(len(worker.group)))
                close = CallOp([CLOSE] * len(local), "close")
                message = pickle.dumps((-1, local, close), _PROTOCOL)
                with contextlib.suppress(OSError):
                    worker.conn.send_bytes(message)
        self._finalizer()


def _first_message(worker: _Worker) -> Any:
    """Wait (blocking: construction has no loop to wait on) for a new worker's first word."""
    wait([worker.conn, worker.process.sentinel])
    try:
        if worker.conn.poll():
            return pickle.loads(worker.conn.recv_bytes())[1]
    except (EOFError, OSError):
        pass
    worker.process.join(1.0)
    return None


def _check_ready(worker: _Worker, reply: Any) -> EnvTraits:
    """The traits a new worker reported, or the error of its construction."""
    if reply is None:
        died = ChildProcessError(worker.describe())
        raise WorkerDiedError(dict.fromkeys(worker.group, died), "env_fns[...]()") from died
    if reply[0] == "failed":
        _, index, error, by_factory = reply
        if by_factory:
            raise EnvError({index: error}, f"env_fns[{index}]()") from error
        raise error
    traits: EnvTraits = reply[1]
    return traits


def _reap(workers: list[_Worker]) -> None:
    """Terminate, then kill, every worker still running; close every pipe."""
    for worker in workers:
        if not worker.conn.closed:
            with contextlib.suppress(OSError):
                worker.conn.send_bytes(_STOP)
    deadline = time.monotonic() + _GRACE
    for worker in workers:  # asked to stop, they get a grace period
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        worker.alive = False
        worker.conn.close()
        process = worker.process
        if process.exitcode is None:
            process.terminate()
            process.join(_GRACE)
        if process.exitcode is None:
            process.kill()
            process.join()
