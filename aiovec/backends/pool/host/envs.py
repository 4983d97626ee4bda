"""A worker's envs and their step flows: built, stepped, called and rebuilt.

What is done here runs to its end at once (sync envs), or is a `GroupFlow`
that yields the coroutines of its async envs for its driver to await: a
worker process runs them on its own loop (`run`), a Ray actor awaits them on
the actor's (`drive`).  Errors travel as values (`portable`).
"""

from __future__ import annotations

import asyncio
import pickle
import traceback
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, TypeVar

from aiovec._core import validate
from aiovec._core.calls import CLOSE, StepFlow, Transition, flow_at
from aiovec._core.ops import CallOp
from aiovec._env import is_async_env
from aiovec.backends._base import EnvTraits, check_env, check_rebuilt, make_env
from aiovec.backends._drive import close_quietly, perform_sync, step_sync
from aiovec.backends.pool.messages import Failed, Outcome, Ready

__all__ = ("Envs", "GroupFlow", "build_flow", "drive", "gather_outcomes", "portable", "run")

T = TypeVar("T")
GroupFlow = Generator[list[Coroutine[Any, Any, Any]], list[Any], T]
"""Work of a group, as a flow: it yields coroutines to await together and is
sent their results (exceptions as values); it returns its result.  An empty
list is a pause: the driver sends on what was published so far, then goes on."""


class Envs:
    """The envs of one worker (its *group*), which are async, and each one's step flow."""

    def __init__(self, fns: Sequence[Callable[[], Any]], first: int, envs: list[Any]) -> None:
        """The group of envs ``envs``, built by ``fns``; the first is env ``first``."""
        self.fns, self.first, self.envs = list(fns), first, envs
        self.is_async = [is_async_env(env) for env in envs]
        self.flows: list[StepFlow | None] = [None] * len(envs)
        self.spaces = (envs[0].observation_space, envs[0].action_space)
        # each env's own: a rebuilt env must have them (they may differ in bounds)
        self.env_spaces = [(env.observation_space, env.action_space) for env in envs]

    def ready(self, node_id: str | None = None) -> Ready:
        """A new worker's first word: the envs' traits, which are async (and its node)."""
        return Ready(EnvTraits.of(self.envs), node_id, tuple(self.is_async))

    def any_async(self, locals_: Sequence[int]) -> bool:
        """Whether any env of ``locals_`` is async."""
        is_async = self.is_async
        if True not in is_async:  # the usual group: all sync, or all async
            return False
        if False not in is_async:
            return True
        return any(is_async[j] for j in locals_)

    def flow(self, j: int, mode: str) -> StepFlow:
        """Env ``j``'s step flow (a new one, in autoreset ``mode``, if it has none)."""
        return self.flows[j] or flow_at(self.flows, j, mode)

    def failed(self, j: int, error: BaseException) -> BaseException:
        """Env ``j``'s call raised ``error``: its flow is dropped; the error, portable."""
        self.flows[j] = None  # it still expects the failed call's result
        return portable(error)

    def step_sync(
        self,
        locals_: Sequence[int],
        mode: str,
        reset_first: Sequence[bool],
        actions: Sequence[Any],
        *,
        stepped: dict[int, Transition],
        errors: dict[int, BaseException],
    ) -> None:
        """Step the sync envs ``locals_`` in turn; their transitions and errors by local index."""
        envs, flows = self.envs, self.flows
        for k, j in enumerate(locals_):
            try:
                flow = flows[j] or flow_at(flows, j, mode)
                stepped[j] = step_sync(envs[j], flow, reset_first[k], actions[k])
            except BaseException as exc:
                errors[j] = self.failed(j, exc)

    def call_sync(self, j: int, op: CallOp, k: int) -> Outcome:
        """Sync env ``j``'s outcome of ``op``'s ``k``-th call."""
        try:
            return perform_sync(self.envs[j], op.calls[k]), None
        except BaseException as exc:
            return None, self.failed(j, exc)

    def rebuild_flow(self, locals_: Sequence[int]) -> GroupFlow[dict[int, BaseException]]:
        """Close and rebuild the envs ``locals_``; the errors of those that failed."""
        errors: dict[int, BaseException] = {}
        for j in locals_:
            yield from self._close(j)
            self.flows[j] = None
            (env,) = yield [make_env(self.fns[j])]
            try:
                if isinstance(env, BaseException):
                    raise env
                check_rebuilt(self.first + j, env, *self.env_spaces[j])
                self.is_async[j] = is_async_env(env)
            except Exception as exc:
                errors[j] = portable(exc)
                continue
            self.envs[j] = env
        return errors

    def _close(self, j: int) -> GroupFlow[None]:
        try:
            result = perform_sync(self.envs[j], CLOSE)
        except Exception:  # the env already failed; its close may well fail too
            return
        if asyncio.iscoroutine(result):
            yield [result]  # its error, if any, is ignored too


def build_flow(fns: Sequence[Callable[[], Any]], first: int) -> GroupFlow[Envs | Failed]:
    """Build the envs ``fns`` (the first is env ``first``) together, on the loop (`make_env`).

    Returns the group, or a new worker's first word for the lowest env whose
    factory failed or built no env (the envs built are closed).
    """
    envs = yield [make_env(fn) for fn in fns]
    built = [env for env in envs if not isinstance(env, BaseException)]
    for j, env in enumerate(envs):
        if isinstance(env, BaseException):
            close_quietly(built)
            return Failed(first + j, portable(env), by_factory=True)
        try:
            check_env(first + j, env)
            is_async_env(env)
        except TypeError as exc:
            close_quietly(built)
            return Failed(first + j, portable(exc), by_factory=False)
    try:
        validate.check_distinct_envs(envs, first)
    except ValueError as exc:
        close_quietly(envs)
        return Failed(first, portable(exc), by_factory=False)
    return Envs(fns, first, list(envs))


def run(flow: GroupFlow[T], loop: Callable[[], asyncio.AbstractEventLoop]) -> T:
    """Run ``flow`` to its end, its coroutines on the loop that ``loop`` gives (not running)."""
    try:
        coros = next(flow)
        while True:
            results = loop().run_until_complete(gather_outcomes(coros)) if coros else []
            coros = flow.send(results)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def drive(flow: GroupFlow[T]) -> T:
    """Run ``flow`` to its end, awaiting its coroutines on the running loop."""
    try:
        coros = next(flow)
        while True:
            coros = flow.send(await gather_outcomes(coros))
    except StopIteration as stop:
        result: T = stop.value
        return result


async def gather_outcomes(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Await ``coros`` together; each one's result or exception, in order."""
    return await asyncio.gather(*coros, return_exceptions=True)


def portable(error: BaseException) -> BaseException:
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
