"""``backend="thread"``: synchronous envs whose calls block (sockets, HTTP, game SDKs).

Theory of operation.  Each env is bound to one worker thread for its whole
life (by default one thread per env): it is built there, and every call on it
runs there, so thread-affine clients work and calls on one env never overlap.
``launch`` puts one job per env on its worker's queue and returns; the event
loop never blocks.  Workers post outcomes to an inbox and wake the loop with
``call_soon_threadsafe`` only when the inbox was empty, so a batch of envs that
finish together costs one wake-up, not one per env.

A thread cannot be interrupted.  ``cancel`` (a timeout, a cancelled step,
``close``) therefore *abandons* the calls in flight: each env's outcome is
reported as cancelled at once, its generation is bumped so that the late
result is dropped when it arrives, and the env's next call queues behind the
abandoned one on the same thread.  No call ever sees another call's data.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import inspect
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import anyio

from aiovec._core.calls import flow_at
from aiovec._core.ops import Op, StepOp
from aiovec._env import is_async_env
from aiovec._errors import EnvError
from aiovec.backends import _drive
from aiovec.backends._base import Backend, EnvTraits, check_env
from aiovec.backends._drive import StepFlow, close_quietly, perform_sync, step_sync
from aiovec.backends._limit import give_back, take_now, take_waiting

__all__ = ("ThreadBackend",)

_STOP = object()
_JOIN_TIMEOUT = 2.0  # seconds for all threads to end once their envs are closed


class _Worker:
    """One thread running jobs for the envs bound to it, in order."""

    def __init__(self, name: str, post: Callable[[int, int, Any, BaseException | None], None]):
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._post = post
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not _STOP:
            i, generation, fn, args = job
            try:
                value, error = fn(*args), None
            except BaseException as exc:  # reported to the loop, raised there
                value, error = None, exc
            self._post(i, generation, value, error)

    def stop(self) -> None:
        self.jobs.put(_STOP)


class ThreadBackend(Backend):
    """Hosts synchronous envs on worker threads."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        super().__init__(env_fns, num_workers, limiter)
        self._tokens: dict[tuple[int, int], object] = {}  # (env, generation) -> held token
        self._waiting: dict[int, asyncio.Task[None]] = {}  # envs waiting for a token
        count = num_workers or self.num_envs
        self._env_fns = list(env_fns)
        self._envs: list[Any] = [None] * self.num_envs
        self._flows: list[StepFlow | None] = [None] * self.num_envs
        self._generations = [0] * self.num_envs
        self._inbox: collections.deque[tuple[int, int, Any, BaseException | None]] = (
            collections.deque()
        )
        self._inbox_lock = threading.Lock()
        self._wake_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers = [_Worker(f"aiovec-env-worker-{w}", self._post) for w in range(count)]
        self._assigned = [self._workers[i % count] for i in range(self.num_envs)]
        self._stuck: set[int] = set()  # envs whose abandoned call is still running
        try:
            self._build_all()
        except BaseException:
            self.close_now()
            raise
        self.traits = EnvTraits.of(self._envs)

    @property
    def envs(self) -> tuple[Any, ...]:
        """The env objects (call their methods only through the vector env)."""
        return tuple(self._envs)

    # -- construction, on the env's own thread ----------------------------------------

    def _build_all(self) -> None:
        done: queue.SimpleQueue[tuple[int, Any, BaseException | None]] = queue.SimpleQueue()
        for i in range(self.num_envs):
            self._worker(i).jobs.put((i, -1, self._build, (i, done)))
        built = sorted((done.get() for _ in range(self.num_envs)), key=lambda item: item[0])
        failed = {i: error for i, _, error in built if error is not None}
        for i, env, _ in built:
            self._envs[i] = env
        if failed:  # the caller closes the envs built, each on its own thread
            first = min(failed)
            if isinstance(failed[first], TypeError):
                raise failed[first]
            raise EnvError(failed, f"env_fns[{first}]()") from failed[first]

    def _build(self, i: int, done: queue.SimpleQueue[Any]) -> None:
        try:
            env = _built(i, self._env_fns[i])
            _check_env(i, env)
        except BaseException as exc:
            done.put((i, None, exc))
        else:
            done.put((i, env, None))

    def _worker(self, i: int) -> _Worker:
        return self._assigned[i]

    # -- running ops ------------------------------------------------------------------

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Queue one job per env on its worker; returns at once."""
        self._loop = asyncio.get_running_loop()
        generations = self._generations
        since = time.perf_counter()
        if isinstance(op, StepOp):
            for i, first, action in zip(indices, op.reset_first, op.actions, strict=True):
                flow = self._flows[i] or flow_at(self._flows, i, op.mode)
                job = (i, generations[i], step_sync, (self._envs[i], flow, first, action))
                self._submit(job, since)
            return
        for i, call in zip(indices, op.calls, strict=True):
            self._submit((i, generations[i], perform_sync, (self._envs[i], call)), since)

    def _submit(self, job: tuple[int, int, Any, tuple[Any, ...]], since: float) -> None:
        i, generation = job[0], job[1]
        self._mark_waiting(i, since)
        if self.limiter is not None:
            token = self._tokens[i, generation] = object()
            if not take_now(self.limiter, token):
                self._queue(i, True)
                self._waiting[i] = asyncio.get_running_loop().create_task(self._submit_later(job))
                return
        self._worker(i).jobs.put(job)

    async def _submit_later(self, job: tuple[int, int, Any, tuple[Any, ...]]) -> None:
        i, generation = job[0], job[1]
        assert self.limiter is not None
        task = asyncio.current_task()
        try:
            await take_waiting(self.limiter, self._tokens[i, generation])
        except asyncio.CancelledError:
            del self._tokens[i, generation]
            raise
        finally:
            if self._waiting.get(i) is task:  # not abandoned by cancel() meanwhile
                del self._waiting[i]
                self._queue(i, False)  # its clock starts now: queued time is not the env's
        self._worker(i).jobs.put(job)

    def _release(self, i: int, generation: int) -> None:
        token = self._tokens.pop((i, generation), None)
        if token is not None and self.limiter is not None:
            give_back(self.limiter, token)

    def _post(self, i: int, generation: int, value: Any, error: BaseException | None) -> None:
        """On a worker thread: hand an outcome to the loop (one wake-up per burst)."""
        if generation < 0:
            return
        with self._inbox_lock:
            self._inbox.append((i, generation, value, error))
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._take_inbox)

    def _take_inbox(self) -> None:
        """On the loop: record every outcome posted since the last wake-up."""
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
            self._wake_scheduled = False
        for i, generation, value, error in items:
            self._release(i, generation)  # an abandoned call keeps its token until it ends
            if generation != self._generations[i] or i not in self.pending:
                self._stuck.discard(i)  # an abandoned call's late outcome: dropped
                continue
            if error is not None:
                self._flows[i] = None
            self._finish(i, value, error)

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Close, then rebuild each env from its factory, on the env's own thread."""
        futures: dict[int, asyncio.Future[Any]] = {}
        for i in indices:
            self._generations[i] += 1
            self._flows[i] = None
            if i in self._stuck:  # its thread is blocked in an abandoned call: use a new one
                worker = _Worker(f"aiovec-env-worker-{len(self._workers)}", self._post)
                self._workers.append(worker)
                self._assigned[i] = worker
                self._stuck.discard(i)
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._worker(i).jobs.put((i, -1, self._rebuild_one, (i, done)))
            futures[i] = asyncio.wrap_future(done)
        errors: dict[int, BaseException] = {}
        for i, future in futures.items():
            try:
                self._envs[i] = await future
            except Exception as exc:
                errors[i] = exc
        return errors

    def _rebuild_one(self, i: int, done: concurrent.futures.Future[Any]) -> None:
        close_quietly([self._envs[i]])  # it already failed; so may its close
        try:
            env = _built(i, self._env_fns[i])
            _check_env(i, env)
            self._check_rebuilt(i, env)
        except BaseException as exc:
            done.set_exception(exc)
        else:
            done.set_result(env)

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Abandon the calls in flight (of ``indices``, or all): threads cannot be interrupted."""
        for i in list(self.pending if indices is None else self.pending.intersection(indices)):
            waiting = self._waiting.pop(i, None)
            if waiting is not None:  # never submitted: nothing runs on its thread
                waiting.cancel()
                self.queued.discard(i)
            else:
                self._stuck.add(i)
            self._generations[i] += 1
            self._flows[i] = None
            self._finish(i, None, asyncio.CancelledError(f"env {i}'s call was abandoned"))

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env on its thread, then stop and join the threads."""
        errors = await self._close_envs(range(self.num_envs))
        self._stop_workers()
        return errors

    def close_now(self) -> None:
        """Without a loop: close every env built on its own thread, then stop the threads.

        Used when construction failed and when the vector env is garbage
        collected unclosed.  Close errors are ignored; an env whose ``close``
        hangs is abandoned (on a daemon thread) after a while.
        """
        for task in self._waiting.values():  # envs waiting for a concurrency token
            with contextlib.suppress(RuntimeError):  # their loop is closed: nothing runs
                task.cancel()
        self._waiting.clear()
        for i, env in enumerate(self._envs):
            if env is not None:
                self._worker(i).jobs.put((i, -1, close_quietly, ([env],)))
        self._stop_workers(_drive.CLOSE_TIMEOUT)

    def _stop_workers(self, timeout: float = _JOIN_TIMEOUT) -> None:
        """Stop every thread once its queued jobs are done; wait ``timeout`` s at most."""
        for worker in self._workers:
            worker.stop()
        deadline = time.monotonic() + timeout
        for worker in self._workers:  # idle threads end at once; a hung one is a daemon
            worker.thread.join(max(0.0, deadline - time.monotonic()))


