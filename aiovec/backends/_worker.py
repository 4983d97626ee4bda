"""The child side of ``backend="process"``: one worker process hosting a group of envs.

Theory of operation.  The parent starts the worker with its end of a pipe, the
group's factories (cloudpickled) and the global index of its first env.  The
worker builds the envs and answers ``(0, ("ready", traits))`` or
``(0, ("failed", index, error))``.  Then it serves requests, in order, one
reply per request:

- ``(seq, locals, op)``: run ``op`` (already sliced to this worker) on the
  envs ``locals`` (positions in the group); reply ``(seq, outcomes)`` with one
  ``(value, error)`` per env.  A ``StepOp`` goes through each env's own
  :func:`~aiovec._core.calls.step_flow`, kept here, so ``SAME_STEP`` autoreset
  costs no extra round trip.
- ``(seq, locals, REBUILD)``: close those envs (best effort), build new ones;
  reply ``(seq, {local: error})`` for the factories that failed.
- ``None``: stop.

Async envs run on the worker's own event loop, gathered per request.  Errors
travel as values; one that does not survive pickling is replaced by a
``RuntimeError`` carrying its repr.  The worker ignores SIGINT: Ctrl-C is the
parent's to handle, and the parent reaps its workers.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import pickle
import signal
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from aiovec._core.calls import new_step_flow
from aiovec._core.ops import Op, StepOp
from aiovec._env import is_async_env
from aiovec.backends._base import EnvTraits, check_env, check_rebuilt, close_quietly
from aiovec.backends._drive import StepFlow, perform_async, perform_sync, step_async, step_sync

__all__ = ("REBUILD", "main")

REBUILD = "rebuild"
Outcome = tuple[Any, BaseException | None]


def main(conn: Connection, factories: bytes, first: int) -> None:
    """Entry point of a worker process (``multiprocessing.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        group = _Group(cloudpickle.loads(factories), first)
    except _BuildFailed as failed:
        _send(conn, (0, ("failed", failed.index, _portable(failed.error), failed.by_factory)))
        return
    try:
        _send(conn, (0, ("ready", group.traits())))
        group.serve(conn)
    finally:
        group.close()


class _BuildFailed(Exception):
    def __init__(self, index: int, error: BaseException, by_factory: bool) -> None:
        super().__init__(index, error)
        self.index, self.error, self.by_factory = index, error, by_factory


class _Group:
    """The envs of one worker, their flows, and the loop their async calls run on."""

    def __init__(self, fns: Sequence[Callable[[], Any]], first: int) -> None:
        self.fns, self.first = list(fns), first
        self.envs: list[Any] = []
        for j in range(len(self.fns)):
            try:
                env = self.fns[j]()
            except BaseException as exc:
                close_quietly(self.envs)
                raise _BuildFailed(first + j, exc, by_factory=True) from exc
            self.envs.append(env)
            try:
                check_env(first + j, env)
                is_async_env(env)
            except TypeError as exc:
                close_quietly(self.envs)
                raise _BuildFailed(first + j, exc, by_factory=False) from exc
        self.is_async = [is_async_env(env) for env in self.envs]
        self.flows: list[StepFlow | None] = [None] * len(self.envs)
        self.spaces = (self.envs[0].observation_space, self.envs[0].action_space)
        self.loop: asyncio.AbstractEventLoop | None = None

    def traits(self) -> EnvTraits:
        return EnvTraits.of(self.envs)

    def serve(self, conn: Connection) -> None:
        parent = multiprocessing.process.parent_process()
        watched: list[Any] = [conn] if parent is None else [conn, parent.sentinel]
        while True:
            if conn not in wait(watched):  # the parent is gone
                return
            try:
                request = pickle.loads(conn.recv_bytes())
            except EOFError:
                return
            if request is None:
                return
            seq, locals_, op = request
            reply = self.rebuild(locals_) if op == REBUILD else self.run(locals_, op)
            _send(conn, (seq, reply))

    def run(self, locals_: Sequence[int], op: Op) -> list[Outcome]:
        """Run ``op`` on the envs ``locals_``: sync envs now, then async envs together."""
        out: list[Outcome] = [(None, None)] * len(locals_)
        later: list[tuple[int, Any]] = []
        stepping = isinstance(op, StepOp)
        for k, j in enumerate(locals_):
            env = self.envs[j]
            if stepping:
                assert isinstance(op, StepOp)
                flow = self.flows[j] or self._new_flow(j, op)
                args: tuple[Any, ...] = (env, flow, op.reset_first[k], op.actions[k])
            else:
                args = (env, op.calls[k])  # type: ignore[union-attr]
            if self.is_async[j]:
                later.append((k, (step_async if stepping else perform_async)(*args)))
                continue
            try:
                out[k] = ((step_sync if stepping else perform_sync)(*args), None)
            except BaseException as exc:
                out[k] = self._failed(j, exc)
        if later:
            results = self._gather([coro for _, coro in later])
            for (k, _), result in zip(later, results, strict=True):
                failed = isinstance(result, BaseException)
                out[k] = self._failed(locals_[k], result) if failed else (result, None)
        return out

    def _new_flow(self, j: int, op: StepOp) -> StepFlow:
        flow = self.flows[j] = new_step_flow(op.mode)
        return flow

    def _failed(self, j: int, error: BaseException) -> Outcome:
        self.flows[j] = None  # it still expects the failed call's result
        return None, _portable(error)

    def _gather(self, coros: list[Any]) -> list[Any]:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()

        async def everything() -> list[Any]:
            return await asyncio.gather(*coros, return_exceptions=True)

        return self.loop.run_until_complete(everything())

    def rebuild(self, locals_: Sequence[int]) -> dict[int, BaseException]:
        """Close and rebuild the envs ``locals_``; the errors of those that failed."""
        errors: dict[int, BaseException] = {}
        for j in locals_:
            self._close(j)
            self.flows[j] = None
            try:
                env = self.fns[j]()
                check_rebuilt(self.first + j, env, *self.spaces)
                self.is_async[j] = is_async_env(env)
            except Exception as exc:
                errors[j] = _portable(exc)
                continue
            self.envs[j] = env
        return errors

    def _close(self, j: int) -> None:
        try:
            result = self.envs[j].close()
            if asyncio.iscoroutine(result):
                self._gather([result])
        except Exception:  # the env already failed; its close may well fail too
            return

    def close(self) -> None:
        """Release the worker's loop (envs were closed by a ``close`` op, or are lost)."""
        if self.loop is not None:
            self.loop.close()


def _send(conn: Connection, message: tuple[int, Any]) -> None:
    try:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = pickle.dumps(_portable_message(message), pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(data)


def _portable_message(message: tuple[int, Any]) -> tuple[int, Any]:
    seq, reply = message
    if isinstance(reply, list):
        return seq, [_portable_outcome(value, error) for value, error in reply]
    return message


def _portable_outcome(value: Any, error: BaseException | None) -> Outcome:
    if error is not None:
        return None, error
    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return None, TypeError(f"the env's result {value!r} cannot be sent to the parent: {exc}")
    return value, None


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its repr."""
    text = "".join(traceback.format_exception(error))
    try:
        copy = pickle.loads(pickle.dumps(error, pickle.HIGHEST_PROTOCOL))
    except Exception:
        copy = RuntimeError(f"{error!r} (raised in a worker process; it cannot be pickled)")
    if isinstance(copy, BaseException):
        copy.add_note(f"Raised in a worker process:\n{text}")
        return copy
    return RuntimeError(repr(error))
