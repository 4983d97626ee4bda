"""Trajectory segments: rows of partial steps turned into what a learner consumes.

`SegmentBook` keeps, per env, the segment being filled (preallocated arrays
of shape ``(num_envs, segment_length, ...)``, written a whole ``recv()`` at a
time with numpy's fancy indexing) and the queue of finished segments.  It
knows nothing of how rows arrive: the collector tells it what each env was
shown (`observed`), what the policy chose (`acted`) and what the step gave
(`stepped`); it never sees a reset row.  Observations and actions of any
gymnasium space are nested dicts/tuples of arrays (``create_empty_array``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_empty_array

__all__ = ("Book", "SegmentBatch", "SegmentBook", "as_tree", "row_infos", "tree_map")


def tree_map(fn: Callable[..., Any], tree: Any, *others: Any) -> Any:
    """``fn`` over the arrays of nested dicts/tuples (the same structure in ``others``)."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(o[k] for o in others)) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, *parts) for parts in zip(tree, *others, strict=True))
    return fn(tree, *others)


def _empty(space: spaces.Space[Any], shape: tuple[int, ...]) -> Any:
    """Zeros of ``space``'s batched form, with leading axes ``shape``.

    Dict and Tuple spaces nest; a space gymnasium batches as a tuple of items
    (Text, Graph, Sequence) is an object array.
    """
    if isinstance(space, spaces.Dict):
        return {k: _empty(sub, shape) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_empty(sub, shape) for sub in space.spaces)
    flat = create_empty_array(space, n=int(np.prod(shape)), fn=np.zeros)
    if not isinstance(flat, np.ndarray):
        return np.empty(shape, dtype=object)
    return flat.reshape(*shape, *flat.shape[1:])


def as_tree(space: spaces.Space[Any], batch: Any) -> Any:
    """A batch of ``space`` as nested dicts/tuples of arrays (an item tuple -> an object array)."""
    if isinstance(space, spaces.Dict):
        return {k: as_tree(sub, batch[k]) for k, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(as_tree(sub, part) for sub, part in zip(space.spaces, batch, strict=True))
    if isinstance(batch, np.ndarray):
        return batch
    items = np.empty(len(batch), dtype=object)
    items[:] = list(batch)
    return items


def row_infos(infos: Mapping[str, Any], rows: int) -> list[dict[str, Any]]:
    """Per-row info dicts out of gymnasium's batched infos (keys with their ``_key`` masks)."""
    out: list[dict[str, Any]] = [{} for _ in range(rows)]
    for key, values in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        per_row = row_infos(values, rows) if isinstance(values, dict) else values
        for k in range(rows) if mask is None else np.flatnonzero(mask).tolist():
            out[k][key] = per_row[k]
    return out


@dataclass(frozen=True, slots=True)
class SegmentBatch:
    """``batch_size`` segments of ``segment_length`` consecutive transitions, one env each.

    Every array is shaped ``(batch_size, segment_length, ...)`` (nested
    dicts/tuples for Dict/Tuple spaces), except ``env_ids``: ``(batch_size,)``.

    Attributes:
        obs: The observation each action was chosen for.
        actions: The actions taken.
        rewards: ``float64`` rewards.
        terminations: Whether the episode terminated at that step.
        truncations: Whether it was truncated (a restart truncates too).
        next_obs: The observation after the step; the episode's final
            observation where it ended (bootstrap a truncation from it).
        versions: The version of the policy that chose each action.
        env_ids: The env each segment comes from.
        extras: The policy's extras (``log_prob``, ``value``, ...), by name.
        infos: The steps' infos in gymnasium's format: ``infos[key]`` an
            object array ``(batch_size, segment_length)``, ``infos["_key"]``
            its mask (a restarted env's step has ``"error"``).
    """

    obs: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    next_obs: Any
    versions: np.ndarray
    env_ids: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    infos: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(slots=True)
class _Finished:
    """Segments that finished together: row ``k`` of each array is one segment."""

    env_ids: np.ndarray
    arrays: dict[str, Any]
    infos: list[dict[int, dict[str, Any]]]
    oldest: np.ndarray  # each segment's lowest policy version


class Book:
    """What a collector's driver tells a book, and what every env shows now.

    The seam between the driver and where rows go (`SegmentBook`, or
    `aiovec._core.episodes.EpisodeBook`): the driver tells a book what each
    env was shown (`observed`), what the policy chose (``acted``) and what the
    step gave (``stepped``); the book shows the policy its input (`shown`).
    """

    def __init__(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any], num_envs: int
    ) -> None:
        self.action_space = action_space
        self.num_envs = num_envs
        self.last_obs = _empty(observation_space, (num_envs,))

    def observed(self, ids: np.ndarray, obs: Any) -> None:
        """Envs ``ids`` now show ``obs`` (rows in the order of ``ids``)."""
        tree_map(lambda buf, v: buf.__setitem__(ids, v), self.last_obs, obs)

    def action_rows(self) -> Any:
        """Zeros of one action per env (``(num_envs, ...)``)."""
        return _empty(self.action_space, (self.num_envs,))

    def shown(self, ids: np.ndarray) -> Any:
        """What envs ``ids`` show now: the policy's input."""
        return tree_map(lambda buf: buf[ids], self.last_obs)

    def acted(self, ids: np.ndarray, actions: Any, extras: Mapping[str, Any], version: int) -> None:
        """The policy (``version``) chose ``actions`` (and ``extras``) for envs ``ids``."""
        raise NotImplementedError

    def stepped(  # noqa: PLR0917  (one transition's fields)
        self,
        ids: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        next_obs: Any,
        infos: Sequence[dict[str, Any]] | None = None,
    ) -> object:
        """The steps of envs ``ids`` ended (``next_obs``: the final one where one ended)."""
        raise NotImplementedError


