"""``on_error="restart"`` on the loop: which failures are restarted, and the restart itself.

The rules are pure and live in ``_core/restart.py`` (`RestartPolicy`: tries,
backoff and downtime; `RestartBook`: the restart limit).  `Restarter` applies
them to a failed step: it charges the failed envs a restart (all or none),
then rebuilds them through the backend and resets them, waiting between tries
as the policy says, and logs what happens.  While it is ``watching`` (an
outage under way, or envs restarted lately whose clean steps count towards
starting their limit again), the vector env tells it of every step's
outcomes (`stepped`).  The resets are made by the caller's
``gather`` (`aiovec._flight.Flight.gather`), so timeouts apply to them as to
any call.  `policy_of` says which policy ``on_error`` means.

What it logs is said per outage (`Outage`), not per env and step: one line
when a step's failures start one, one when `CALM_STEPS` steps in a row without
a failure end it (`calm`), with counts, and at most one line every
`SAY_EVERY` seconds between; giving up ends it too.  While outages are
frequent (more than `FREQUENT` within `SUMMARY_EVERY` seconds: a fleet's fault
rate) their starts and ends are summed up instead, one line every
`SUMMARY_EVERY` seconds (`OutageLog` says which lines are due).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from typing import Any

from aiovec._core import validate
from aiovec._core.autoreset import AutoresetState
from aiovec._core.calls import Reset
from aiovec._core.ops import CallOp
from aiovec._core.restart import (
    SUMMARY_EVERY,
    Outage,
    OutageLog,
    RestartBook,
    RestartPolicy,
    describe_failure,
    restarted_row,
)
from aiovec._errors import EnvError, describe_error
from aiovec._log import logger, say_envs
from aiovec.backends import Backend
from aiovec.backends._base import Outcomes

__all__ = ("Restarter", "policy_of")

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

    __slots__ = ("_autoreset", "_backend", "_book", "_log", "outage", "policy", "watching")

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
        self.outage: Outage | None = None  # the one under way
        self._log = OutageLog()
        self.watching = False
        """Whether `stepped` wants each step's outcomes (an outage, or envs restarted lately)."""

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
        book = self._book
        assert policy is not None
        over = [i for i in sorted(failed) if not book.may_restart(i)]
        if not over:
            book.record(failed)
            self.watching = True
            return ""
        refusal = (
            f"restart limit reached: {say_envs(over)} failed {book.in_a_row(over[0]) + 1} "
            f"times in a row, never {policy.clean_steps} clean steps between, "
            f"RestartPolicy(max_restarts={policy.max_restarts}): a crash loop"
        )
        logger.warning("%s: giving up: %s%s", say_envs(sorted(failed)), refusal, self._end())
        return refusal

    def stepped(self, results: Container[int], errors: Mapping[int, BaseException]) -> None:
        """A step's outcomes (while `watching`): clean steps count, an outage may end."""
        book = self._book
        if book.watching:
            book.stepped(results)
        if not errors and self.outage is not None:
            self.calm()  # every env answered: the outage may be over
        self.watching = self.outage is not None or book.watching

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
        outage = self._failed(failed, name)
        self.watching = True
        rows: dict[int, Any] = {}
        todo: dict[int, BaseException] = dict(failed)
        since = time.perf_counter()
        tried = 0
        while (delay := policy.wait_before(tried, time.perf_counter() - since)) is not None:
            if tried and outage.due(time.perf_counter()):
                logger.warning(
                    "%s: restart attempt %d failed (%s); attempt %d in %.3g s (%s so far)",
                    say_envs(sorted(todo)),
                    tried,
                    describe_error(todo[min(todo)]),
                    tried + 1,
                    delay,
                    outage.counts(),
                )
            if delay:
                await asyncio.sleep(delay)
            tried += 1
            outage.restarts += len(todo)
            todo = await self._backend.rebuild(sorted(todo)) or {}
            rebuilt = [i for i in failed if i not in rows and i not in todo]
            resets, reset_errors = await gather(
                rebuilt, CallOp([self._reset_call(i) for i in rebuilt], "reset")
            )
            rows.update((i, restarted_row(resets[i], messages[i])) for i in resets)
            todo.update(reset_errors)
            if not todo:
                outage.back = time.perf_counter()
                return rows
        down = time.perf_counter() - since
        logger.warning(
            "%s: giving up after %d restart attempt(s) over %.3g s: %s%s",
            say_envs(sorted(todo)),
            tried,
            down,
            describe_error(todo[min(todo)]),
            self._end(),
        )
        raise EnvError(todo, f"{name}() (restart failed after {tried} attempts over {down:.3g} s)")

    def _failed(self, failed: dict[int, BaseException], name: str) -> Outage:
        """Count a step's failures in the outage under way, or start one (and say so)."""
        now = time.perf_counter()
        outage = self.outage
        if outage is None:
            outage, say, last = self._log.start(now)
            self.outage = outage
            outage.failed(failed.items())
            if last is not None and last.outages:
                self._say_tally(last, now, "outages are rare again: each is said")
            if say:
                logger.warning(
                    "%s failed in %s(): %s; restarting (%s)",
                    say_envs(sorted(failed)),
                    name,
                    describe_error(failed[min(failed)]),
                    "an outage: more failures are counted, and said when every env answers "
                    "its steps again"
                    if outage.own
                    else f"outages are frequent: one line every {SUMMARY_EVERY:g} s sums them up",
                )
            return outage
        outage.failed(failed.items())
        if outage.due(now):
            logger.warning(
                "%s: still failing after %.3g s (%s)",
                say_envs(sorted(outage.envs)),
                now - outage.since,
                outage.counts(),
            )
        return outage

    def calm(self) -> None:
        """A step in which no env failed: say so if it ends the outage under way."""
        outage = self.outage
        if outage is None or not outage.calmed():
            return
        self.outage = None
        now = time.perf_counter()
        if not outage.own:
            tally = self._log.ended(outage, now)
            if tally is not None:
                self._say_tally(tally, now, f"one line every {SUMMARY_EVERY:g} s sums them up")
            return
        back = outage.back if outage.back is not None else now
        logger.warning(
            "%s back after %.3g s (%s)",
            say_envs(sorted(outage.envs)),
            back - outage.since,
            outage.counts(),
        )

    def _say_tally(self, tally: Outage, now: float, then: str) -> None:
        """Say the counts of the outages summed up since ``tally.since``; ``then``: what next."""
        logger.warning(
            "%s: %d outages in %.3g s, each ended (%s); %s",
            say_envs(sorted(tally.envs)),
            tally.outages,
            now - tally.since,
            tally.counts(),
            then,
        )

    def _end(self) -> str:
        """The outage under way ends (giving up): its counts for the last line, or ``""``."""
        outage, self.outage = self.outage, None
        return "" if outage is None else f" ({outage.counts()})"

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