_NO_LOOP = re.compile(r"no (running|current) event loop", re.IGNORECASE)
"""asyncio's words when code that needs a running loop runs without one."""


def _built(i: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` on env ``i``'s thread; a factory that needs a running loop is refused."""
    try:
        return fn()
    except RuntimeError as exc:
        if not _NO_LOOP.search(str(exc)):
            raise
        raise TypeError(
            f"env_fns[{i}]() needs a running event loop ({exc}): it builds an async env (an "
            "aiohttp ClientSession made in __init__, say). backend='thread' runs synchronous "
            "envs, each on a thread of its own where no event loop runs: use "
            "backend='inline' for async envs"
        ) from exc


def _check_env(i: int, env: Any) -> None:
    if inspect.isawaitable(env):  # an async factory: there is no loop on an env's thread
        if inspect.iscoroutine(env):
            never_awaited = env
            never_awaited.close()  # so that it does not warn "never awaited"
        raise TypeError(
            f"env_fns[{i}]() returned an awaitable ({type(env).__name__}): an async factory; "
            "backend='thread' builds synchronous envs on their own threads, where no event "
            "loop runs: use backend='inline', 'process' or 'ray' for async factories"
        )
    check_env(i, env)
    if is_async_env(env):
        raise TypeError(
            f"env_fns[{i}]() returned an async env ({type(env).__name__}); backend='thread' "
            "runs synchronous envs whose calls block: use backend='inline' for async envs"
        )
