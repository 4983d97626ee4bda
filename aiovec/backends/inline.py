"""``backend="inline"``: envs live in the caller's event loop.

Synchronous envs are called directly; async envs are driven eagerly on their
lanes (see ``_lanes``), so a batch of envs that never suspend costs no task at
all, and envs that wait overlap their waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from aiovec._core.calls import CLOSE, new_step_flow
from aiovec._core.ops import CallOp, Op, StepOp
from aiovec._env import is_async_env
from aiovec.backends._base import Backend, EnvTraits, build_envs, close_quietly
from aiovec.backends._drive import StepFlow, perform_async, perform_sync, step_async, step_sync
from aiovec.backends._lanes import Lanes

__all__ = ("InlineBackend",)


class InlineBackend(Backend):
    """Hosts envs in this thread, on the caller's event loop."""

    def __init__(
        self, env_fns: Sequence[Callable[[], Any]], num_workers: int | None = None
    ) -> None:
        super().__init__(env_fns, num_workers)
        self._envs = build_envs(env_fns)
        try:
            self._is_async = [is_async_env(env) for env in self._envs]
        except TypeError:
            close_quietly(self._envs)
            raise
        self._any_async = any(self._is_async)
        self._flows: list[StepFlow | None] = [None] * self.num_envs
        self._lanes = Lanes(self.num_envs, self._finish)
        self.traits = EnvTraits.of(self._envs)

    @property
    def envs(self) -> tuple[Any, ...]:
        """The env objects."""
        return tuple(self._envs)

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Run ``op``: sync envs to completion now, async envs eagerly until they wait."""
        if isinstance(op, StepOp) and not self._any_async:
            self._step_all_sync(indices, op)
            return
        envs, is_async, lanes, flows = self._envs, self._is_async, self._lanes, self._flows
        loop: asyncio.AbstractEventLoop | None = None
        caller = None
        try:
            for k, i in enumerate(indices):
                env = envs[i]
                if isinstance(op, StepOp):
                    flow = flows[i] or self._new_flow(i, op)
                if not is_async[i]:
                    try:
                        if isinstance(op, StepOp):
                            value = step_sync(env, flow, op.reset_first[k], op.actions[k])
                        else:
                            value = perform_sync(env, op.calls[k])
                    except BaseException as exc:
                        self._fail(i, exc)
                    else:
                        self._results[i] = value
                    continue
                if loop is None:
                    loop = asyncio.get_running_loop()
                    caller = lanes.enter(loop)
                coro = (
                    step_async(env, flow, op.reset_first[k], op.actions[k])
                    if isinstance(op, StepOp)
                    else perform_async(env, op.calls[k])
                )
                done, value, error = lanes.start(i, coro)
                if not done:
                    self.pending.add(i)
                elif error is None:
                    self._results[i] = value
                else:
                    self._fail(i, error)
        finally:
            if loop is not None:
                lanes.leave(caller)

    def _step_all_sync(self, indices: Sequence[int], op: StepOp) -> None:
        # The hot path of synchronous envs: one tight loop, nothing else.
        envs, flows, results = self._envs, self._flows, self._results
        actions, reset_first = op.actions, op.reset_first
        for k, i in enumerate(indices):
            try:
                results[i] = step_sync(
                    envs[i], flows[i] or self._new_flow(i, op), reset_first[k], actions[k]
                )
            except BaseException as exc:
                self._fail(i, exc)

    def _new_flow(self, i: int, op: StepOp) -> StepFlow:
        flow = self._flows[i] = new_step_flow(op.mode)
        return flow

    def _fail(self, i: int, error: BaseException) -> None:
        self._flows[i] = None  # it still expects the failed call's result
        self._errors[i] = error
        if not isinstance(error, Exception):  # Ctrl-C or exit: start nothing more
            raise error

    def _finish(self, i: int, value: Any, error: BaseException | None) -> None:
        if error is not None:
            self._flows[i] = None
        super()._finish(i, value, error)

    def cancel(self) -> None:
        """Cancel the lanes of every env in flight."""
        for i in list(self.pending):
            self._lanes.cancel(i)

    async def aclose(self) -> dict[int, BaseException]:
        """Close every env (concurrently), then end every lane."""
        await self.drain()
        self.launch(range(self.num_envs), CallOp([CLOSE] * self.num_envs, "close"))
        _, errors = await self.collect(self.num_envs)
        await self._lanes.aclose()
        return errors
