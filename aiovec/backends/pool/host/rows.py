"""A worker's step rows: actions and reset flags read, transitions written in place.

A worker process maps the shared step file (the parent's rows, each env at
its global index); a Ray actor writes into step arrays of its own (row 0 its
first env) that travel with its reply.  A transition goes into its row only
when it fits exactly (`_core/layout.py`); what does not fit travels by
message (*odd*), and the parent checks and batches it with the usual rules.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from aiovec._core import validate
from aiovec._core.calls import Transition
from aiovec._core.layout import StepArrays, StepLayout, take_rows

__all__ = ("RowWriter", "Written")

# Values written to the rows as they are: exactly the types the parent's
# step-result check (`validate.step_result_checker`) takes at once.  Anything
# else travels by message, and the parent checks and batches it with the usual rules.
_NUMBERS = validate.REWARD_TYPES
_FLAGS = validate.FLAG_TYPES
_DICTS = validate.DICT_TYPES
_ARRAYS = frozenset({np.ndarray})

Written = tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]], dict[int, Transition]]
"""What transitions written to the rows leave to say, by local index: the
infos that are not empty, ``SAME_STEP`` finals, and the odd transitions."""


class RowWriter:
    """The step rows of one worker's envs (none until `use` or `map`: every transition odd)."""

    def __init__(self) -> None:
        self.layout: StepLayout | None = None
        self.buffer: Any = None
        self.arrays: StepArrays | None = None
        self.first = 0  # the row of the group's first env in ``arrays``
        self._write_obs: Any = None
        # (observation rows, row shape, dtype) when observations are one array
        self._bulk: tuple[np.ndarray, tuple[int, ...], np.dtype[Any]] | None = None

    def map(self, fd: int, layout: StepLayout, first: int) -> None:
        """Map the shared step file ``fd``, which the parent sized for ``layout``.

        Raises:
            OSError, ValueError: it cannot be mapped.
        """
        self.use(layout, mmap.mmap(fd, layout.nbytes), first)

    def use(self, layout: StepLayout, buffer: Any, first: int) -> None:
        """Write transitions into ``buffer`` (laid out by ``layout``) from row ``first``."""
        self.buffer, self.layout, self.first = buffer, layout, first
        self.arrays = arrays = layout.arrays(buffer)
        self._write_obs = layout.observations.writer(arrays.observations)
        leaves = layout.observations.leaves
        self._bulk = None
        if layout.observations.tree[0] == "leaf" and len(leaves[0].shape) > 1:  # one array
            self._bulk = (arrays.observations, leaves[0].shape[1:], leaves[0].dtype)

    def rows(self, locals_: Any) -> slice | list[int]:
        """The rows of envs ``locals_`` (a range or a sequence of local indices)."""
        first = self.first
        if isinstance(locals_, range):
            return slice(first + locals_.start, first + locals_.stop)
        return [first + j for j in locals_]

    def actions(self, locals_: Any) -> list[Any]:
        """This step's actions of envs ``locals_``, copied out of the rows."""
        assert self.layout is not None
        assert self.layout.actions is not None
        assert self.arrays is not None
        batch = take_rows(self.arrays.actions, self.rows(locals_))
        return self.layout.actions.split(batch, len(locals_))

    def resets(self, locals_: Any) -> list[bool]:
        """This step's reset flags of envs ``locals_``, out of the rows."""
        assert self.arrays is not None
        resets: list[bool] = self.arrays.resets[self.rows(locals_)].tolist()
        return resets

    def write(self, stepped: dict[int, Transition]) -> Written:
        """Write the transitions ``stepped`` (by local index); what is left to say."""
        infos: dict[int, dict[str, Any]] = {}
        finals: dict[int, dict[str, Any]] = {}
        odd: dict[int, Transition] = {}
        if not self._write_together(stepped, infos, finals):
            for j, transition in stepped.items():
                self._write_one(j, transition, infos, finals, odd)
        return infos, finals, odd

    def _write_together(
        self,
        stepped: dict[int, Transition],
        infos: dict[int, dict[str, Any]],
        finals: dict[int, dict[str, Any]],
    ) -> bool:
        """Write every transition at once, if every one fits exactly.

        The common case (each observation an array of the row's shape and dtype,
        exact number and flag types, dict infos) is recognised with loops that
        run in C; anything else returns ``False`` and goes env by env.
        """
        if self._bulk is None or not stepped:
            return False
        observations, row_shape, dtype = self._bulk
        obs, rewards, terminations, truncations, infos_, finals_ = zip(
            *stepped.values(), strict=True
        )
        if not (
            _NUMBERS.issuperset(map(type, rewards))
            and _FLAGS.issuperset(map(type, terminations + truncations))
            and _DICTS.issuperset(map(type, infos_))
            and _ARRAYS.issuperset(map(type, obs))
        ):
            return False
        arrays = self.arrays
        assert arrays is not None
        keys = list(stepped)
        start = self.first + keys[0]
        rows: slice | list[int]
        # Rows joined end to end (``concatenate``: ``stack`` costs 3x).  Each
        # observation's first dimension is checked here; joining them checks the
        # others (a different count of dimensions, or a different size after the
        # first, raises ValueError), and ``casting="no"`` refuses another dtype,
        # all before a byte is written.
        joined_shape = (len(keys) * row_shape[0], *row_shape[1:])
        try:
            if set(map(len, obs)) != {row_shape[0]}:  # len() of a 0-d array: TypeError
                return False
            if keys == list(range(keys[0], keys[0] + len(keys))):
                rows = slice(start, start + len(keys))
                np.concatenate(obs, out=observations[rows].reshape(joined_shape), casting="no")
            else:
                rows = [self.first + j for j in keys]
                joined = np.concatenate(obs)
                if joined.dtype != dtype or joined.shape != joined_shape:
                    return False
                observations[rows] = joined.reshape((len(keys), *row_shape))
        except (TypeError, ValueError):  # another dtype, or another shape
            return False
        arrays.rewards[rows] = rewards
        arrays.terminations[rows] = terminations
        arrays.truncations[rows] = truncations
        if any(infos_):
            infos.update((j, info) for j, info in zip(stepped, infos_, strict=True) if info)
        if any(finals_):
            finals.update((j, f) for j, f in zip(stepped, finals_, strict=True) if f is not None)
        return True

    def _write_one(
        self,
        j: int,
        transition: Transition,
        infos: dict[int, dict[str, Any]],
        finals: dict[int, dict[str, Any]],
        odd: dict[int, Transition],
    ) -> None:
        """Write env ``j``'s transition into its row, or keep it for the reply."""
        obs, reward, terminated, truncated, info, final = transition
        arrays, i = self.arrays, self.first + j
        if (
            arrays is not None
            and type(reward) in _NUMBERS
            and type(terminated) in _FLAGS
            and type(truncated) in _FLAGS
            and type(info) is dict
            and self._write_obs(i, obs)
        ):
            arrays.rewards[i] = reward
            arrays.terminations[i] = terminated
            arrays.truncations[i] = truncated
            if info:
                infos[j] = info
            if final is not None:
                finals[j] = final
        else:
            odd[j] = transition
