"""How the vector env's calls on its envs end: collected, restarted, or raised.

Theory of operation.  A call reaches its envs in one of two ways: a whole
call (``step``, ``reset``, ``call``, ...) launches its op and waits for every
env (`Flight.run`); partial stepping launches first (`Flight.send`, for
``send()`` and ``reset_async()``) and waits later, for some envs
(`Flight.receive`, for ``recv()``, ``step_wait()`` and ``reset_wait()``).
Both end through one skeleton, `Flight._finish`:

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

A lock-step step takes `Flight.step`, a straight path beside that skeleton: it
launches the op and, when the backend answered every env at once with well-formed
results (sync envs driven here), returns them without a coroutine of its own.  Any
news (an env still out, an error, a malformed result, envs sent earlier, an
exception out of the launch) is handed over, once, to `Flight._finish`, which goes
on from the launch as `Flight.run` would.

Waiting is `Flight.collect`'s: it asks the backend for outcomes until enough
are in, cancels each env past its own deadline (``step_timeout`` or
``reset_timeout`` from the env's own start; `aiovec._core.deadlines`) and
reports it with a ``TimeoutError``.  ``unwound`` is set while a call waits on
envs, so that ``close()`` can cancel them and wait for that call to unwind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, MutableMapping, Sequence
from typing import Any, NoReturn

from aiovec._core.deadlines import overdue
from aiovec._core.lifecycle import PENDING, Lifecycle, State
from aiovec._core.ops import Op
from aiovec._errors import ClosedError, EnvError, EnvTimeoutError, WorkerDiedError
from aiovec._log import logger, say_envs
from aiovec._restarter import Restarter
from aiovec._sent import Sent
from aiovec.backends import Backend
from aiovec.backends._base import Outcomes

__all__ = ("Flight",)

Results = MutableMapping[int, Any]


class Flight:
    """The vector env's calls on its envs, from launch to their end (see the module).

    Args:
        backend: Where the envs live.
        life: The vector env's lifecycle (this sets ``BUSY``, ``SENT``, ``BROKEN``, ...).
        sent: The envs in flight from ``send()``.
        restarter: Restarts failed steps (under a restart policy).
        check_results: Fails the envs whose step or reset result is malformed: moves
            them from the results to the errors (`fits.ResultCheck.check`).
        timeout_of: Seconds an env may take to answer the call of a name (``None``: no limit).
    """

    __slots__ = (
        "_check_results",
        "_restarter",
        "_timeout_of",
        "backend",
        "life",
        "sent",
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
        timeout_of: Callable[[str], float | None],
    ) -> None:
        self.backend = backend
        self.life = life
        self.sent = sent
        self._restarter = restarter
        self._check_results = check_results
        self._timeout_of = timeout_of
        self.unwound: asyncio.Future[None] | None = None
        """Set while a call waits on envs; done once it has unwound."""

    def run(self, indices: Sequence[int], op: Op, *, breaks: bool) -> Coroutine[Any, Any, Results]:
        """Run ``op`` on ``indices`` and return every env's result, or raise.

        ``breaks``: a failure leaves envs half-updated (step, reset), so the
        vector env becomes ``BROKEN``; otherwise its state is restored.
        """
        return self._finish(self.gather(indices, op), op.name, None, False, self.life.state, breaks)

    def step(self, indices: Sequence[int], op: Op) -> Results | Coroutine[Any, Any, Results]:
        """`run` of a lock-step step (it ``breaks``): the results, or a coroutine to await.

        The straight path (see the module) returns every env's results when they
        all came at once, cleanly; anything else is handed over to `_finish`.
        """
        sent, life = self.sent, self.life
        before = life.state
        if sent.envs or sent.held != ({}, {}):  # a step amid sent envs: the general path
            return self.run(indices, op, breaks=True)
        backend = self.backend
        life.state = State.BUSY
        since = time.perf_counter()
        try:
            backend.launch(indices, op)
            if backend.pending:
                outcomes = self._launched(indices, op.name, since, None)
            else:
                results, errors = backend.take()
                self._check_results(results, errors, "step")
                if not errors:
                    life.state = before
                    return results
                outcomes = _given((results, errors))
        except BaseException as exc:  # Ctrl-C out of a sync env: unwound by the general path
            outcomes = _raised(exc)
        return self._finish(outcomes, op.name, None, False, before, True)

    def receive(
        self, call: str, wanted: int, wait: float | None, *, strict: bool
    ) -> Coroutine[Any, Any, Results]:
        """Results of sent envs once ``wanted`` are in (or ``wait`` s passed), or raise.

        ``strict``: ``wanted`` envs or an error; those still out after ``wait``
        seconds fail with ``TimeoutError`` (and are cancelled, like any failed
        call's siblings), so the call raises `aiovec.EnvTimeoutError`.  The
        caller says which state the vector env is in after.
        """
        name = PENDING[self.life.state]  # what is in flight: "step" or "reset"
        outcomes = self._collect_sent(wanted, wait, name)
        least = wanted if strict else 0
        return self._finish(outcomes, name, call, True, State.READY, True, least, wait, not strict)

    async def _finish(  # noqa: PLR0917  (positional: it is on the hot path of every call)
        self,
        outcomes: Coroutine[Any, Any, Outcomes],
        name: str,
        call: str | None,
        sent: bool,
        before: State,
        breaks: bool,
        least: int = 0,
        wait: float | None = None,
        sends: bool = False,
    ) -> Results:
        """The one end of every call: await ``outcomes``, restart, raise (see the module).

        Args:
            outcomes: Collects the envs' outcomes.
            name: The op in flight (``"step"``, ``"reset"``, ``"call"``, ...).
            call: The call as its caller is named (``"recv()"``); ``None``: ``name()``.
            sent: The envs were sent (`receive`): they leave `Sent` here, and
                the caller says which state the vector env is in after.
            before: The state to restore on success (not ``sent``) or when a
                failure does not break the vector env.
            breaks: A failure leaves the vector env ``BROKEN``.
            least: Unless this many outcomes came, the envs still out fail
                with ``TimeoutError`` (the caller's ``wait``); 0: none is due.
            wait: The caller's timeout, for that message.
            sends: More envs may be sent until this call ends (``recv()``: the
                vector env is ``RECEIVING`` meanwhile; what they deliver while
                a restart waits for its own envs is held for this call).
        """
        life, sent_envs = self.life, self.sent
        life.state = State.RECEIVING if sends else State.BUSY
        refusal = ""
        try:
            results, errors = await outcomes
            late: set[int] | None = None
            if least and len(results) + len(errors) < least:  # the caller's timeout
                late = sent_envs.envs.difference(results, errors)
                for i in late:
                    errors[i] = TimeoutError(f"env {i} did not answer {call} within {wait} s")
            self._check_results(results, errors, name)
            if name == "step" and not errors and self._restarter.outage is not None:
                self._restarter.calm()  # every env answered: the outage is over
            while errors and not late and self._restarter.restartable(errors, step=name == "step"):
                refusal = self._restarter.charge(errors)
                if refusal:
                    break
                results.update(await self._restarter.restart(errors, name, self.gather))
                # what other sent envs delivered while the restart waited for its own
                more, errors = sent_envs.take_held(({}, {}))
                self._check_results(more, errors, name)
                results.update(more)
        except GeneratorExit:  # the coroutine was closed unfinished: no awaiting now
            self.abandon(f"{call or name + '()'} was abandoned unfinished")
            raise
        except BaseException as exc:
            if life.state is not State.CLOSED:
                await self.drain()
                life.break_(f"{call or name + '()'} was interrupted ({type(exc).__name__})")
            raise
        finally:
            if self.unwound is not None:
                self.unwound.set_result(None)
                self.unwound = None
        if sent:
            if name == "reset":
                errors.update(sent_envs.unbuilt)  # why they are still lost
            sent_envs.done(results, errors)
        if life.state is State.CLOSED:
            said = "waiting" if sent else "in flight"
            raise ClosedError(f"the vector env was closed while {call or name + '()'} was {said}")
        if errors:
            if sent:
                await self.drain()
            self._raise_for(errors, name, before, breaks, note=refusal)
        if not sent:
            life.state = before
        return results

    async def gather(self, indices: Sequence[int], op: Op) -> Outcomes:
        """Launch ``op`` and collect every env's outcome; late envs fail with TimeoutError.

        Every env's call runs to its end, failed or not: the errors reported
        never depend on which env happened to finish first.  A ``reset`` first
        rebuilds the envs that the backend lost (their worker died).
        """
        backend, name = self.backend, op.name
        unbuilt = await self.rebuild_lost(indices) if name == "reset" else None
        since = time.perf_counter()
        own = set(indices) if self.sent.envs else None  # a restart amid sent envs
        backend.launch(indices, op)
        if not backend.pending:
            outcomes = self.sent.keep(backend.take(), own)
        else:
            outcomes = await self._launched(indices, name, since, own)
        if unbuilt:
            outcomes[1].update(unbuilt)  # why they are still lost
        return outcomes

    async def _launched(
        self, indices: Sequence[int], name: str, since: float, own: set[int] | None
    ) -> Outcomes:
        """Collect the outcomes of a call launched at ``since`` on ``indices``, some still out."""
        backend = self.backend
        if self.unwound is None:
            self.unwound = asyncio.get_running_loop().create_future()
        timeout = self._timeout_of(name)
        if timeout is None and own is None:
            return await backend.collect(len(indices))
        return await self.collect(len(indices), timeout, name, lambda i: since, own=own)

    async def rebuild_lost(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Before a reset, rebuild the envs of ``indices`` the backend lost; those it could not."""
        backend = self.backend
        await backend.settle(indices)
        if backend.lost.isdisjoint(indices):
            return {}
        return await backend.rebuild(sorted(backend.lost.intersection(indices)))

    def send(self, ids: Sequence[int], op: Op, call: str) -> None:
        """Start ``op`` on ``ids`` and return: they are in flight until received."""
        self.sent.start(ids, time.perf_counter())
        life, backend = self.life, self.backend
        receiving = life.state is State.RECEIVING
        if not receiving:
            life.state = State.RESET_SENT if op.name == "reset" else State.SENT
        try:
            backend.launch(ids, op)
        except BaseException as exc:  # Ctrl-C raised by a sync env: stop everything
            self.abandon(f"{call} was interrupted ({type(exc).__name__})")
            raise
        if receiving:  # the recv() waiting re-plans: some may be done, their deadlines count
            backend.wake()

    async def _collect_sent(self, wanted: int, wait_s: float | None, name: str) -> Outcomes:
        """Outcomes of sent envs until ``wanted`` arrived, ``wait_s`` passed or all are in.

        ``name`` is the call in flight (``"step"``, ``"reset"``): its timeout applies.
        """
        if self.unwound is None:
            self.unwound = asyncio.get_running_loop().create_future()
        until = None if wait_s is None else time.perf_counter() + wait_s
        launched = self.sent.at.__getitem__
        return await self.collect(wanted, self._timeout_of(name), name, launched, until)

    async def collect(
        self,
        wanted: int,
        timeout: float | None,  # noqa: ASYNC109  (each env's own deadline, not this call's)
        name: str,
        launched: Callable[[int], float],
        until: float | None = None,
        *,
        own: set[int] | None = None,
    ) -> Outcomes:
        """Collect until ``wanted`` envs are in, none is in flight, or ``until`` passed.

        An env still running ``timeout`` seconds after its own start (see
        `_core.deadlines`) is cancelled and fails with ``TimeoutError``; its
        start is never before ``launched(i)``, when its call was launched.
        Times are on the ``time.perf_counter`` clock.  With ``own``, only those
        envs are collected (and timed): the outcomes of the others are held
        for the `receive` in progress (`Sent.keep`).
        """
        backend, sent = self.backend, self.sent
        if own is None:
            results, errors = sent.take_held(backend.take())
        else:
            results, errors = sent.keep(backend.take(), own)
        expired: set[int] = set()
        while len(results) + len(errors) < wanted and self._out(own):
            now = time.perf_counter()
            wait: float | None = None
            if timeout is not None:
                out = backend.pending if own is None else backend.pending & own
                starts = (
                    (i, _not_before(backend.started_at(i), launched(i))) for i in out - expired
                )
                late, wait = overdue(starts, timeout, now)
                if late:
                    expired.update(late)
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
        timed_out = sorted(i for i in expired.intersection(errors) if _cancelled(errors[i]))
        for i in timed_out:
            errors[i] = TimeoutError(f"env {i} did not answer {name}() within {timeout} s")
        if timed_out and not (name == "step" and self._restarter.policy is not None):
            # (a step's timeouts under a restart policy are counted in its outage)
            logger.warning(
                "%s did not answer %s() within %s s; cancelled", say_envs(timed_out), name, timeout
            )
        return results, errors

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


async def _given(outcomes: Outcomes) -> Outcomes:
    """Outcomes already in, as `Flight._finish` awaits them."""
    return outcomes


async def _raised(error: BaseException) -> NoReturn:
    """Raise ``error`` where `Flight._finish` awaits outcomes (a launch that raised)."""
    raise error


def _not_before(start: float | None, launched: float) -> float | None:
    """An env's start, never before its launch (a backend may not have stamped it yet)."""
    return None if start is None else max(start, launched)


def _cancelled(error: BaseException) -> bool:
    return isinstance(error, asyncio.CancelledError)
