"""Layouts: where each env's step data lives in one flat shared buffer.

The process backend keeps the step data of every env (actions, observations,
rewards, both flags) in one shared-memory block, so that a step costs one short
message per worker instead of pickled arrays.  This module is the pure part of
that: it lays a batched space's arrays out in a buffer (a *layout*), builds
numpy views of them on any buffer, writes one env's value into its row, and
copies rows out.  The buffer itself (and who owns it) is the backend's business.

Only spaces whose batch is made of fixed-shape numpy arrays are laid out:
``Box``, ``Discrete``, ``MultiDiscrete``, ``MultiBinary``, and ``Dict``/``Tuple``
of them; `Layout.of` returns ``None`` for any other space, and its values
travel by message.  The array of each leaf is what gymnasium's
``create_empty_array`` makes for that space (same shape, same dtype).

A row is written only when the value fits exactly (an ndarray of the leaf's
shape and dtype, an integer for ``Discrete``); anything else makes
`Layout.write` return ``False``, and the caller sends the value by message
instead, where the usual batching rules (and their errors) apply.  Shared memory
is a fast path, never a second set of rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

__all__ = ("EVERY", "Filler", "Layout", "StepArrays", "StepLayout", "copy_rows", "take_rows")

_ALIGN = 64  # every array starts on a cache line
_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)

Tree = tuple[Any, ...]
"""``("leaf", k)``, ``("dict", ((key, tree), ...))`` or ``("tuple", (tree, ...))``."""


class Leaf(NamedTuple):
    """One array of a layout: ``shape`` is batched (envs first)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int
    scalar: bool  # a Discrete space: each env's value is an integer, not an array

    @property
    def nbytes(self) -> int:
        """Bytes the array takes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


EVERY = slice(None)
"""Every row (the default rows of a `Layout.filler`)."""


class Filler(Protocol):
    """A compiled `Layout.filler`: writes a batch into some rows, ``False`` if it does not fit."""

    def __call__(self, value: Any, rows: slice | list[int] = ..., /) -> bool: ...


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class Layout(NamedTuple):
    """A batched space's arrays at fixed offsets of a flat buffer (picklable)."""

    tree: Tree
    leaves: tuple[Leaf, ...]
    end: int  # the first byte after the last array

    @classmethod
    def of(cls, space: spaces.Space[Any], num_envs: int, start: int = 0) -> Layout | None:
        """Lay out ``num_envs`` values of ``space`` from byte ``start``; ``None`` if it can't be."""
        leaves: list[Leaf] = []
        end = [start]

        def place(space: spaces.Space[Any]) -> Tree | None:
            if isinstance(space, spaces.Dict):
                items = [(key, place(sub)) for key, sub in space.spaces.items()]
                if any(tree is None for _, tree in items):
                    return None
                return ("dict", tuple(items))
            if isinstance(space, spaces.Tuple):
                trees = [place(sub) for sub in space.spaces]
                if any(tree is None for tree in trees):
                    return None
                return ("tuple", tuple(trees))
            if not isinstance(space, _ARRAY_SPACES):
                return None
            array: np.ndarray = create_empty_array(space, n=num_envs, fn=np.zeros)  # type: ignore[assignment]
            offset = _aligned(end[0])
            leaf = Leaf(array.shape, array.dtype, offset, isinstance(space, spaces.Discrete))
            end[0] = offset + leaf.nbytes
            leaves.append(leaf)
            return ("leaf", len(leaves) - 1)

        tree = place(space)
        if tree is None:
            return None
        return cls(tree, tuple(leaves), end[0])

    def views(self, buffer: Any) -> Any:
        """The batched value (nested dicts/tuples of arrays) as views of ``buffer``."""
        arrays = [
            np.ndarray(leaf.shape, leaf.dtype, buffer=buffer, offset=leaf.offset)
            for leaf in self.leaves
        ]

        def build(tree: Tree) -> Any:
            kind, content = tree
            if kind == "leaf":
                return arrays[content]
            if kind == "dict":
                return {key: build(sub) for key, sub in content}
            return tuple(build(sub) for sub in content)

        return build(self.tree)

    def writer(self, views: Any) -> Callable[[int, Any], bool]:
        """A function writing one env's value into its row of ``views``.

        It returns ``False`` (and the row may be partly written) when the
        value does not fit exactly; the caller then sends it by message.
        """

        def compile_(tree: Tree, target: Any) -> Callable[[int, Any], bool]:
            kind, content = tree
            if kind == "dict":
                parts = [(key, compile_(sub, target[key])) for key, sub in content]

                def write_dict(i: int, value: Any) -> bool:
                    if not isinstance(value, dict):
                        return False
                    return all(key in value and put(i, value[key]) for key, put in parts)

                return write_dict
            if kind == "tuple":
                items = [compile_(sub, target[k]) for k, sub in enumerate(content)]
                size = len(items)

                def write_tuple(i: int, value: Any) -> bool:
                    if not isinstance(value, tuple) or len(value) != size:
                        return False
                    return all(put(i, v) for put, v in zip(items, value, strict=True))

                return write_tuple
            leaf = self.leaves[content]
            return _leaf_writer(leaf, target)

        return compile_(self.tree, views)

    def filler(self, views: Any) -> Filler:
        """A function writing a batch into some rows of ``views``, compiled once.

        ``fill(value, rows)`` writes ``value`` (a batch of ``len(rows)``) into
        ``rows`` (`EVERY`, the default: every row).  It writes exact shapes and
        dtypes only, and returns ``False`` (maybe having written part of it)
        for a batch that does not fit.
        """

        def compile_(tree: Tree, target: Any) -> Filler:
            kind, content = tree
            if kind == "leaf":
                shape, row_shape, dtype = target.shape, target.shape[1:], target.dtype

                def fill_leaf(value: Any, rows: slice | list[int] = EVERY) -> bool:
                    if type(value) is not np.ndarray or value.dtype != dtype:
                        return False
                    if type(rows) is slice:
                        if value.shape != shape:
                            return False
                        target[...] = value
                    else:
                        if value.shape[1:] != row_shape or len(value) != len(rows):
                            return False
                        target[rows] = value
                    return True

                return fill_leaf
            if kind == "dict":
                parts = [(key, compile_(sub, target[key])) for key, sub in content]

                def fill_dict(value: Any, rows: slice | list[int] = EVERY) -> bool:
                    return isinstance(value, dict) and all(
                        key in value and put(value[key], rows) for key, put in parts
                    )

                return fill_dict
            items = [compile_(sub, target[k]) for k, sub in enumerate(content)]
            size = len(items)

            def fill_tuple(value: Any, rows: slice | list[int] = EVERY) -> bool:
                return (
                    isinstance(value, tuple)
                    and len(value) == size
                    and all(put(v, rows) for put, v in zip(items, value, strict=True))
                )

            return fill_tuple

        return compile_(self.tree, views)

    def split(self, batch: Any, count: int) -> list[Any]:
        """Each env's value out of a batch of ``count`` (as gymnasium's ``iterate`` gives them)."""

        def parts(tree: Tree, value: Any) -> list[Any]:
            kind, content = tree
            if kind == "leaf":
                return list(value)
            if kind == "dict":
                columns = [(key, parts(sub, value[key])) for key, sub in content]
                return [{key: column[e] for key, column in columns} for e in range(count)]
            columns_ = [parts(sub, value[k]) for k, sub in enumerate(content)]
            return [tuple(column[e] for column in columns_) for e in range(count)]

        return parts(self.tree, batch)