class SegmentBook(Book):
    """Each env's segment being filled, and the finished ones in the order they finished."""

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
        length: int,
    ) -> None:
        super().__init__(observation_space, action_space, num_envs)
        self.length = length
        self.pos = np.zeros(num_envs, dtype=np.int64)
        shape = (num_envs, length)
        self._fields: dict[str, Any] = {
            "obs": _empty(observation_space, shape),
            "actions": _empty(action_space, shape),
            "rewards": np.zeros(shape, np.float64),
            "terminations": np.zeros(shape, np.bool_),
            "truncations": np.zeros(shape, np.bool_),
            "next_obs": _empty(observation_space, shape),
            "versions": np.zeros(shape, np.int64),
        }
        self._extras: dict[str, np.ndarray] = {}
        self._infos: list[dict[int, dict[str, Any]]] = [{} for _ in range(num_envs)]
        self.finished: deque[tuple[_Finished, int]] = deque()
        """Finished segments in the order they finished (their group, their row in it)."""

    def acted(self, ids: np.ndarray, actions: Any, extras: Mapping[str, Any], version: int) -> None:
        """The policy (``version``) chose ``actions`` (and ``extras``) for envs ``ids``."""
        at = (ids, self.pos[ids])
        put = _putter(at)
        tree_map(put, self._fields["obs"], tree_map(lambda buf: buf[ids], self.last_obs))
        tree_map(put, self._fields["actions"], actions)
        self._fields["versions"][at] = version
        for name, values in extras.items():
            put(self._extra(name, np.asarray(values)), values)

    def _extra(self, name: str, values: np.ndarray) -> np.ndarray:
        buffer = self._extras.get(name)
        if buffer is None:
            shape = (len(self.pos), self.length, *values.shape[1:])
            buffer = self._extras[name] = np.zeros(shape, values.dtype)
        return buffer

    def stepped(  # noqa: PLR0917  (one transition's fields)
        self,
        ids: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        next_obs: Any,
        infos: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The steps of envs ``ids`` ended; the envs whose segment is now full."""
        pos = self.pos[ids]
        at = (ids, pos)
        fields = self._fields
        fields["rewards"][at] = rewards
        fields["terminations"][at] = terminations
        fields["truncations"][at] = truncations
        tree_map(_putter(at), fields["next_obs"], next_obs)
        for k, info in enumerate(infos or ()):
            if info:
                self._infos[int(ids[k])][int(pos[k])] = info
        self.pos[ids] = pos + 1
        full = ids[pos + 1 == self.length]
        if len(full):
            self._finish(full)
        ended: list[int] = full.tolist()
        return ended

    def _finish(self, full: np.ndarray) -> None:
        """The segments of envs ``full`` are full: copied out together (a few numpy calls)."""
        arrays = {name: tree_map(lambda buf: buf[full], b) for name, b in self._fields.items()}
        arrays.update((name, buf[full]) for name, buf in self._extras.items())
        infos = self._infos
        done = _Finished(full, arrays, [infos[i] for i in full.tolist()], arrays["versions"].min(1))
        for i in full.tolist():
            infos[i] = {}
        self.finished.extend((done, k) for k in range(len(full)))
        self.pos[full] = 0

    def drop_older_than(self, version: int) -> int:
        """Drop finished segments with a transition from a policy before ``version``; how many."""
        kept = deque(entry for entry in self.finished if entry[0].oldest[entry[1]] >= version)
        dropped = len(self.finished) - len(kept)
        self.finished = kept
        return dropped

    def take(self, size: int) -> SegmentBatch:
        """The first ``size`` finished segments, as one batch."""
        runs: list[tuple[_Finished, list[int]]] = []  # consecutive segments of one group
        for _ in range(size):
            group, k = self.finished.popleft()
            if runs and runs[-1][0] is group:
                runs[-1][1].append(k)
            else:
                runs.append((group, [k]))
        first = runs[0][0]
        if len(runs) == 1 and len(runs[0][1]) == len(first.env_ids):  # one whole group
            stacked, env_ids = dict(first.arrays), first.env_ids
        else:
            parts = [(group, np.array(ks)) for group, ks in runs]
            stacked = {
                name: tree_map(
                    lambda *a: np.concatenate(a),
                    *(tree_map(lambda buf, ks=ks: buf[ks], g.arrays[name]) for g, ks in parts),
                )
                for name in first.arrays
            }
            env_ids = np.concatenate([g.env_ids[ks] for g, ks in parts])
        extras = {name: stacked.pop(name) for name in self._extras}
        return SegmentBatch(
            **stacked,
            env_ids=env_ids.astype(np.int64, copy=False),
            extras=extras,
            infos=_batched_infos([g.infos[k] for g, ks in runs for k in ks], self.length),
        )


def _putter(at: tuple[np.ndarray, np.ndarray]) -> Callable[[np.ndarray, Any], None]:
    def put(buffer: np.ndarray, values: Any) -> None:
        buffer[at] = values

    return put


def _batched_infos(sparse: Sequence[dict[int, dict[str, Any]]], length: int) -> dict[str, Any]:
    """Per-segment ``{position: info}`` dicts as gymnasium-style ``(B, L)`` arrays and masks."""
    out: dict[str, Any] = {}
    for b, infos in enumerate(sparse):
        for t, info in infos.items():
            for key, value in info.items():
                if key not in out:
                    out[key] = np.empty((len(sparse), length), dtype=object)
                    out[f"_{key}"] = np.zeros((len(sparse), length), dtype=np.bool_)
                out[key][b, t] = value
                out[f"_{key}"][b, t] = True
    return out
