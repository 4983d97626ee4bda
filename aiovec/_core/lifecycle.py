"""The vector env's lifecycle: named states and which calls each allows.

::

    NEEDS_RESET --reset--> READY --step--> BUSY --ok--> READY
         |                   ^  |            |
         |                   |  +--send--> SENT --recv (BUSY while waiting)--> SENT/READY
         |                   +----reset------+--fails/cancelled--> BROKEN
         +--------------------------------------- close ---------> CLOSED

Every state allows ``close()``; ``BROKEN`` allows only a full ``reset()`` and
``close()``.  The table below is the one place that says so.
"""

from __future__ import annotations

import enum

from aiovec._errors import ClosedError, StateError

__all__ = ("Lifecycle", "Op", "State")


class State(enum.Enum):
    """Where a vector env is in its life: ``venv.state``, public as ``aiovec.State``.

    ``NEEDS_RESET`` (before the first ``reset()``), ``READY``, ``BUSY`` (a
    call is in flight), ``SENT`` (envs in flight from ``send()``), ``BROKEN``
    (a call failed or was cancelled half-way: only a full ``reset()`` or
    ``close()`` is allowed) and ``CLOSED``.
    """

    # Members are singletons: identity hashing is exact, and C-speed (Enum's own
    # __hash__ is Python code, and the table is consulted on every call).
    __hash__ = object.__hash__

    NEEDS_RESET = "needs a first reset"
    READY = "ready"
    SENT = "sent"
    BUSY = "busy"
    BROKEN = "broken"
    CLOSED = "closed"


class Op(enum.Enum):
    """The calls the table governs."""

    # Members are singletons: identity hashing is exact, and C-speed (Enum's own
    # __hash__ is Python code, and the table is consulted on every call).
    __hash__ = object.__hash__

    RESET = "reset()"
    RESET_MASK = "reset(options={'reset_mask': ...})"
    STEP = "step()"
    SEND = "send()"
    RECV = "recv()"
    INSPECT = "render()/call()/get_attr()/set_attr()"


_ALL = frozenset(Op)
_ALLOWED: dict[State, frozenset[Op]] = {
    State.NEEDS_RESET: frozenset({Op.RESET, Op.INSPECT}),
    State.READY: _ALL - {Op.RECV},
    State.SENT: frozenset({Op.SEND, Op.RECV}),
    State.BUSY: frozenset(),
    State.BROKEN: frozenset({Op.RESET}),
    State.CLOSED: frozenset(),
}

_WHY: dict[State, str] = {
    State.NEEDS_RESET: "the vector env has not been reset yet; call reset() first",
    State.READY: "no env is in flight; call send() before recv()",
    State.SENT: "some envs are in flight from send(); recv() them first (or close())",
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

    def check(self, op: Op) -> None:
        """Raise ``StateError`` (``ClosedError`` once closed) unless ``op`` is allowed now."""
        state = self.state
        if op in _ALLOWED[state]:
            return
        if state is State.CLOSED:
            raise ClosedError(f"cannot call {op.value}: {_WHY[state]}")
        if state is State.BROKEN:
            raise StateError(
                f"cannot call {op.value}: {self.broken_because}; only a full reset() "
                "(without reset_mask) or close() is allowed now"
            )
        raise StateError(f"cannot call {op.value}: {_WHY[state]}")

    def break_(self, reason: str) -> None:
        """Enter ``BROKEN``: a call failed or was cancelled half-way."""
        if self.state is not State.CLOSED:
            self.state = State.BROKEN
            self.broken_because = reason
