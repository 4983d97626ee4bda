"""How the vector env's calls on its envs end: collected, restarted, or raised.

Theory of operation.  Every call takes one route: launch, collect, finish.  A
whole call (``step``, ``reset``, ``call``, ...) launches its op and collects
every env (`Flight.gather`); partial stepping launches first (`Flight.send`,
for ``send()`` and ``reset_async()``) and collects later, some envs
(`Flight.receive`, for ``recv()``, ``step_wait()`` and ``reset_wait()``).
Either way the call is one coroutine, `Flight.run`, the skeleton every call
ends through:

1. the vector env is ``BUSY`` while it waits for the outcomes;
2. step and reset results are checked (a malformed one fails its env);
3. under a restart policy the failed envs of a step are restarted
   (`aiovec._restarter.Restarter`), amid sent envs too: their outcomes that
   come meanwhile are held (`aiovec._sent.Sent`) and taken after;
4. a call cut short (Ctrl-C, cancelled, closed unfinished) cancels what is in
   flight and leaves the vector env ``BROKEN``; a ``close()`` meanwhile
   raises `aiovec.ClosedError`;
5. the failures left raise `aiovec.EnvError` (`aiovec.EnvTimeoutError`,
   `aiovec.WorkerDiedError`, by their causes), in the state the call leaves.

A call whose envs all answered in the launch (sync envs driven where the
call is made) takes the same route: nothing in it waits, so the coroutine
runs to its end without suspending, and costs no loop iteration.

Waiting is `Flight.collect`'s: it asks the backend for outcomes until enough
are in, cancels each env past its own deadline and reports it with a
``TimeoutError``.  A deadline counts from the env's own start
(`aiovec._core.deadlines`): ``reset_timeout`` for a reset, an autoreset
included (a ``NEXT_STEP`` step that resets an env instead of stepping it, a
collector's reset), ``step_timeout`` for the rest.  ``unwound`` is set while a call waits on
envs, so that ``close()`` can cancel them and wait for that call to unwind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Coroutine, MutableMapping, Sequence
from typing import Any, NoReturn

from aiovec._core.deadlines import overdue
from aiovec._core.lifecycle import PENDING, Lifecycle, State
from aiovec._core.ops import Op, StepOp
from aiovec._errors import ClosedError, EnvError, EnvTimeoutError, WorkerDiedError
from aiovec._log import logger, say_envs
from aiovec._restarter import Restarter
from aiovec._sent import Sent
from aiovec.backends import Backend
from aiovec.backends._base import Outcomes

__all__ = ("Flight",)

Results = MutableMapping[int, Any]

# An enum member read off its class costs 0.1-0.2 us on Python 3.11 (``EnumType``
# has a ``__getattr__``): what runs on every call reads module names instead.
_BUSY, _CLOSED, _READY, _RECEIVING = State.BUSY, State.CLOSED, State.READY, State.RECEIVING


class Flight:
    """The vector env's calls on its envs, from launch to their end (see the module).

    Args:
        backend: Where the envs live.
        life: The vector env's lifecycle (this sets ``BUSY``, ``SENT``, ``BROKEN``, ...).
        sent: The envs in flight from ``send()``.
        restarter: Restarts failed steps (under a restart policy).
        check_results: Fails the envs whose step or reset result is malformed: moves
            them from the results to the errors (`fits.ResultCheck.check`).
        step_timeout: Seconds an env may take to answer a call (``None``: no limit).
        reset_timeout: Seconds an env may take to reset, an autoreset included.
    """

    __slots__ = (
        "_check_results",
        "_restarter",
        "_uneven",
        "backend",
        "life",
        "reset_timeout",
        "sent",
        "step_timeout",
        "unwound",
    )

    def __init__(
        self,
        backend: Backend,
        life: Lifecycle,
        sent: Sent,
        restarter: Restarter,
        *,
        check_results: Callable[[Results, dict[int, Any], str], None],
        step_timeout: float | None,
        reset_timeout: float | None,
    ) -> None:
        self.backend = backend
        self.life = life
        self.sent = sent
        self._restarter = restarter
        self._check_results = check_results
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
        self._uneven = reset_timeout != step_timeout  # some envs of a step may reset
        self.unwound: asyncio.Future[None] | None = None
        """Set while a call waits on envs; done once it has unwound."""

    async def run(
        self,
        indices: Sequence[int],
        op: Op | None,
        *,
        breaks: bool = True,
        wanted: int = 0,
        wait: float | None = None,
        call: str | None = None,
        strict: bool = True,
    ) -> Results:
        """The one route of every call: launch, collect, finish (see the module).

        Args:
            indices: The envs of ``op``.
            op: The call to launch on ``indices`` and collect from every one
                of them (`gather`); ``None`` receives envs sent before
                (`receive`): they leave `Sent` here, and the caller says which
                state the vector env is in after.
            breaks: A failure leaves envs half-updated (step, reset), so the
                vector env becomes ``BROKEN``; otherwise its state is restored.
            wanted: A receive's count of outcomes to wait for.
            wait: A receive's own timeout (``None``: no limit).
            call: The call as its caller is named (``"recv()"``); ``None``: ``name()``.
            strict: ``wanted`` outcomes or an error: the envs still out after
                ``wait`` fail with ``TimeoutError``.  Not strict (``recv()``):
                what came by then is returned, and more envs may be sent
                until this call ends (the vector env is ``RECEIVING``
                meanwhile; what they deliver while a restart waits for its
                own envs is held for this call).

        Returns:
            Every env's result, by env index.
        """
        life, sent = self.life, self.sent
        if op is None:
            name, before = PENDING[life.state], _READY
        else:
            name, before = op.name, life.state
        life.state = _BUSY if strict else _RECEIVING
        refusal = ""
        try:
            if op is not None:
                results, errors = await self.gather(indices, op)
            elif self.backend.pending:
                results, errors = await self._collect_sent(wanted, wait, name)
            else:  # every sent env is in (answered as it was sent, or since)
                results, errors = sent.take_held(self.backend.take())
            late = op is None and strict and len(results) + len(errors) < wanted
            if late:  # a receive's own timeout
                self._fail_late(results, errors, call, wait)
            self._check_results(results, errors, name)
            if name == "step" and self._restarter.watching:  # an outage, or restarted envs
                self._restarter.stepped(results, errors)
            if errors and not late and name == "step" and self._restarter.policy is not None:
                refusal = await self._restart(results, errors, name)
        except GeneratorExit:  # the coroutine was closed unfinished: no awaiting now
            self.abandon(f"{call or name + '()'} was abandoned unfinished")
            raise
        except BaseException as exc:  # Ctrl-C (out of a sync env too), cancelled, ...
            if life.state is not _CLOSED:
                await self.drain()
                life.break_(f"{call or name + '()'} was interrupted ({type(exc).__name__})")
            raise
        finally:
            if self.unwound is not None:
                self.unwound.set_result(None)
                self.unwound = None
        if op is None:
            sent.done(results, errors, reset=name == "reset")
        if life.state is _CLOSED:
            said = "waiting" if op is None else "in flight"
            raise ClosedError(f"the vector env was closed while {call or name + '()'} was {said}")
        if errors:
            if op is None:
                await self.drain()
            self._raise_for(errors, name, before, breaks, note=refusal)
        if op is not None:
            life.state = before
        return results

    def _fail_late(self, results: Results, errors: dict[int, Any], call: Any, wait: Any) -> None:
        """The sent envs still out after a receive's own ``wait`` fail with TimeoutError."""
        for i in self.sent.envs.difference(results, errors):
            errors[i] = TimeoutError(f"env {i} did not answer {call} within {wait} s")

    async def _restart(self, results: Results, errors: dict[int, BaseException], name: str) -> str:
        """Restart the failed envs of a step (``errors``), as often as envs fail; the refusal.

        Each restarted env's row goes into ``results``; ``errors`` is left with
        the failures that were not restarted (the restart limit refused them:
        its reason is returned).  Amid sent envs, what the others delivered
        while a restart waited for its own envs is taken in too.
        """
        restarter, sent = self._restarter, self.sent
        while errors and restarter.restartable(errors, step=True):
            refusal = restarter.charge(errors)
            if refusal:
                return refusal
            results.update(await restarter.restart(dict(errors), name, self.gather))
            more, failed = sent.take_held(({}, {}))
            self._check_results(more, failed, name)
            results.update(more)
            errors.clear()
            errors.update(failed)
        return ""

    def receive(
        self, call: str, wanted: int, wait: float | None, *, strict: bool
    ) -> Coroutine[Any, Any, Results]:
        """`run` for sent envs: their results once ``wanted`` are in (or ``wait`` s passed).

        ``strict``: ``wanted`` envs or an error; those still out after ``wait``
        seconds fail with ``TimeoutError`` (and are cancelled, like any failed
        call's siblings), so the call raises `aiovec.EnvTimeoutError`.  The
        caller says which state the vector env is in after.
        """
        return self.run((), None, wanted=wanted, wait=wait, call=call, strict=strict)

    async def gather(self, indices: Sequence[int], op: Op) -> Outcomes:
        """Launch ``op`` and collect every env's outcome; late envs fail with TimeoutError.

        Every env's call runs to its end, failed or not: the errors reported
        never depend on which env happened to finish first.  A ``reset`` first
        rebuilds the envs that the backend lost (their worker died).  Amid
        envs sent earlier (a restart, a ``reset_mask``), only ``op``'s envs are
        collected; the others' outcomes are held for the receive (`Sent.keep`).
        """
        backend, name, sent = self.backend, op.name, self.sent
        unbuilt = await self.rebuild_lost(indices) if name == "reset" else None
        own = set(indices) if sent.envs else None
        since = time.perf_counter()
        backend.launch(indices, op)
        if not backend.pending:  # every env answered in the launch
            outcomes = backend.take() if own is None else sent.keep(backend.take(), own)
        else:
            if self.unwound is None:
                self.unwound = asyncio.get_running_loop().create_future()
            resets = _resetting(indices, op) if self._uneven else ()
            timeout = self.reset_timeout if name == "reset" else self.step_timeout
            if own is None and timeout is None and not resets:
                outcomes = await backend.collect(len(indices))
            else:
                outcomes = await self.collect(
                    len(indices), name, lambda i: since, own=own, resets=resets
                )
        if unbuilt:
            outcomes[1].update(unbuilt)  # why they are still lost
        return outcomes

    def _timeout_of(self, name: str) -> float | None:
        """Seconds an env may take to answer the call ``name`` (``None``: no limit)."""
        return self.reset_timeout if name == "reset" else self.step_timeout

    async def rebuild_lost(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Before a reset, rebuild the envs of ``indices`` the backend lost; those it could not."""
        backend = self.backend
        await backend.settle(indices)
        if backend.lost.isdisjoint(indices):
            return {}
        return await backend.rebuild(sorted(backend.lost.intersection(indices)))

    def send(self, ids: Sequence[int], op: Op, call: str) -> None:
        """Start ``op`` on ``ids`` and return: they are in flight until received."""
        self.sent.start(ids, time.perf_counter(), _resetting(ids, op) if self._uneven else ())
        life, backend = self.life, self.backend
        receiving = life.state is _RECEIVING
        if not receiving:
            life.state = State.RESET_SENT if op.name == "reset" else State.SENT
        try:
            backend.launch(ids, op)
        except BaseException as exc:  # Ctrl-C raised by a sync env: stop everything
            self.abandon(f"{call} was interrupted ({type(exc).__name__})")
            raise
        if receiving:  # the recv() waiting re-plans: some may be done, their deadlines count
            backend.wake()

    def _collect_sent(
        self, wanted: int, wait_s: float | None, name: str
    ) -> Coroutine[Any, Any, Outcomes]:
        """Outcomes of sent envs until ``wanted`` arrived, ``wait_s`` passed or all are in.

        ``name`` is the call in flight (``"step"``, ``"reset"``): its timeout applies.
        """
        if self.unwound is None:
            self.unwound = asyncio.get_running_loop().create_future()
        until = None if wait_s is None else time.perf_counter() + wait_s
        sent = self.sent
        return self.collect(wanted, name, sent.at.__getitem__, until, resets=sent.resets)

    async def collect(
        self,
        wanted: int,
        name: str,
        launched: Callable[[int], float],
        until: float | None = None,
        *,
        own: set[int] | None = None,
        resets: Collection[int] = (),
    ) -> Outcomes:
        """Collect until ``wanted`` envs are in, none is in flight, or ``until`` passed.

        An env still running its timeout after its own start (see
        `_core.deadlines`: ``reset_timeout`` for the envs of ``resets`` and for
        a reset, else the timeout of ``name``) is cancelled and fails with
        ``TimeoutError``; its start is never before ``launched(i)``, when its
        call was launched.  Times are on the ``time.perf_counter`` clock.  With
        ``own``, only those envs are collected (and timed): the outcomes of the
        others are held for the `receive` in progress (`Sent.keep`).
        """
        backend, sent = self.backend, self.sent
        timeout, reset_timeout = self._timeout_of(name), self.reset_timeout
        timed = timeout is not None or bool(resets)
        if own is None:
            results, errors = sent.take_held(backend.take())
        else:
            results, errors = sent.keep(backend.take(), own)
        expired: dict[int, float | None] = {}
        while len(results) + len(errors) < wanted and self._out(own):
            now = time.perf_counter()
            wait: float | None = None
            if timed:
                out = backend.pending if own is None else backend.pending & own
                late, wait = overdue(
                    (
                        (
                            i,
                            _not_before(backend.started_at(i), launched(i)),
                            reset_timeout if i in resets else timeout,
                        )
                        for i in out
                        if i not in expired
                    ),
                    now,
                )
                if late:
                    for i in late:
                        expired[i] = reset_timeout if i in resets else timeout
                    backend.cancel(late)
                    continue  # collect what the cancellation delivered at once
            if until is not None:
                if until <= now:
                    break  # the caller's timeout
                wait = until - now if wait is None else min(wait, until - now)
            more_results, more_errors = sent.keep(
                await backend.collect(wanted - len(results) - len(errors), wait), own
            )
            if not results and not errors:
                results, errors = more_results, more_errors  # keep the backend's own mapping
            else:
                results.update(more_results)
                errors.update(more_errors)
        if expired:  # the outcomes their cancellation delivered; nothing of theirs left running
            await backend.settle_cancelled()
            more_results, more_errors = sent.keep(backend.take(), own)
            results.update(more_results)
            errors.update(more_errors)
            self._timed_out(expired, errors, name)
        return results, errors

    def _timed_out(
        self, expired: dict[int, float | None], errors: dict[int, BaseException], name: str
    ) -> None:
        """The envs ``expired`` (past their timeout) that were cancelled fail with TimeoutError."""
        timed_out = sorted(i for i in expired if i in errors and _cancelled(errors[i]))
        for i in timed_out:
            what = name if expired[i] == self._timeout_of(name) else "reset"
            errors[i] = TimeoutError(f"env {i} did not answer {what}() within {expired[i]} s")
        if timed_out and not (name == "step" and self._restarter.policy is not None):
            # (a step's timeouts under a restart policy are counted in its outage)
            logger.warning(
                "%s did not answer %s() within %s s; cancelled",
                say_envs(timed_out),
                name,
                expired[timed_out[0]],
            )

    def _out(self, own: set[int] | None) -> bool:
        """Whether some env is still in flight (of ``own``, when given)."""
        pending = self.backend.pending
        return bool(pending) if own is None else not own.isdisjoint(pending)

    async def drain(self) -> None:
        """Cancel (and wait for) every env still in flight; nothing is sent or held after."""
        await self.backend.drain()
        self.sent.clear()

    async def clear_break(self) -> None:
        """Before a reset of a broken vector env: drop what the call that broke it left.

        A call abandoned where it could not wait (``send()`` interrupted as it
        started its envs, ``recv()`` closed unfinished) leaves its envs' outcomes
        behind; they are not the reset's.
        """
        if self.life.state is State.BROKEN:
            await self.backend.drain()

    async def stop(self, reason: str) -> None:
        """Cancel (and wait for) the envs in flight from send(); a reset is needed then."""
        if self.life.state is State.SENT:
            await self.drain()
            self.life.break_(reason)

    def abandon(self, reason: str) -> None:
        """Cancel what is in flight without waiting (no loop may run now); ``BROKEN``."""
        self.backend.cancel()
        self.sent.clear()
        self.life.break_(reason)

    def _raise_for(
        self,
        errors: dict[int, BaseException],
        name: str,
        before: State,
        breaks: bool,
        note: str = "",
    ) -> NoReturn:
        """Raise the error for ``errors``: its class follows the causes; ``note`` says more."""
        for error in errors.values():
            if not isinstance(error, Exception):  # Ctrl-C or exit from an env: as it is
                self.life.break_(f"{name}() was interrupted ({type(error).__name__})")
                raise error
        if breaks:
            self.life.break_(f"{name}() failed in env {min(errors)}")
        else:
            self.life.state = before
        raise error_for(errors, f"{name}() ({note})" if note else f"{name}()")


def error_for(errors: dict[int, BaseException], operation: str) -> EnvError:
    """The error that reports failed envs: `aiovec.EnvError`, or the subclass its causes say.

    A backend's own report on an env (an `aiovec.EnvError`) gives its cause
    for that env; a worker's death makes it a `aiovec.WorkerDiedError`, a
    ``TimeoutError`` among the causes an `aiovec.EnvTimeoutError`.
    """
    kind: type[EnvError] = EnvError
    causes: dict[int, BaseException] = {}
    for i, error in errors.items():
        causes[i] = error
        if isinstance(error, EnvError):  # a backend's report on env i: its cause is the news
            if isinstance(error, WorkerDiedError):
                kind = WorkerDiedError
            causes[i] = error.errors.get(i, error)
    if kind is EnvError and any(isinstance(e, TimeoutError) for e in causes.values()):
        kind = EnvTimeoutError
    return kind(causes, operation)


def _resetting(indices: Sequence[int], op: Op) -> list[int]:
    """The envs of a step ``op`` that reset instead of stepping: their deadline is a reset's.

    A ``NEXT_STEP`` autoreset, a collector's reset (`StepOp.reset_first`).
    """
    if type(op) is not StepOp or not any(op.reset_first):
        return []
    return [i for i, first in zip(indices, op.reset_first, strict=True) if first]


def _not_before(start: float | None, launched: float) -> float | None:
    """An env's start, never before its launch (a backend may not have stamped it yet)."""
    return None if start is None else max(start, launched)


def _cancelled(error: BaseException) -> bool:
    return isinstance(error, asyncio.CancelledError)
