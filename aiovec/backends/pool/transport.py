"""The transport protocol: what the pool asks of whatever carries its requests to workers.

The pool (`aiovec.backends.pool.pool.Pool`) decides everything about envs
grouped on workers; a transport only carries requests to a worker and brings
outcomes back, as httpcore's connection pool drives a connection interface.
Two implement it: ``backends/process/`` (worker processes, a shared completion
table and one doorbell) and ``backends/ray/`` (Ray actors and object refs).

A transport reports back to its pool through the pool's delivery methods:
`Pool.deliver` (a reply to a request: a step's or a call's outcomes, or a
control request's value, `Pool.deliver_step` a part of a step's), the
backend's `_finish_block` (a whole step, every env's result in the step rows,
as one block), and `Pool.lose` (a worker died).

This module also holds what both transports share of a group's life: how the
envs are split (`split`), what a new worker reports (`ready_traits`,
`join_traits`, `check_replaced`) and the op that closes a group (`close_op`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from aiovec._core.calls import CLOSE
from aiovec._core.ops import CallOp, Op
from aiovec._errors import EnvError
from aiovec.backends._base import EnvTraits, check_rebuilt_spaces
from aiovec.backends.pool.messages import Failed, Ready

if TYPE_CHECKING:
    pass

__all__ = (
    "Part",
    "Transport",
    "WorkerHandle",
    "check_replaced",
    "close_op",
    "join_traits",
    "ready_traits",
    "split",
)

Part = tuple[int, Sequence[int], Sequence[int]]
"""One worker's part of a call: ``(w, envs, positions in the call's indices)``; a
whole group, in order, is named by its ``range``."""


class WorkerHandle(Protocol):
    """The pool's view of one worker: the envs it hosts, whether it lives, its name."""

    group: range
    alive: bool

    def describe(self) -> str:
        """The worker in words, for errors and log lines."""


class Transport(Protocol):
    """Carries a pool's requests to its workers and their outcomes back.

    Made with the pool and its ``backend_options`` (nothing started yet);
    ``default_workers`` is how many workers it runs unless told.
    """

    INTERRUPTS: ClassVar[bool]
    """Whether a worker can cancel an async env's call in flight (`interrupt`)."""
    workers: list[Any]
    """``workers[w]`` hosts ``pool.groups[w]`` (a `WorkerHandle`)."""
    default_workers: int

    def start(self) -> list[EnvTraits]:
        """Start a worker per group of the pool (blocking: no loop yet); each group's traits."""

    def send(self, parts: list[Part], op: Op, since: float, whole: bool) -> None:
        """Start ``op`` (launched at ``since``): one request per part, each in flight once sent.

        ``whole``: the parts are every worker's whole group, none lost or blocked.
        An env whose part cannot be sent fails at once (`Pool.unsendable`).
        """

    def interrupt(self, worker: Any, locals_: list[int]) -> None:
        """Cancel the calls in flight of the async envs ``locals_`` in ``worker``."""

    def receive(self, need: Callable[[], int], deadline: float | None) -> bool:
        """Take in the outcomes that came; wait here too, if the loop is parked.

        Returns whether it waited (until ``need()`` outcomes are no longer
        wanted, or ``deadline`` on the ``time.monotonic`` clock); ``False``: the
        caller waits through the loop for the rest, and the transport wakes it
        once ``need()`` more have come.
        """

    def rows_of(self, request: Any, rows: Sequence[int], reply: Any) -> tuple[Sequence[int], Any]:
        """The step rows ``rows`` of a `StepReply` to ``request``: the block's envs, arrays."""

    async def settle_cancelled(self) -> None:
        """Let the transport's own work for cancelled calls end (briefly)."""

    async def rebuild_in_place(self, w: int, locals_: list[int]) -> dict[int, BaseException] | None:
        """Rebuild envs ``locals_`` inside worker ``w``: the failures, or ``None`` if it died."""

    async def replace(self, w: int) -> EnvTraits:
        """Stop worker ``w`` (if it still runs) and start a new one: its envs' traits."""

    def kill(self, w: int) -> None:
        """Kill worker ``w`` at once (its envs are lost)."""

    async def aclose(self, errors: Mapping[int, BaseException] | None) -> None:
        """Stop every worker and release everything (their envs are closed, or abandoned).

        ``errors``: the envs whose ``close()`` failed (``None``: closing them failed).
        """

    def close_now(self) -> None:
        """Without a loop (construction failed): close the envs, best effort; stop everything."""


def split(num_envs: int, count: int) -> list[range]:
    """``count`` contiguous groups of envs whose sizes differ by one at most."""
    size, extra = divmod(num_envs, count)
    bounds = [w * size + min(w, extra) for w in range(count + 1)]
    return [range(bounds[w], bounds[w + 1]) for w in range(count)]


def ready_traits(body: Ready | Failed) -> EnvTraits:
    """The traits a new worker reported, or the error its construction raised."""
    if isinstance(body, Failed):
        if body.by_factory:
            index = body.env_index
            raise EnvError({index: body.error}, f"env_fns[{index}]()") from body.error
        raise body.error
    return body.traits


def join_traits(parts: Sequence[EnvTraits]) -> EnvTraits:
    """The traits of all envs, from those of each group in order."""
    return EnvTraits(
        [space for t in parts for space in t.observation_spaces],
        [space for t in parts for space in t.action_spaces],
        parts[0].metadata,
        parts[0].render_mode,
    )


def close_op(count: int) -> CallOp:
    """The op that closes ``count`` envs."""
    return CallOp([CLOSE] * count, "close")


def check_replaced(envs: list[int], first: int, got: EnvTraits, traits: EnvTraits) -> None:
    """The envs ``envs`` of a new worker (its group starts at ``first``) have their spaces."""
    for i in envs:
        j = i - first
        want = (traits.observation_spaces[i], traits.action_spaces[i])
        check_rebuilt_spaces(i, (got.observation_spaces[j], got.action_spaces[j]), want)
