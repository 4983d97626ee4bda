"""The vector env's lifecycle: named states and which calls each allows.

::

    NEEDS_RESET --reset--> READY --step--> BUSY --ok--> READY
         |                   ^  |            |
         |                   |  +--send--> SENT --recv (RECEIVING: send() allowed)--> SENT/READY
         |                   +----reset------+--fails/cancelled--> BROKEN
         +--reset_async--> RESET_SENT --reset_wait (BUSY while waiting)--> READY
         +--------------------------------------- close ---------> CLOSED

Every state allows ``close()``; ``BROKEN`` allows only a full ``reset()`` and
``close()``.  The table below is the one place that says so.

gymnasium's ``AsyncVectorEnv`` spellings (the blocking front end's) are ops of
the same table: ``step_async()`` is a ``send()`` of every env, ``step_wait()`` a
``recv()`` of every env; ``reset_async()`` sends a reset (``RESET_SENT``) that
only ``reset_wait()`` collects.  Refusing them raises gymnasium's errors
(``NoAsyncCallError``, ``AlreadyPendingCallError``) with gymnasium's messages.
"""

from __future__ import annotations

import enum

from aiovec._errors import AlreadyPendingCallError, ClosedError, NoAsyncCallError, StateError

__all__ = ("PENDING", "Lifecycle", "State", "VectorCall", "allowed_in")


class State(enum.Enum):
    """Where a vector env is in its life: ``venv.state``, public as ``aiovec.State``.

    ``NEEDS_RESET`` (before the first ``reset()``), ``READY``, ``BUSY`` (a
    call is in flight), ``SENT`` (envs in flight from ``send()``),
    ``RECEIVING`` (a ``recv()`` waits; more envs may be sent), ``BROKEN``
    (a call failed or was cancelled half-way: only a full ``reset()`` or
    ``close()`` is allowed) and ``CLOSED``.
    """

    # Members are singletons: identity hashing is exact, and C-speed (Enum's own
    # __hash__ is Python code, and the table is consulted on every call).
    __hash__ = object.__hash__

    NEEDS_RESET = "needs a first reset"
    READY = "ready"
    SENT = "sent"
    RESET_SENT = "reset sent"
    RECEIVING = "receiving"
    BUSY = "busy"
    BROKEN = "broken"
    CLOSED = "closed"


class VectorCall(enum.Enum):
    """The calls the table governs."""

    # Members are singletons: identity hashing is exact, and C-speed (Enum's own
    # __hash__ is Python code, and the table is consulted on every call).
    __hash__ = object.__hash__

    RESET = "reset()"
    RESET_MASK = "reset(options={'reset_mask': ...})"
    STEP = "step()"
    SEND = "send()"
    RECV = "recv()"
    INSPECT = "render()/call()/get_attr()/set_attr()/env_is_wrapped()"
    STEP_ASYNC = "step_async()"
    STEP_WAIT = "step_wait()"
    RESET_ASYNC = "reset_async()"
    RESET_WAIT = "reset_wait()"


_ALL = frozenset(VectorCall)
_ALLOWED: dict[State, frozenset[VectorCall]] = {
    State.NEEDS_RESET: frozenset({VectorCall.RESET, VectorCall.RESET_ASYNC, VectorCall.INSPECT}),
    State.READY: _ALL - {VectorCall.RECV, VectorCall.STEP_WAIT, VectorCall.RESET_WAIT},
    # a masked reset amid sent envs resets envs not in flight (the vector env checks which)
    State.SENT: frozenset(
        {VectorCall.SEND, VectorCall.RECV, VectorCall.STEP_WAIT, VectorCall.RESET_MASK}
    ),
    State.RESET_SENT: frozenset({VectorCall.RESET_WAIT}),
    State.RECEIVING: frozenset({VectorCall.SEND}),
    State.BUSY: frozenset(),
    State.BROKEN: frozenset({VectorCall.RESET, VectorCall.RESET_ASYNC}),
    State.CLOSED: frozenset(),
}


def allowed_in(op: VectorCall) -> frozenset[State]:
    """The states in which the table allows ``op``.

    For the calls made on every step: ``state in ok or life.check(op)``, with
    ``ok`` computed once, costs no call when the call is allowed (the refusal
    and its message are still `Lifecycle.check`'s).
    """
    return frozenset(state for state, ops in _ALLOWED.items() if op in ops)


PENDING: dict[State, str] = {State.SENT: "step", State.RESET_SENT: "reset"}
"""The call a state waits to be collected, in gymnasium's words (``AsyncState``)."""

_WAITING = frozenset({State.BUSY, State.RECEIVING})
_WAITS_FOR = {VectorCall.STEP_WAIT: "step", VectorCall.RESET_WAIT: "reset"}
_STARTS = frozenset({VectorCall.STEP_ASYNC, VectorCall.RESET_ASYNC})
_COLLECT = {"step": "step_wait() or recv()", "reset": "reset_wait()"}

_WHY: dict[State, str] = {
    State.NEEDS_RESET: "the vector env has not been reset yet; call reset() first",
    State.READY: "no env is in flight; call send() before recv()",
    State.SENT: "some envs are in flight from send(); recv() them first (or close())",
    State.RESET_SENT: "a reset is in flight from reset_async(); reset_wait() for it first",
    State.RECEIVING: (
        "a recv() is waiting on this vector env; only send() may be called meanwhile "
        "(await the recv() first)"
    ),
    State.BUSY: (
        "another call is in flight on this vector env (calls on one vector env must not "
        "overlap; await the first one, or use send()/recv() for partial stepping)"
    ),
    State.BROKEN: "",  # filled in with the reason by Lifecycle.break_
    State.CLOSED: "the vector env is closed",
}


class Lifecycle:
    """The current state, and the check every public call makes first."""

    __slots__ = ("broken_because", "state")

    def __init__(self) -> None:
        self.state = State.NEEDS_RESET
        self.broken_because = ""

    def check(self, op: VectorCall) -> None:
        """Raise ``StateError`` (``ClosedError`` once closed) unless ``op`` is allowed now."""
        state = self.state
        if op in _ALLOWED[state]:
            return
        if state is State.CLOSED:
            raise ClosedError(f"cannot call {op.value}: {_WHY[state]}")
        if op in _WAITS_FOR and state not in _WAITING:
            name = _WAITS_FOR[op]
            raise NoAsyncCallError(
                f"Calling `{name}_wait` without any prior call to `{name}_async`. "
                f"Nothing is pending (state {state.name}{self._because()}).",
                name,
            )
        if op in _STARTS and state in PENDING:
            name = PENDING[state]
            raise AlreadyPendingCallError(
                f"Calling `{op.value[:-2]}` while waiting for a pending call to `{name}` to "
                f"complete; collect it first with {_COLLECT[name]} (or close())",
                name,
            )
        if state is State.BROKEN:
            raise StateError(
                f"cannot call {op.value}: {self.broken_because}; only a full reset() "
                "(without reset_mask) or close() is allowed now"
            )
        raise StateError(f"cannot call {op.value}: {_WHY[state]}")

    def _because(self) -> str:
        return f": {self.broken_because}" if self.state is State.BROKEN else ""

    def break_(self, reason: str) -> None:
        """Enter ``BROKEN``: a call failed or was cancelled half-way."""
        if self.state is not State.CLOSED:
            self.state = State.BROKEN
            self.broken_because = reason
