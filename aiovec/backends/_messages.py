"""What the parent and a worker (a process or a Ray actor) say to each other: typed values.

Every request names the envs it is for by their *local* index (their position
in the worker's group) and carries a sequence number, ``seq``, that its reply
repeats.  A worker answers each request with one `Reply`; a new worker's first
word is a `Reply` with ``seq`` 0 whose body is `Ready` or `Failed`.

Requests:

- `StepRequest`: step those envs through their own ``step_flow``; ``None`` for
  ``reset_first`` or ``actions`` means "read them from the shared step rows".
  Answered by a `StepReply`; a *streamed* request (``stream``, from ``send()``)
  by several, each covering the envs that finished since the last
  (``StepReply.envs``), the last one covering the rest; so is a *timed* one
  (``timed``: a whole step under ``step_timeout``), whose run of sync envs
  publishes what it finished every `FLUSH_AFTER` seconds.
- `Cancel`: cancel whatever those envs are running (an async env's task is
  cancelled; a sync env cannot be interrupted).  No reply of its own: the
  cancelled call's reply carries the envs' ``CancelledError``.
- `Call`: one call per env (reset, render, close, ...); a `CallReply`.
- `Rebuild`: close those envs (best effort) and build new ones; a
  `RebuildReply`.
- `Attach`: map the shared step file (the parent has sized it); an
  `AttachReply`.
- `Stop`: exit.

The lean step is the one exception to pickled messages, for speed: a whole
group's step whose actions and reset flags are in the shared rows is the
fixed-size binary `LeanStep`, and a worker whose every result went into the
rows, with nothing else to say, answers with the fixed-size `LeanReply`.  A
pickle never starts with their marker byte `LEAN`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from gymnasium.vector import AutoresetMode

from aiovec._core.calls import Transition
from aiovec._core.layout import StepLayout
from aiovec._core.ops import CallOp
from aiovec.backends._base import EnvTraits

__all__ = (
    "LEAN",
    "Attach",
    "AttachReply",
    "Call",
    "CallReply",
    "Cancel",
    "Failed",
    "LeanReply",
    "LeanStep",
    "Outcome",
    "Ready",
    "Rebuild",
    "RebuildReply",
    "Reply",
    "StepReply",
    "StepRequest",
    "Stop",
    "WorkerRequest",
)

Outcome = tuple[Any, BaseException | None]
"""One env's outcome of a call: ``(value, None)`` or ``(None, error)``."""

# -- requests --------------------------------------------------------------------------


class StepRequest(NamedTuple):
    """Step the envs ``locals`` (``None``: their resets or actions are in the shared rows)."""

    seq: int
    locals: Sequence[int]
    mode: str
    reset_first: Sequence[bool] | None
    actions: Sequence[Any] | None
    stream: bool = False  # publish each env's result as soon as it is done
    timed: bool = False  # a deadline applies: publish finished envs (a run of sync envs) early


class Cancel(NamedTuple):
    """Cancel the calls in flight of the envs ``locals`` (async envs' tasks).

    ``seq``: only those of request ``seq``; 0 (the process backend's, whose pipe
    keeps a cancel ahead of later requests): whatever those envs run.
    """

    seq: int
    locals: Sequence[int]


class Call(NamedTuple):
    """One call per env of ``locals`` (``op.calls[k]`` for ``locals[k]``)."""

    seq: int
    locals: Sequence[int]
    op: CallOp


class Rebuild(NamedTuple):
    """Close the envs ``locals`` (best effort) and build new ones from their factories."""

    seq: int
    locals: Sequence[int]


class Attach(NamedTuple):
    """Map the shared step file, which the parent sized for ``layout``."""

    seq: int
    layout: StepLayout


class Stop(NamedTuple):
    """Exit (the envs were closed by a `Call`, or are abandoned)."""


WorkerRequest = StepRequest | Call | Cancel | Rebuild | Attach | Stop

# -- replies ---------------------------------------------------------------------------


class Ready(NamedTuple):
    """A new worker built its envs: their traits, which are async (and a Ray actor's node)."""

    traits: EnvTraits
    node_id: str | None = None
    asyncs: tuple[bool, ...] = ()


class Failed(NamedTuple):
    """A new worker could not build env ``env_index``: its factory raised, or made no env."""

    env_index: int
    error: BaseException
    by_factory: bool


