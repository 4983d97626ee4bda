"""What the parent and a worker (a process or a Ray actor) say to each other: typed values.

Every request names the envs it is for by their *local* index (their position
in the worker's group) and carries a sequence number, ``seq``, that its replies
repeat.  A new worker's first word is a `Reply` with ``seq`` 0 whose body is
`Ready` or `Failed`.

Requests:

- `StepRequest`: step those envs through their own ``step_flow``; ``None`` for
  ``reset_first`` or ``actions`` means "read them from the step rows".  Its
  results are the rows, and a `StepReply` for what the rows do not hold; a
  *streamed* request (``stream``, from ``send()``) publishes each env's result
  as soon as it is done, and so does a *timed* one (``timed``: a whole step
  under ``step_timeout``), whose run of sync envs publishes what it finished
  every ``FLUSH_AFTER`` seconds.
- `Cancel`: cancel whatever those envs are running (an async env's task is
  cancelled; a sync env cannot be interrupted).  No reply of its own: the
  cancelled call's outcome is the envs' ``CancelledError``.
- `Call`: one call per env (reset, render, close, ...); a `CallReply`.
- `Rebuild`: close those envs (best effort) and build new ones; a
  `RebuildReply`.
- `Attach`: map the step rows (the parent has sized them); an `AttachReply`.
- `Stop`: exit.

A process worker's whole steps need no pickle at all: see
``backends/process/wire.py`` and ``backends/process/table.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from aiovec._core.calls import Transition
from aiovec._core.layout import StepLayout
from aiovec._core.ops import CallOp
from aiovec.backends._base import EnvTraits

__all__ = (
    "Attach",
    "AttachReply",
    "Call",
    "CallReply",
    "Cancel",
    "Failed",
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
    """Step the envs ``locals`` (``None``: their resets or actions are in the step rows)."""

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
    """Map the step rows, which the parent sized for ``layout``."""

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
    """What a step's results say beyond the step rows, by local index.

    ``errors``: the envs that raised; ``infos``: infos that are not empty;
    ``finals``: ``SAME_STEP`` final observations and infos; ``odd``: whole
    transitions that did not fit the rows.  ``rows``: the group's step rows
    themselves where the worker shares none with the parent (a Ray actor's,
    as bytes).  ``envs``: the envs this reply covers, when more replies
    follow; ``None``: every env of the request not covered yet (the last).
    """

    errors: dict[int, BaseException]
    infos: dict[int, dict[str, Any]]
    finals: dict[int, dict[str, Any]]
    odd: dict[int, Transition]
    rows: Any = None
    envs: Sequence[int] | None = None

    def news(self) -> bool:
        """Whether it says anything beyond the rows."""
        return bool(self.errors or self.infos or self.finals or self.odd)


CLEAN_STEP = StepReply({}, {}, {}, {})
"""A step whose every result is in the rows."""


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
    """Why the step rows could not be mapped (``None``: they are)."""

    error: BaseException | None


class Reply(NamedTuple):
    """A worker's answer to request ``seq`` (0: a new worker's first word)."""

    seq: int
    body: Ready | Failed | StepReply | CallReply | RebuildReply | AttachReply
