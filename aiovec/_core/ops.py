"""Operations: one vector call, as a value a backend can run (and pickle).

An op covers the envs of one vector call, in the order of the ``indices`` it is
launched with: entry ``k`` of its lists belongs to the ``k``-th of them.  A
process or Ray backend slices an op per worker with ``subset``.

A ``StepOp`` is run through each env's `step_flow`;
a ``CallOp`` is one call per env.  Ops are immutable named tuples: one is
built per vector call, and a frozen dataclass costs three times as much.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from gymnasium.vector import AutoresetMode

from aiovec._core.calls import EnvCall

__all__ = ("CallOp", "Op", "StepOp")


class StepOp(NamedTuple):
    """Step envs: ``actions[k]`` and ``reset_first[k]`` belong to the k-th env.

    ``batch`` is the validated batch of actions as the user gave it, in the
    order of the op's envs: a process backend copies it into shared memory at
    once instead of sending ``actions`` one by one; it is ``None`` where an
    entry of ``reset_first`` is an `~aiovec._core.calls.Autoreset` (an
    autoreset with options) or `~aiovec._core.calls.KEEP_ENDED`, which must
    travel env by env.  ``stream``: the results
    are wanted env by env, as each finishes (``send()``), not all at once.
    ``timed``: a ``step_timeout`` applies, so a worker publishes the envs it
    has finished before a deadline can pass them by, even in a whole step.
    """

    mode: AutoresetMode
    actions: Sequence[Any]
    reset_first: Sequence[bool]
    name: str = "step"
    batch: Any = None
    stream: bool = False
    timed: bool = False

    def subset(self, positions: Sequence[int]) -> StepOp:
        """The same op restricted to some of its envs (by position)."""
        if isinstance(positions, range) and positions.step == 1:  # a worker's whole group
            part = slice(positions.start, positions.stop)
            return StepOp(
                self.mode,
                self.actions[part],
                self.reset_first[part],
                self.name,
                stream=self.stream,
                timed=self.timed,
            )
        return StepOp(
            self.mode,
            [self.actions[k] for k in positions],
            [self.reset_first[k] for k in positions],
            self.name,
            stream=self.stream,
            timed=self.timed,
        )


class CallOp(NamedTuple):
    """One call per env: ``calls[k]`` is made on the k-th env."""

    calls: Sequence[EnvCall]
    name: str

    def subset(self, positions: Sequence[int]) -> CallOp:
        """The same op restricted to some of its envs (by position)."""
        if isinstance(positions, range) and positions.step == 1:
            return CallOp(self.calls[positions.start : positions.stop], self.name)
        return CallOp([self.calls[k] for k in positions], self.name)


Op = StepOp | CallOp
