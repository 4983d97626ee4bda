"""Batching: per-env results in, gymnasium's batched form out.

Observations are concatenated with ``gymnasium.vector.utils.concatenate``,
actions split with ``iterate``, and infos merged one key at a time into
exactly what gymnasium's own ``VectorEnv._add_info`` gives env by env
(`aiovec._core.infos`), so the batched form is gymnasium's.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from aiovec._core.calls import Transition
from aiovec._core.infos import merge_infos
from aiovec._core.layout import StepArrays, copy_rows
from aiovec._core.rows import Rows, StepBlock
from aiovec._core.validate import Columns, action_checker

__all__ = ("Batcher", "StepBatch", "copy_batch", "stack_box")

StepBatch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]

_NO_INFO: dict[str, Any] = {}
"""The info of a row without one, under `Batcher.infos_per_env` (never modified)."""


def stack_box(items: Sequence[Any], shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``np.stack(items, out=buffer)`` for a ``Box`` space, as a fresh array.

    gymnasium's ``concatenate`` stacks into a preallocated buffer (and a copy is
    then needed for ``copy=True``); ``np.stack`` builds a view per item in
    Python, a third of a cheap env-step (docs/performance.md).  ``np.asarray`` builds
    the same batch in C.  Results and errors are those of ``np.stack(out=...)``
    (tested against gymnasium's ``concatenate``): a wrong shape raises
    ``ValueError``, a cast that ``same_kind`` casting forbids ``TypeError``.
    """
    array = np.asarray(items)
    if array.shape != shape:
        raise ValueError(
            f"observations must each have shape {shape[1:]} to batch into {shape}; "
            f"together they have shape {array.shape}"
        )
    if array.dtype != dtype:
        if not np.can_cast(array.dtype, dtype, "same_kind"):
            raise TypeError(
                f"Cannot cast array data from {array.dtype!r} to {dtype!r} according to the "
                "rule 'same_kind' (the observation space's dtype)"
            )
        array = array.astype(dtype)
    return array