class StepReply(NamedTuple):
    """What a step's results say beyond the shared rows, by local index.

    ``errors``: the envs that raised; ``infos``: infos that are not empty;
    ``finals``: ``SAME_STEP`` final observations and infos; ``odd``: whole
    transitions that did not fit the rows.  ``rows``: the group's step rows
    themselves where the worker shares none with the parent (a Ray actor's,
    as bytes).  ``envs``: the envs this reply covers, when the request is
    streamed and more replies follow; ``None``: every env of the request not
    covered yet (the request's last reply).
    """

    errors: dict[int, BaseException]
    infos: dict[int, dict[str, Any]]
    finals: dict[int, dict[str, Any]]
    odd: dict[int, Transition]
    rows: Any = None
    envs: Sequence[int] | None = None


CLEAN_STEP = StepReply({}, {}, {}, {})
"""A step whose every result is in the shared rows (what a `LeanReply` says)."""


class CallReply(NamedTuple):
    """One outcome per env of the `Call`, in its order."""

    outcomes: list[Outcome]


class RebuildReply(NamedTuple):
    """The envs of the `Rebuild` whose factory failed (or made an env with other spaces).

    ``asyncs``: whether each env rebuilt is async, by local index.
    """

    errors: dict[int, BaseException]
    asyncs: dict[int, bool] | None = None


class AttachReply(NamedTuple):
    """Why the shared step file could not be mapped (``None``: it is)."""

    error: BaseException | None


class Reply(NamedTuple):
    """A worker's answer to request ``seq`` (0: a new worker's first word)."""

    seq: int
    body: Ready | Failed | StepReply | CallReply | RebuildReply | AttachReply


# -- the lean step: fixed-size binary frames -------------------------------------------

LEAN = 0x53
"""The first byte of a lean frame's payload (b"S"); a pickle (protocol >= 2) starts with 0x80."""
MODES = tuple(mode.value for mode in AutoresetMode)  # by code
_MODE_CODES = {mode: code for code, mode in enumerate(MODES)}
# The fields of each frame, named once: the payload's, then framed at once (the
# length header, as `_wire.frame` writes it, then the payload).
_LEAN_STEP = struct.Struct("!BqBB")  # LEAN, seq, the autoreset mode's code, flags
_STREAM, _TIMED = 1, 2  # the flags
_LEAN_REPLY = struct.Struct("!Bq")  # LEAN, seq
_LEAN_STEP_FRAMED = struct.Struct("!i" + _LEAN_STEP.format[1:])
_LEAN_REPLY_FRAMED = struct.Struct("!i" + _LEAN_REPLY.format[1:])


class LeanStep(NamedTuple):
    """Step every env of the group, its actions and reset flags read from the shared rows.

    ``stream`` and ``timed``: as `StepRequest`'s.
    """

    seq: int
    mode: str
    stream: bool = False
    timed: bool = False

    @staticmethod
    def frame(seq: int, mode: str, stream: bool = False, timed: bool = False) -> bytes:
        """The request ``LeanStep(seq, mode, stream, timed)``, framed (no tuple: a hot path)."""
        flags = (_STREAM if stream else 0) | (_TIMED if timed else 0)
        return _LEAN_STEP_FRAMED.pack(_LEAN_STEP.size, LEAN, seq, _MODE_CODES[mode], flags)

    @classmethod
    def parse(cls, payload: bytes) -> LeanStep:
        """The request of a framed payload (its length header cut off)."""
        _, seq, mode, flags = _LEAN_STEP.unpack(payload)
        return cls(seq, MODES[mode], bool(flags & _STREAM), bool(flags & _TIMED))


class LeanReply(NamedTuple):
    """Request ``seq`` is done, and every result of it is in the shared rows."""

    seq: int

    @staticmethod
    def frame(seq: int) -> bytes:
        """The reply ``LeanReply(seq)``, framed (no tuple made: a step's hot path)."""
        return _LEAN_REPLY_FRAMED.pack(_LEAN_REPLY.size, LEAN, seq)

    @classmethod
    def parse(cls, payload: bytes) -> LeanReply:
        """The reply of a framed payload (its length header cut off)."""
        _, seq = _LEAN_REPLY.unpack(payload)
        return cls(int(seq))
