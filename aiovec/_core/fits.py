"""Whether observations fit their space, and the check of a call's results.

Theory of operation.  An observation reaches the batch only if it can be
batched: the space's shape and a dtype that casts to the space's
(``same_kind``).  That is checked for every result, always
(`validate.step_result_checker`, `validate.reset_result_checker`), since a
batch cannot be made without it.  Whether its *values* are in the space is
gymnasium's ``Space.contains``; `misfit` names the first part that is not:

- ``Box``: an element below ``low`` or above ``high``, compared after the cast
  the batch makes (a float64 value that rounds into a float32 bound fits: the
  batch holds the rounded value); ``NaN`` never fits, as ``Box.contains`` says;
- ``Discrete``: a value outside ``start .. start + n - 1``;
- ``MultiDiscrete``: an element outside ``start .. start + nvec - 1``;
  ``MultiBinary``: an element other than 0 and 1;
- ``Dict`` and ``Tuple``: the first part that does not fit, named by its key
  path (``observation['agent'][1]``).

The values of any other space (``Text``, ``Graph``, ``Sequence``, a space of the
user's own) are not looked at: as for their shape, gymnasium's batching is the
only rule (and gymnasium's own tests step envs whose observations are not in
such a space, with a ``contains`` that cannot even compare them).

Values cost a pass over every observation, so `ResultCheck` looks at them
where that is cheap: in the results of a vector env's first reset and first
step, and in every call's when the vector env's ``check_observations`` is
``True`` (``False``: never).  Results that came as blocks of rows (a process
worker's shared rows) are checked as blocks, with numpy over their rows
(`rows_fit`), and so are the observations of the other array spaces that
came one by one; an observation is looked at alone only to say what does not
fit, or where each env has a space of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from aiovec._core import validate
from aiovec._core.layout import take_rows
from aiovec._core.rows import Rows, row_of

__all__ = ("ResultCheck", "misfit", "rows_fit")

Checker = Callable[[Mapping[int, Any]], dict[int, Exception]]


def misfit(space: spaces.Space[Any], obs: Any, path: str = "observation") -> str | None:
    """What of ``obs`` is not in ``space`` (see the module), or ``None`` if it fits.

    ``obs`` batches into ``space`` (its shape and dtype were checked); ``path``
    names it in the answer.
    """
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            found = misfit(sub, obs[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(space, spaces.Tuple):
        for k, sub in enumerate(space.spaces):
            found = misfit(sub, obs[k], f"{path}[{k}]")
            if found:
                return found
        return None
    if isinstance(space, _ARRAYS):
        value = _as(space, obs)
        inside = _inside(space, value)
        if inside.all():
            return None
        at = tuple(int(k) for k in np.argwhere(~inside)[0]) if inside.ndim else ()
        where = f"{path}[{', '.join(map(str, at))}]" if at else path
        return f"{where} = {value[at].item()!r} {_outside(space, at, value[at])} ({space})"
    return None  # another space: batched by gymnasium's rules, its values not looked at


def rows_fit(space: spaces.Space[Any], batch: Any) -> np.ndarray:
    """Whether each row of ``batch`` (``space``'s values along a first axis) is in ``space``."""
    if isinstance(space, spaces.Dict):
        parts = [rows_fit(sub, batch[key]) for key, sub in space.spaces.items()]
        return np.logical_and.reduce(parts) if parts else np.ones(0, np.bool_)
    if isinstance(space, spaces.Tuple):
        parts = [rows_fit(sub, batch[k]) for k, sub in enumerate(space.spaces)]
        return np.logical_and.reduce(parts) if parts else np.ones(0, np.bool_)
    if isinstance(space, _ARRAYS):
        inside = _inside(space, _as(space, batch))
        return np.asarray(inside.reshape(len(inside), -1).all(axis=1))
    return np.ones(len(batch), dtype=np.bool_)  # another space: values not looked at


_ARRAYS = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _as(space: Any, value: Any) -> np.ndarray:
    """``value`` as an array to compare with ``space``'s bounds.

    Floats as the batch holds them, in a float space's dtype (a value that
    rounds into a bound fits; one that overflows to inf does not fit a finite
    bound); integers as they are, so that one that a narrower dtype would wrap
    is still out of bounds.
    """
    array = np.asarray(value)
    if array.dtype.kind == "b":  # a bool is the integer 0 or 1 (numpy subtracts no bools)
        return array.astype(np.int64)
    if array.dtype.kind == "f" and space.dtype.kind == "f" and array.dtype != space.dtype:
        with np.errstate(over="ignore"):
            return array.astype(space.dtype)
    return array


def _inside(space: Any, x: np.ndarray) -> np.ndarray:
    """Element by element, whether ``x`` (one value or rows of them) is within ``space``."""
    if isinstance(space, spaces.Box):
        inside = (x >= space.low) & (x <= space.high)  # NaN: False, as Box.contains says
    elif isinstance(space, spaces.MultiBinary):
        inside = (x == 0) | (x == 1)
    else:
        limit = space.nvec if isinstance(space, spaces.MultiDiscrete) else space.n
        inside = (x >= space.start) & (x - space.start < limit)
    return np.asarray(inside, dtype=np.bool_)


def _outside(space: Any, at: tuple[int, ...], value: Any) -> str:
    """How element ``at`` (``value``) of an observation is outside ``space``."""
    if isinstance(space, spaces.Box):
        if np.isnan(value):
            return "is NaN, which no Box holds"
        if value < space.low[at]:
            return f"is below its low bound {space.low[at].item()!r}"
        return f"is above its high bound {space.high[at].item()!r}"
    if isinstance(space, spaces.MultiBinary):
        return "is neither 0 nor 1"
    start = np.asarray(space.start)
    limit = np.asarray(space.nvec if isinstance(space, spaces.MultiDiscrete) else space.n)
    first = (start[at] if start.ndim else start).item()
    last = first + (limit[at] if limit.ndim else limit).item() - 1
    return f"is outside {first!r}..{last!r}"


class ResultCheck:
    """Finds the results of a call that do not batch, or whose observation is not in its space.

    Args:
        observation_spaces: Each env's observation space (their values are
            checked against each env's own, as bounds may differ:
            ``observation_mode="different"``); the first is the single space.
        values: When observations' values are checked (the vector env's
            ``check_observations``): ``None``, the first reset's and the first
            step's results; ``True``, every call's; ``False``, never.
    """

    __slots__ = ("_due", "_per_env", "_reset", "_space", "_step", "values")

    def __init__(self, observation_spaces: Sequence[spaces.Space[Any]], values: bool | None):
        self._space = space = observation_spaces[0]
        self._per_env = None if all(s == space for s in observation_spaces) else observation_spaces
        self._step = validate.step_result_checker(space)
        self._reset: Checker = validate.reset_result_checker(space)
        self.values = values
        self._due = set() if values is False else {"reset", "step"}

    def check(self, results: MutableMapping[int, Any], errors: dict[int, Any], call: str) -> None:
        """Fail the envs whose result of ``call`` is malformed: move them to ``errors``.

        Only a step's and a reset's results are batched, so only they are
        checked.  ``results``: step transitions (by env, or in the blocks of
        `Rows`) or reset ``(observation, info)`` pairs; an env's error is a
        ``ValueError`` or ``TypeError`` saying what is wrong.
        """
        checker = self._step if call == "step" else self._reset if call == "reset" else None
        if checker is None:  # the results of call(), render(), ...: not batched
            return
        singles = results.singles if type(results) is Rows else results
        bad = checker(singles) if singles else {}
        if call in self._due and results:
            if not self.values:
                self._due.discard(call)  # the first call's results only
            bad.update(self._all_values(results, singles, bad, call))
        if not bad:
            return
        if call == "step":
            self._step.forget()  # its clean columns hold envs refused now
        for i, error in bad.items():
            del results[i]
            errors[i] = error

    def clean_columns(
        self, transitions: Mapping[int, Any], order: tuple[int, ...]
    ) -> tuple[validate.Columns, Any] | None:
        """What the last step's check made of ``transitions`` (`StepChecker.clean_columns`)."""
        return self._step.clean_columns(transitions, order)

    def _all_values(
        self,
        results: Mapping[int, Any],
        singles: Mapping[int, Any],
        bad: Mapping[int, Exception],
        call: str,
    ) -> dict[int, Exception]:
        """The envs whose observation is not in its space, of those not ``bad`` already."""
        fine = [i for i in singles if i not in bad]
        found = self._values(fine, [singles[i][0] for i in fine], call)
        if type(results) is Rows:
            for envs, block in results.block_rows():
                observations = take_rows(block.arrays.observations, envs)
                found.update(self._values(envs, observations, call, batched=True))
        return found

    def _values(
        self, envs: Sequence[int], observations: Any, call: str, *, batched: bool = False
    ) -> dict[int, Exception]:
        """``ValueError`` for each of ``envs`` whose observation is not in its space.

        ``observations``: one per env, or (``batched``) their batch.
        """
        if not len(envs):
            return {}
        space = self._space
        if self._per_env is not None:
            suspects: Sequence[int] = envs  # each against its own space
        elif batched or isinstance(space, _ARRAYS):  # at once, with numpy
            fit = rows_fit(space, observations)
            suspects = [i for i, ok in zip(envs, fit.tolist(), strict=True) if not ok]
        else:
            suspects = envs
        row = dict(zip(envs, range(len(envs)), strict=True))
        found: dict[int, Exception] = {}
        for i in suspects:
            obs = row_of(observations, row[i]) if batched else observations[row[i]]
            own = space if self._per_env is None else self._per_env[i]
            what = misfit(own, obs, f"the {call} result's observation")
            if what is not None:
                found[i] = ValueError(
                    f"{what}; aiovec checks observations against the space on the first reset "
                    "and step (check_observations=True: every call, False: never)"
                )
        return found