def copy_batch(value: Any) -> Any:
    """A copy of a batched observation that shares no memory with ``value``."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: copy_batch(v) for k, v in value.items()}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(copy_batch(v) for v in value)
    return copy_module.deepcopy(value)


class Batcher:
    """Turns per-env results into batched results for one vector env.

    Args:
        observation_space: The single observation space.
        action_space: The single action space.
        num_envs: How many envs.
        copy: Return observations that later calls never modify (else views of
            a reused buffer).
        batched_observation_space: The batched observation space, when it is
            not ``num_envs`` copies of ``observation_space`` (envs whose
            spaces differ in bounds: ``observation_mode``).
    """

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
        copy: bool,
        batched_observation_space: spaces.Space[Any] | None = None,
    ) -> None:
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = batched_observation_space or batch_space(
            observation_space, num_envs
        )
        self.action_space = batch_space(action_space, num_envs)
        self.num_envs = num_envs
        self.copy = copy
        self._buffer: Any = create_empty_array(observation_space, n=num_envs, fn=np.zeros)
        self._env_obs: list[Any] = [None] * num_envs
        # After a step that came in shared-memory blocks, each env's last observation
        # is a row of this private batch; ``_env_obs`` is refreshed from it when needed.
        self._block_obs: Any = None
        self._block_obs_current = False
        # gymnasium's implementations for these spaces, resolved once (not per call)
        self._concatenate = concatenate.dispatch(type(observation_space))
        self._iterate = iterate.dispatch(type(self.action_space))
        self._check_actions = action_checker(action_space, num_envs)
        self._subset_spaces: dict[int, spaces.Space[Any]] = {}  # batched, by count
        self._box = type(observation_space) is spaces.Box
        self.infos_per_env = False
        """Give step and receive infos as one dict per row (see `infos_of`), not batched."""

    # -- actions ---------------------------------------------------------------

    def split_actions(
        self, actions: Any, count: int | None = None, *, checked: bool = False
    ) -> Sequence[Any]:
        """Check a batch of actions (one per env, or ``count``) and split it per env.

        ``checked``: the caller checked them already (the collector, which names
        its policy in the error).  A whole batch is split only when a backend
        first reads the result (a process backend that copies the batch into
        shared memory never does).
        """
        if count is None or count == self.num_envs:
            if not checked:
                self._check_actions(actions)
            return PerEnv(self._iterate, self.action_space, actions)
        if not checked:
            action_checker(self.single_action_space, count)(actions)
        space = self._subset_spaces.get(count)
        if space is None:
            space = self._subset_spaces[count] = batch_space(self.single_action_space, count)
        return PerEnv(self._iterate, space, actions)

    # -- results ---------------------------------------------------------------

    def reset_batch(
        self, indices: Sequence[int], results: Mapping[int, tuple[Any, dict[str, Any]]]
    ) -> tuple[Any, dict[str, Any]]:
        """Batch the ``(obs, info)`` of the envs in ``indices`` (others keep their last obs)."""
        env_obs = self._last_observations()
        entries: list[tuple[int, dict[str, Any]]] = []
        for i in indices:
            obs, info = results[i]
            env_obs[i] = obs
            entries.append((i, info))
        return self._observations(), merge_infos(self.num_envs, entries)

    def step_batch(
        self,
        indices: Sequence[int],
        results: Mapping[int, Transition],
        clean: tuple[Columns, Any] | None = None,
    ) -> StepBatch:
        """Batch the transitions of every env (``indices`` is ``range(num_envs)``).

        ``clean``: what the step-result check made of ``results``, in env order
        (`StepChecker.clean_columns`): the transitions transposed, and a ``Box``
        space's observations stacked (else ``None``).
        """
        stacked = None
        if clean is not None:
            (obs, rewards, terminations, truncations, infos_, finals), stacked = clean
        elif type(results) is Rows and (blocks := results.blocks_covering(self.num_envs)):
            return self._step_blocks(blocks)
        else:  # transpose in C (zip), then touch per env only what needs Python
            obs, rewards, terminations, truncations, infos_, finals = zip(
                *map(results.__getitem__, indices), strict=True
            )
        self._block_obs_current = False  # every env's last observation is in ``obs``
        self._env_obs[:] = obs
        infos: Any = {}
        if any(infos_) or any(finals):  # many envs return no info at all
            infos = self.infos_of(self.num_envs, zip(indices, infos_, finals, strict=True))
        elif self.infos_per_env:
            infos = [_NO_INFO] * self.num_envs
        if stacked is None:
            buffer = self._buffer
            stacked = (
                stack_box(obs, buffer.shape, buffer.dtype) if self._box else self._observations()
            )
        return (
            stacked,
            np.array(rewards, dtype=np.float64),
            np.array(terminations, dtype=np.bool_),
            np.array(truncations, dtype=np.bool_),
            infos,
        )

    def subset_batch(
        self,
        indices: Sequence[int],
        results: Mapping[int, Transition],
        clean: tuple[Columns, Any] | None = None,
    ) -> StepBatch:
        """Batch the transitions of some envs: row ``k`` is env ``indices[k]``.

        ``clean``: as for `step_batch`, when ``indices`` are every env.
        """
        if len(indices) == self.num_envs and list(indices) == list(range(self.num_envs)):
            return self.step_batch(indices, results, clean)
        rows = len(indices)
        if not rows:
            empty: Any = create_empty_array(self.single_observation_space, n=0, fn=np.zeros)
            no = np.zeros(0, dtype=np.bool_)
            return empty, np.zeros(0, dtype=np.float64), no, no.copy(), {}
        if self._box and type(results) is Rows:
            arrays = results.shared_arrays()
            if arrays is not None:  # every row in one shared buffer: copy them out at once
                return self._subset_rows(indices, results, arrays)
        obs, rewards, terminations, truncations, infos_, finals = zip(
            *map(results.__getitem__, indices), strict=True
        )
        env_obs = self._last_observations()
        for i, o in zip(indices, obs, strict=True):
            env_obs[i] = o
        infos = self.infos_of(rows, zip(range(rows), infos_, finals, strict=True))
        space = self.single_observation_space
        batch: Any
        if self._box:
            batch = stack_box(obs, (rows, *self._buffer.shape[1:]), self._buffer.dtype)
        else:
            out: Any = create_empty_array(space, n=rows, fn=np.zeros)
            batch = concatenate(space, obs, out)
        return (
            batch,
            np.array(rewards, dtype=np.float64),
            np.array(terminations, dtype=np.bool_),
            np.array(truncations, dtype=np.bool_),
            infos,
        )

    def _subset_rows(self, indices: Sequence[int], results: Rows, arrays: StepArrays) -> StepBatch:
        """`subset_batch` of Box observations whose rows are all in ``arrays`` (by env index)."""
        rows = list(indices)
        batch = arrays.observations[rows]  # fancy indexing: a copy
        self._keep_rows(rows, batch)
        extras = results.extras(rows)
        return (
            batch,
            arrays.rewards[rows],
            arrays.terminations[rows],
            arrays.truncations[rows],
            self.infos_of(len(rows), extras) if extras or self.infos_per_env else {},
        )

    def _step_blocks(self, blocks: Sequence[StepBlock]) -> StepBatch:
        """Batch a step whose every env came in shared-memory blocks: whole rows at once."""
        n = self.num_envs
        if self._block_obs is None:
            self._block_obs = create_empty_array(self.single_observation_space, n=n, fn=np.zeros)
        observations = self._block_obs
        shared = blocks[0].arrays
        if len(blocks) == 1 or all(block.arrays is shared for block in blocks):  # one buffer
            rewards = shared.rewards.copy()
            terminations = shared.terminations.copy()
            truncations = shared.truncations.copy()
            if self._box:
                np.copyto(observations, shared.observations)
            else:
                copy_rows(observations, shared.observations, slice(None))
        else:
            rewards = np.empty(n, dtype=np.float64)
            terminations = np.empty(n, dtype=np.bool_)
            truncations = np.empty(n, dtype=np.bool_)
            for block in blocks:
                envs, arrays = block.envs, block.arrays
                rows: slice | list[int] = (
                    slice(envs.start, envs.stop) if isinstance(envs, range) else list(envs)
                )
                rewards[rows] = arrays.rewards[rows]
                terminations[rows] = arrays.terminations[rows]
                truncations[rows] = arrays.truncations[rows]
                copy_rows(observations, arrays.observations, rows)
        extras: list[tuple[int, dict[str, Any] | None, dict[str, Any] | None]] = []
        for block in blocks:
            if block.infos or block.finals:
                extras.extend(
                    (i, block.infos.get(i), block.finals.get(i))
                    for i in sorted({*block.infos, *block.finals})
                )
        infos: Any = {}
        if extras or self.infos_per_env:
            extras.sort(key=lambda extra: extra[0])
            infos = self.infos_of(n, extras)
        self._block_obs_current = True
        if not self.copy:
            return observations, rewards, terminations, truncations, infos
        batch = observations.copy() if self._box else copy_batch(observations)
        return batch, rewards, terminations, truncations, infos

    def infos_of(
        self, count: int, rows: Iterable[tuple[int, dict[str, Any] | None, dict[str, Any] | None]]
    ) -> Any:
        """The infos of a step's ``count`` rows, from ``(row, info, final)`` in row order.

        Rows left out have neither an info nor a final.  Batched as gymnasium
        batches them (`merge_infos`), or, with `infos_per_env`, one dict per
        row: the env's own info (not a copy; the same empty dict for every row
        without one), with ``final_obs`` and ``final_info`` added where it was
        reset within the step (``SAME_STEP``), the keys gymnasium's infos of that
        row hold.  The SB3 adapter wants them so (it owns its vector env).
        """
        if not self.infos_per_env:
            return merge_infos(count, _info_entries(rows))
        per_env: list[dict[str, Any]] = [_NO_INFO] * count
        for row, info, final in rows:
            if final is not None:
                per_env[row] = {**(info or {}), **final}
            elif info:
                per_env[row] = info
        return per_env

    def _keep_rows(self, rows: list[int], batch: np.ndarray) -> None:
        """Keep ``batch`` (Box observations of envs ``rows``) as those envs' last observations.

        Into the private block batch, at once, not env by env: it becomes (or
        stays) where every env's last observation is (see `_last_observations`).
        """
        if not self._block_obs_current:
            if any(obs is None for obs in self._env_obs):  # some env was never reset
                env_obs = self._env_obs
                for k, i in enumerate(rows):
                    env_obs[i] = batch[k].copy()
                return
            self._block_obs = stack_box(self._env_obs, self._buffer.shape, self._buffer.dtype)
            self._block_obs_current = True
        self._block_obs[rows] = batch

    def _last_observations(self) -> list[Any]:
        """Each env's last observation (refreshed from a block step's batch if one came last)."""
        if self._block_obs_current:
            self._env_obs[:] = iterate(self.observation_space, copy_batch(self._block_obs))
            self._block_obs_current = False
        return self._env_obs

    def _observations(self) -> Any:
        if self._box:  # a fresh array: nothing to copy, nothing shared
            return stack_box(self._env_obs, self._buffer.shape, self._buffer.dtype)
        self._buffer = self._concatenate(self.single_observation_space, self._env_obs, self._buffer)
        buffer = self._buffer
        if not self.copy:
            return buffer
        return buffer.copy() if type(buffer) is np.ndarray else copy_batch(buffer)

    def gather(self, indices: Sequence[int], results: Mapping[int, Any]) -> tuple[Any, ...]:
        """Per-env results of a broadcast call, as a tuple ordered by env index."""
        return tuple(results[i] for i in indices)


class PerEnv(Sequence[Any]):
    """The actions of a checked batch, one per env, split out on first use."""

    __slots__ = ("_batch", "_items", "_iterate", "_space")

    def __init__(self, iterate_: Any, space: spaces.Space[Any], batch: Any) -> None:
        self._iterate, self._space, self._batch = iterate_, space, batch
        self._items: list[Any] | None = None

    def _values(self) -> list[Any]:
        if self._items is None:
            self._items = list(self._iterate(self._space, self._batch))
        return self._items

    @overload
    def __getitem__(self, k: int) -> Any: ...
    @overload
    def __getitem__(self, k: slice) -> list[Any]: ...
    def __getitem__(self, k: int | slice) -> Any:
        return self._values()[k]

    def __len__(self) -> int:
        return len(self._values())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values())

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (self._values(),)


def _info_entries(
    rows: Iterable[tuple[int, dict[str, Any] | None, dict[str, Any] | None]],
) -> list[tuple[int, dict[str, Any]]]:
    """``(row, info)`` in gymnasium's merge order: each row's final info, then its info.

    Args:
        rows: ``(row, info, final_info)`` per row, rows in ascending order.
    """
    entries: list[tuple[int, dict[str, Any]]] = []
    for row, info, final in rows:
        if final is not None:
            entries.append((row, final))
        if info:
            entries.append((row, info))
    return entries
