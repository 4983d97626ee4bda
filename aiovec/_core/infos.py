"""Info merging: per-env info dicts in, gymnasium's batched infos out, one key at a time.

gymnasium's ``VectorEnv._add_info`` merges one env's info into the batch at a
time: per env and key it looks the key up, picks or makes its array and mask,
and assigns one element: the largest part of a cheap waiting env-step.
`merge_infos` builds each key's array and ``_key`` mask once for all the envs
that have it, and gives exactly
``_add_info``'s result, applied env by env in the order given:

- the array's dtype comes from the first value's type, as gymnasium picks it:
  ``int``/``float``/``bool`` and numpy number scalars give that dtype,
  ``np.ndarray`` values a ``(num_envs, *shape)`` array of theirs, anything
  else an object array; envs without the key keep zero (``None``);
- ``"final_obs"`` is always an object array; dict values merge recursively;
- a key whose values all share one scalar type is written in one vectorised
  assignment; other values are assigned one by one, with gymnasium's own
  ``array[i] = value`` (so a later value is cast to the first one's dtype).

Where gymnasium's result depends on its env-by-env order in ways a per-key
merge would not reproduce (a key ``k`` next to a key ``"_k"``, whose mask it
would overwrite; a key that is a dict in some envs and not in others; a
non-string key; one env giving the same key twice; or an assignment that
fails), the whole merge falls back to ``_add_info`` env by env, which then
also raises gymnasium's own error.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from gymnasium.vector import VectorEnv

__all__ = ("merge_infos", "merge_infos_one_by_one")

Entry = tuple[int, dict[str, Any]]
_SCALARS = (int, float, bool)


class _InfoMerger:
    """Holds ``num_envs`` so that gymnasium's ``_add_info`` can run on it unchanged."""

    __slots__ = ("num_envs",)
    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


class _Irregular(Exception):
    """The infos need gymnasium's env-by-env merge to come out the same."""


def merge_infos(num_envs: int, entries: Sequence[Entry]) -> dict[str, Any]:
    """Batch per-env infos as gymnasium's ``VectorEnv._add_info`` would, env by env.

    Args:
        num_envs: Rows of the batch (the length of every array and mask).
        entries: ``(row, info)`` pairs in the order ``_add_info`` would merge
            them (an env may have two: its final info, then its info).

    Returns:
        The batched infos (``{}`` when there are none).
    """
    if not entries:
        return {}
    try:
        return _merge_level(num_envs, entries)
    except Exception:
        return merge_infos_one_by_one(num_envs, entries)


def merge_infos_one_by_one(num_envs: int, entries: Sequence[Entry]) -> dict[str, Any]:
    """The reference: gymnasium's ``VectorEnv._add_info``, applied entry by entry."""
    add_info = cast(Any, _InfoMerger(num_envs))._add_info
    infos: dict[str, Any] = {}
    for i, info in entries:
        infos = add_info(infos, info, i)
    return infos


def _merge_level(num_envs: int, entries: Sequence[Entry]) -> dict[str, Any]:
    """One level of (possibly nested) infos; raises `_Irregular` to fall back."""
    by_key = _columns(entries)
    merged: dict[str, Any] = {}
    for key, (rows, values) in by_key.items():
        if type(key) is not str or "_" + key in by_key:
            raise _Irregular
        every_row = len(rows) == num_envs and rows[0] == 0 and rows[-1] == num_envs - 1
        merged[key] = _merge_key(num_envs, key, rows, values, every_row)
        if every_row:
            merged["_" + key] = np.ones(num_envs, dtype=np.bool_)
        else:
            mask = np.zeros(num_envs, dtype=np.bool_)
            mask[rows] = True
            merged["_" + key] = mask
    return merged


def _columns(entries: Sequence[Entry]) -> dict[str, tuple[list[int], list[Any]]]:
    """Per key, in order of first appearance: the rows that have it, and their values.

    Each key's rows come out strictly ascending (else `_Irregular`).
    """
    rows, infos = zip(*entries, strict=True)
    keys = infos[0].keys()
    if all(info.keys() == keys for info in infos) and all(map(operator.lt, rows, rows[1:])):
        # The usual case, every env with the same keys: one column per key.
        return {key: (list(rows), [info[key] for info in infos]) for key in keys}
    by_key: dict[str, tuple[list[int], list[Any]]] = {}
    for i, info in entries:
        for key, value in info.items():
            slot = by_key.get(key)
            if slot is None:
                by_key[key] = ([i], [value])
            elif slot[0][-1] < i:
                slot[0].append(i)
                slot[1].append(value)
            else:  # the same env twice (or rows out of order): keep gymnasium's order
                raise _Irregular
    return by_key


def _merge_key(num_envs: int, key: str, rows: list[int], values: list[Any], every_row: bool) -> Any:
    """The batched value of one key, given the rows that have it (ascending) and their values."""
    first = values[0]
    types = set(map(type, values))
    array: np.ndarray
    if key == "final_obs":
        array = np.full(num_envs, fill_value=None, dtype=object)
    elif any(issubclass(t, dict) for t in types):
        if not all(issubclass(t, dict) for t in types):
            raise _Irregular  # gymnasium would write into whichever came first
        return _merge_level(num_envs, list(zip(rows, values, strict=True)))
    else:
        kind = type(first)
        if kind in _SCALARS or issubclass(kind, np.number):
            dtype = np.dtype(kind)
            if len(types) == 1 and dtype.kind in "biufc":
                if every_row:
                    return np.array(values, dtype=dtype)
                array = np.zeros(num_envs, dtype=dtype)
                array[rows] = np.array(values, dtype=dtype)
                return array
            array = np.zeros(num_envs, dtype=kind)
        elif isinstance(first, np.ndarray):
            array = np.zeros((num_envs, *first.shape), dtype=first.dtype)
        else:
            array = np.full(num_envs, fill_value=None, dtype=object)
    for i, value in zip(rows, values, strict=True):
        array[i] = value
    return array
