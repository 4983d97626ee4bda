"""The exceptions aiovec raises.

The tree::

    Exception
     +-- EnvError                   an env failed; names it (.env_index, .errors)
     |    +-- EnvTimeoutError       an env did not answer in time (step_timeout, reset_timeout,
     |                              or step_wait/reset_wait's timeout); also a TimeoutError and
     |                              a multiprocessing.TimeoutError (what AsyncVectorEnv raises)
     |    +-- WorkerDiedError       the process or actor hosting some envs died
     +-- ValueError
          +-- SpacesDifferError     the envs' spaces differ (observation_mode says how
          |                         they may); also a RuntimeError, as gymnasium raises
          +-- StateError            the call is not allowed in the vector env's state
               +-- ClosedError      any call after close() (also a gymnasium
               |                    ClosedEnvironmentError)
               +-- NoAsyncCallError         step_wait()/reset_wait() with nothing sent
               +-- AlreadyPendingCallError  step_async()/reset_async() while a call waits
                                    (both also gymnasium's errors of the same names)

Bad arguments raise the built-in ``ValueError`` / ``TypeError`` with a message
naming the argument, what was expected and what came.  All exceptions here
pickle, so they cross process boundaries unchanged.  An env's exception is
shown as Python's traceback shows it (``TypeError: bad thing``), never as its
``repr()``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from typing import Any

import gymnasium.error

__all__ = (
    "AlreadyPendingCallError",
    "ClosedError",
    "EnvError",
    "EnvTimeoutError",
    "NoAsyncCallError",
    "SpacesDifferError",
    "StateError",
    "WorkerDiedError",
)


def describe_error(error: BaseException) -> str:
    """``error`` as the last line of a traceback shows it: ``TypeError: bad thing``."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class EnvError(Exception):
    """One or more envs failed during a vector call.

    Attributes:
        env_index: The lowest index among the envs that failed of their own: an
            env lost only because another env blocked its worker comes after
            them (its error says "lost with its worker, blocked by env N").
        errors: Every env that failed in that call, index -> the exception it
            raised; ``env_index`` first, then the others in the same order.
        operation: What failed, e.g. ``"step()"``, ``"reset()"``, ``"env_fns[3]()"``.

    The exception of ``env_index`` is also attached as ``__cause__``.
    """

    def __init__(self, errors: Mapping[int, BaseException], operation: str = "step()") -> None:
        if not errors:
            raise ValueError("EnvError needs at least one failing env, got an empty mapping")
        self.errors: dict[int, BaseException] = dict(sorted(errors.items(), key=_blame_order))
        self.env_index: int = next(iter(self.errors))
        self.operation = operation
        super().__init__(self._describe())
        self.__cause__ = self.errors[self.env_index]

    def _describe(self) -> str:
        first = self.errors[self.env_index]
        text = f"env {self.env_index} failed in {self.operation}: {describe_error(first)}"
        others = [i for i in self.errors if i != self.env_index]
        if others:
            shown = ", ".join(map(str, others[:10])) + (", ..." if len(others) > 10 else "")
            text += f" (and {len(others)} other env(s): {shown}; see .errors)"
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.errors, self.operation))


class LostWithWorkerError(ChildProcessError):
    """An env lost with its worker, which another env's abandoned sync call blocks.

    Not a failure of the env's own: its worker runs env ``blocked_by``'s call,
    which cannot be interrupted, and is replaced (with all its envs) by
    ``reset()`` or a restart.  `EnvError` names the env that blocked it first.
    """

    def __init__(self, message: str, blocked_by: int) -> None:
        super().__init__(message)
        self.blocked_by = blocked_by

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.blocked_by))


def _blame_order(item: tuple[int, BaseException]) -> tuple[bool, int]:
    """Envs that failed of their own first, then those lost with a blocked worker; by index."""
    return isinstance(item[1], LostWithWorkerError), item[0]


class EnvTimeoutError(EnvError, TimeoutError, multiprocessing.TimeoutError):
    """An env did not answer in time.

    The time was ``step_timeout`` or ``reset_timeout`` seconds, or the
    ``timeout`` of ``BlockingVectorEnv.step_wait``/``reset_wait``.  It is also a
    ``multiprocessing.TimeoutError``, which ``gymnasium.vector.AsyncVectorEnv``
    raises when a wait times out.
    """


class WorkerDiedError(EnvError):
    """The worker (process or actor) that hosted the failing envs died."""


class SpacesDifferError(ValueError, RuntimeError):
    """The envs' spaces differ in a way that ``observation_mode`` does not allow.

    A ``ValueError`` (a bad argument: the factories) and a ``RuntimeError``,
    which gymnasium's vector envs raise there.
    """


class StateError(ValueError):
    """The call is not allowed in the vector env's current state.

    For example ``step()`` before the first ``reset()``, a second ``step()``
    while one is in flight, or ``step()`` after a step failed half-way.  The
    message says which calls are allowed now.
    """


class ClosedError(StateError, gymnasium.error.ClosedEnvironmentError):
    """The vector env is closed; only ``close()`` (a no-op) is allowed."""


class _GymnasiumStateError(StateError):
    """A `StateError` that is also one of gymnasium's errors with a ``name`` attribute."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.name))


class NoAsyncCallError(_GymnasiumStateError, gymnasium.error.NoAsyncCallError):
    """``step_wait()``/``reset_wait()`` without a pending ``step_async()``/``reset_async()``.

    Attributes:
        name: The call that was expected to be pending (``"step"`` or ``"reset"``).
    """


class AlreadyPendingCallError(_GymnasiumStateError, gymnasium.error.AlreadyPendingCallError):
    """``step_async()``/``reset_async()`` while another call is pending.

    Attributes:
        name: The call that is pending (``"step"`` or ``"reset"``).
    """