def _leaf_writer(leaf: Leaf, array: np.ndarray) -> Callable[[int, Any], bool]:
    row_shape, dtype = leaf.shape[1:], leaf.dtype
    if leaf.scalar:

        def write_scalar(i: int, value: Any) -> bool:
            if not isinstance(value, int | np.integer):
                return False
            try:
                array[i] = value
            except (OverflowError, ValueError):
                return False
            return True

        return write_scalar

    def write_array(i: int, value: Any) -> bool:
        if type(value) is not np.ndarray or value.shape != row_shape or value.dtype != dtype:
            return False
        array[i] = value
        return True

    return write_array


def copy_rows(
    target: Any,
    source: Any,
    rows: slice | list[int],
    source_rows: slice | list[int] | None = None,
) -> None:
    """Copy ``rows`` of a batched value into the same rows of another (same structure).

    ``source_rows``, if given, are the rows to read instead (as many as ``rows``).
    """
    if source_rows is None:
        source_rows = rows
    if isinstance(source, np.ndarray):
        target[rows] = source[source_rows]
    elif isinstance(source, dict):
        for key, value in source.items():
            copy_rows(target[key], value, rows, source_rows)
    else:
        for t, s in zip(target, source, strict=True):
            copy_rows(t, s, rows, source_rows)


def take_rows(source: Any, rows: slice | list[int]) -> Any:
    """A copy of ``rows`` of a batched value (nested dicts/tuples of arrays)."""
    if isinstance(source, np.ndarray):
        return source[rows].copy()
    if isinstance(source, dict):
        return {key: take_rows(value, rows) for key, value in source.items()}
    return tuple(take_rows(value, rows) for value in source)


class StepLayout(NamedTuple):
    """Everything a step exchanges through shared memory, in one buffer.

    ``actions`` is ``None`` when the action space cannot be laid out (actions
    then travel by message); observations always can (else no shared memory
    is used at all).
    """

    observations: Layout
    actions: Layout | None
    rewards: Leaf
    terminations: Leaf
    truncations: Leaf
    resets: Leaf  # per env: this step resets it first (``NEXT_STEP`` autoreset)

    @classmethod
    def of(
        cls,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
    ) -> StepLayout | None:
        """The layout of a vector env's step data, or ``None`` if observations can't be laid out."""
        observations = Layout.of(observation_space, num_envs)
        if observations is None:
            return None
        actions = Layout.of(action_space, num_envs, observations.end)
        end = observations.end if actions is None else actions.end
        leaves = []
        for dtype in (np.float64, np.bool_, np.bool_, np.bool_):
            leaf = Leaf((num_envs,), np.dtype(dtype), _aligned(end), False)
            end = leaf.offset + leaf.nbytes
            leaves.append(leaf)
        return cls(observations, actions, *leaves)

    @property
    def nbytes(self) -> int:
        """The size of the buffer."""
        return self.resets.offset + self.resets.nbytes

    def arrays(self, buffer: Any) -> StepArrays:
        """Views of every part of the layout on ``buffer``."""

        def flat(leaf: Leaf) -> np.ndarray:
            return np.ndarray(leaf.shape, leaf.dtype, buffer=buffer, offset=leaf.offset)

        return StepArrays(
            self.observations.views(buffer),
            None if self.actions is None else self.actions.views(buffer),
            flat(self.rewards),
            flat(self.terminations),
            flat(self.truncations),
            flat(self.resets),
        )


class StepArrays(NamedTuple):
    """Numpy views of a `StepLayout` on one buffer."""

    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    resets: np.ndarray
