"""Calls started now and received later, beyond ``send()`` and ``recv()``.

An `aiovec.AsyncioVectorEnv` starts envs with ``send()`` and receives them
with ``recv()``.  Two other clients start and receive envs the same way, through
the same parts of the vector env (its lifecycle table, `aiovec._flight.Flight`,
`aiovec._sent.Sent`), and `Sends` is what they call:

- gymnasium's ``AsyncVectorEnv`` spellings, which only `aiovec.BlockingVectorEnv`
  offers: ``step_async`` is a ``send`` of every env, ``step_wait`` a receive of
  every env batched as ``step`` batches; ``reset_async`` launches a reset the
  same way (``RESET_SENT``) and ``reset_wait`` receives it.  A wait's own
  ``timeout`` fails the envs still out with ``TimeoutError``: they are
  cancelled, nothing of them can come later.  ``close(terminate=True)`` drains
  what is in flight (`drain`);
- the collectors, which reset envs one by one while others step (`resets`) and
  cancel everything in flight when they stop (`stop`).

No rule lives here: each call checks the lifecycle table and validates its
arguments as the vector env's own calls do, and ends through `Flight.run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from aiovec._core import validate
from aiovec._core.batching import StepBatch
from aiovec._core.calls import Autoreset, Reset
from aiovec._core.lifecycle import State, VectorCall
from aiovec._core.ops import StepOp
from aiovec._errors import StateError
from aiovec._flight import error_for
from aiovec._vector import AsyncioVectorEnv, EnvIds

__all__ = ("Sends",)


class Sends:
    """Starts and receives calls of ``venv`` for its other clients (see the module).

    Args:
        venv: The vector env whose envs are started and received.
    """

    __slots__ = ("_venv",)

    def __init__(self, venv: AsyncioVectorEnv[Any, Any]) -> None:
        self._venv = venv

    # -- gymnasium's AsyncVectorEnv spellings (BlockingVectorEnv's; one set of rules) --

    def step_async(self, actions: Any) -> None:
        """``step_async``: `send` ``actions`` to every env (from code running in the loop)."""
        self._venv._life.check(VectorCall.STEP_ASYNC)
        self._venv.send(actions)

    async def step_wait(
        self,
        timeout: float | None,  # noqa: ASYNC109  (gymnasium's; the envs out then are cancelled)
    ) -> StepBatch:
        """``step_wait``: every env's step from `step_async`, batched as ``step`` batches it."""
        venv = self._venv
        venv._life.check(VectorCall.STEP_WAIT)
        wait = None if timeout is None else validate.check_timeout("timeout", timeout)
        sent = venv._sent.envs
        if len(sent) < venv.num_envs:
            idle = sorted(set(range(venv.num_envs)) - sent)
            raise StateError(
                f"cannot call step_wait(): it collects a step of every env, and env(s) {idle} "
                "are not in flight; recv() the envs sent with send()"
            )
        results = await venv._flight.receive("step_wait()", venv.num_envs, wait, strict=True)
        return venv._stepped(results)

    async def reset_async(self, seed: object, options: object) -> None:
        """``reset_async``: start a reset (see ``reset``) and return; `reset_wait` collects it."""
        venv = self._venv
        indices, op, mask = venv._reset_call(VectorCall.RESET_ASYNC, seed, options)
        flight = venv._flight
        await flight.clear_break()
        venv._sent.unbuilt = await flight.rebuild_lost(indices)
        venv._sent.reset_mask = mask
        flight.send(indices, op, "reset_async()")

    async def reset_wait(
        self,
        timeout: float | None,  # noqa: ASYNC109  (gymnasium's; the envs out then are cancelled)
    ) -> tuple[Any, dict[str, Any]]:
        """``reset_wait``: the reset started by `reset_async`, as ``reset`` returns it."""
        venv = self._venv
        venv._life.check(VectorCall.RESET_WAIT)
        wait = validate.check_timeout("timeout", timeout)
        mask = venv._sent.reset_mask
        indices = sorted(venv._sent.envs)
        results = await venv._flight.receive("reset_wait()", len(indices), wait, strict=True)
        return venv._reset_done(indices, results, mask)

    async def drain(self) -> None:
        """Cancel (and wait for) every env still in flight (``close(terminate=True)``)."""
        await self._venv._flight.drain()

    # -- the collectors' ---------------------------------------------------------------

    async def resets(
        self,
        seed: int | Sequence[int | None] | None = None,
        *,
        env_ids: EnvIds | None = None,
        options: Sequence[dict[str, Any] | None] | None = None,
    ) -> None:
        """Start a reset of some envs, each collected by ``recv`` as soon as it is done.

        The envs are seeded and given options as ``reset(seed=seed)`` would
        (counting over ``env_ids``; ``options[k]``, when given, is env
        ``env_ids[k]``'s own, over the reset-options hook's); each env's reset
        comes back from ``recv()`` as a row of its own (reward 0, both flags
        false, the reset's info), so an env may step again while others still
        reset.  A collector starts so, and starts an env's next episode so.

        With no env in flight this is a start: a broken vector env is cleared
        and lost envs are rebuilt first.  While envs are in flight (or a
        ``recv`` waits) it is sent as ``send`` is, to envs that are not in flight.
        """
        venv = self._venv
        ids = venv._env_ids(env_ids)
        seeds = validate.check_seeds(seed, len(ids))
        if options is not None and len(options) != len(ids):
            raise ValueError(
                f"options must have one entry per env ({len(ids)}), got {len(options)}"
            )
        await self._may_start(ids)
        autoreset = venv._autoreset
        explicit = [None] * len(ids) if options is None else options
        plan: list[Any] = [
            Autoreset(Reset(seeds[k], autoreset.reset_options(i, explicit[k])), True)
            for k, i in enumerate(ids)
        ]
        mask = None
        if env_ids is not None:
            mask = np.zeros(venv.num_envs, np.bool_)
            mask[list(ids)] = True
        autoreset.was_reset(mask)
        op = StepOp(venv.autoreset_mode, [None] * len(ids), plan, batch=None, stream=True)
        venv._flight.send(ids, op, "reset()")

    async def _may_start(self, ids: Sequence[int]) -> None:
        """Check that `resets` may start ``ids``; with none in flight, clear and rebuild first."""
        venv = self._venv
        life, flight = venv._life, venv._flight
        in_flight = life.state in {State.SENT, State.RECEIVING}
        life.check(VectorCall.SEND if in_flight else VectorCall.RESET)
        if in_flight:
            busy = sorted(venv._sent.envs.intersection(ids))
            if busy:
                raise StateError(f"env(s) {busy} are still in flight; recv() them first")
            return
        await flight.clear_break()
        unbuilt = await flight.rebuild_lost(range(venv.num_envs))
        if unbuilt:
            life.break_("reset() could not rebuild lost envs")
            raise error_for(unbuilt, "reset()")

    async def stop(self, reason: str) -> None:
        """Cancel (and wait for) the envs in flight from ``send()``; a reset is needed then."""
        await self._venv._flight.stop(reason)
