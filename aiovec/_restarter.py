"""``on_error="restart"`` on the loop: which failures are restarted, and the restart itself.

The rules are pure and live in ``_core/restart.py`` (`RestartPolicy`: tries,
backoff and downtime; `RestartBook`: the restart limit).  `Restarter` applies
them to a failed step: it charges the failed envs a restart (all or none),
then rebuilds them through the backend and resets them, waiting between tries
as the policy says, and logs what happens.  The resets are made by the caller's
``gather`` (`aiovec._flight.Flight.gather`), so timeouts apply to them as to
any call.  `policy_of` says which policy ``on_error`` means.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiovec._core import validate
from aiovec._core.autoreset import AutoresetState
from aiovec._core.calls import Reset
from aiovec._core.ops import CallOp
from aiovec._core.restart import RestartBook, RestartPolicy, describe_failure, restarted_row
from aiovec._errors import EnvError, describe_error
from aiovec._log import logger
from aiovec.backends import Backend
from aiovec.backends._base import Outcomes

__all__ = ("Restarter", "policy_of", "say_envs")

Gather = Callable[[Sequence[int], CallOp], Awaitable[Outcomes]]
"""Launch a call on some envs and collect every env's outcome (timeouts applied)."""


class Restarter:
    """Restarts the failed envs of a step under a `RestartPolicy` (``None``: never).

    Args:
        policy: The vector env's restart policy, or ``None`` (``on_error="raise"``).
        num_envs: How many envs the vector env has.
        backend: Where the envs live (it rebuilds them).
        autoreset: The vector env's autoreset state (a restarted env's reset
            takes the reset-options hook's options).
    """

    __slots__ = ("_autoreset", "_backend", "_book", "policy")

    def __init__(
        self,
        policy: RestartPolicy | None,
        num_envs: int,
        backend: Backend,
        autoreset: AutoresetState,
    ) -> None:
        self.policy = policy
        self._book = RestartBook(policy or RestartPolicy(), num_envs)
        self._backend = backend
        self._autoreset = autoreset

    def restartable(self, errors: dict[int, BaseException], *, step: bool) -> bool:
        """Step failures are restarted under a restart policy; Ctrl-C and exits never are."""
        return (
            self.policy is not None
            and step
            and all(isinstance(e, Exception) for e in errors.values())
        )

    def charge(self, failed: dict[int, BaseException]) -> str:
        """Charge a restart to every failed env, or to none if one is over its limit.

        Returns:
            ``""`` when every env may be restarted (each is charged one restart),
            else why the step raises instead (nothing is charged).
        """
        policy = self.policy
        assert policy is not None
        now = asyncio.get_running_loop().time()
        if all(self._book.may_restart(i, now) for i in failed):
            self._book.record(failed, now)
            return ""
        refusal = (
            f"restart limit reached: more than {policy.max_restarts} restarts "
            f"within {policy.window:g} s"
        )
        logger.warning("%s: giving up: %s", say_envs(sorted(failed)), refusal)
        return refusal

    async def restart(
        self, failed: dict[int, BaseException], name: str, gather: Gather
    ) -> dict[int, Any]:
        """Rebuild and reset the failed envs; their rows, or EnvError if the policy gives up.

        The envs are tried together, with `RestartPolicy.wait_before` between
        tries; its downtime counts from here (the failure has just been seen).
        """
        policy = self.policy
        assert policy is not None
        messages = {i: describe_failure(error, f"{name}()") for i, error in failed.items()}
        causes: dict[str, list[int]] = {}  # envs that failed alike share a line
        for i, error in sorted(failed.items()):
            causes.setdefault(describe_error(error), []).append(i)
        for cause, envs in causes.items():
            logger.warning("%s failed in %s(): %s; restarting", say_envs(envs), name, cause)
        rows: dict[int, Any] = {}
        todo: dict[int, BaseException] = dict(failed)
        since = time.perf_counter()
        tried = restarts = 0
        while (delay := policy.wait_before(tried, time.perf_counter() - since)) is not None:
            if tried:
                logger.warning(
                    "%s: restart attempt %d failed (%s); attempt %d in %.3g s",
                    say_envs(sorted(todo)),
                    tried,
                    describe_error(todo[min(todo)]),
                    tried + 1,
                    delay,
                )
            if delay:
                await asyncio.sleep(delay)
            tried += 1
            restarts += len(todo)
            todo = await self._backend.rebuild(sorted(todo)) or {}
            rebuilt = [i for i in failed if i not in rows and i not in todo]
            resets, reset_errors = await gather(
                rebuilt, CallOp([self._reset_call(i) for i in rebuilt], "reset")
            )
            rows.update((i, restarted_row(resets[i], messages[i])) for i in resets)
            todo.update(reset_errors)
            if not todo:
                if tried > 1:  # an outage: say once that it is over
                    logger.warning(
                        "%s back after %.3g s (%d restarts)",
                        say_envs(sorted(failed)),
                        time.perf_counter() - since,
                        restarts,
                    )
                return rows
        down = time.perf_counter() - since
        logger.warning(
            "%s: giving up after %d restart attempt(s) over %.3g s: %s",
            say_envs(sorted(todo)),
            tried,
            down,
            describe_error(todo[min(todo)]),
        )
        raise EnvError(todo, f"{name}() (restart failed after {tried} attempts over {down:.3g} s)")

    def _reset_call(self, i: int) -> Reset:
        """A restarted env's reset: it starts an episode, with the hook's options if any."""
        return Reset(options=self._autoreset.reset_options(i, None))


def policy_of(on_error: object) -> tuple[str, RestartPolicy | None]:
    """``on_error`` checked: ``"raise"`` or ``"restart"``, and the restart policy it means.

    A `RestartPolicy` means ``"restart"`` with that policy; ``"restart"`` the
    default policy; ``"raise"`` none.
    """
    if isinstance(on_error, RestartPolicy):
        return "restart", on_error
    name = validate.check_choice("on_error", on_error, validate.ON_ERROR)
    return name, RestartPolicy() if name == "restart" else None


def say_envs(indices: Sequence[int]) -> str:
    """``env 3``, ``envs 0, 1, 2``, ``envs 0-255`` or ``40 envs`` for a log line (sorted)."""
    if len(indices) == 1:
        return f"env {indices[0]}"
    if len(indices) <= _HANDFUL:
        return "envs " + ", ".join(map(str, indices))
    if indices[-1] - indices[0] + 1 == len(indices):
        return f"envs {indices[0]}-{indices[-1]}"
    return f"{len(indices)} envs"


_HANDFUL = 5
"""Up to this many envs, a log line lists them; more are a range or a count."""
