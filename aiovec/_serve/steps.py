"""Step data on the wire: actions out, transitions back, as raw rows where they fit (pure).

A batch of actions (``StepOp.batch``) that fits the action space's layout
exactly travels as one block of bytes; otherwise each env's action is a value
(`aiovec._serve.codec.pack`).  Transitions come back as rows when they fit
exactly as the process backend's shared rows would (an observation of the
layout's dtype and shape, a reward and flags of the types taken as they are, a
dict info): observations, rewards and flags as raw bytes, the infos that are
not empty and ``SAME_STEP`` finals as values.  Any other transition travels
whole as a value (*single*), and the client checks and batches it by the usual
rules; one the step checker refuses travels as that error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._core import validate
from aiovec._core.calls import Autoreset, Reset
from aiovec._core.layout import Layout
from aiovec._core.ops import StepOp
from aiovec._serve import codec
from aiovec._serve.protocol import Layouts, StepMsg, StepPart, envs_bytes

__all__ = (
    "WireRows",
    "actions_of",
    "pack_actions",
    "pack_resets",
    "resets_of",
    "rows_of",
)

_F8, _B1 = np.dtype(np.float64), np.dtype(np.bool_)


def pack_actions(op: StepOp, layouts: Layouts) -> tuple[bytes | None, list[Any] | None]:
    """``(actions, action_values)`` of a step op: its batch as raw rows, or a value per env."""
    batch, count = op.batch, len(op.actions)
    layout = layouts(count)
    if batch is not None and layout is not None:
        buffer = bytearray(layout.end)
        if layout.filler(layout.views(buffer))(batch):
            return bytes(buffer), None
    return None, [codec.pack(action) for action in op.actions]


def actions_of(message: StepMsg, count: int, layouts: Layouts) -> tuple[list[Any], Any]:
    """Each env's action of a `Step`, and the batch they came in (``None``: one by one).

    Raises:
        ValueError: The actions do not fit the action space's layout, or are not ``count``.
    """
    if message.actions is not None:
        layout = layouts(count)
        if layout is None or len(message.actions) != layout.end:
            raise ValueError(
                f"actions: {len(message.actions)} bytes do not lay out {count} actions of the "
                "session's action space"
            )
        batch = _copied(layout.views(bytearray(message.actions)))
        return layout.split(batch, count), batch
    values = message.action_values
    if values is None or len(values) != count:
        raise ValueError(f"action_values: expected {count} actions")
    return values, None


def _copied(batch: Any) -> Any:
    """A batch whose arrays own their memory (the views of a received buffer do not)."""
    if isinstance(batch, np.ndarray):
        return batch
    if isinstance(batch, dict):
        return {key: _copied(value) for key, value in batch.items()}
    return tuple(_copied(value) for value in batch)


def pack_resets(op: StepOp) -> tuple[bytes, dict[int, Any]]:
    """``(resets, autoresets)`` of a step op: a flag per env, and the autoresets with options."""
    flags: Sequence[Any] = op.reset_first
    autoresets = {
        k: [bool(first), first.call.seed, codec.pack(first.call.options)]
        for k, first in enumerate(flags)
        if isinstance(first, Autoreset)
    }
    return np.array([bool(f) for f in flags], dtype=_B1).tobytes(), autoresets


def resets_of(message: StepMsg, count: int) -> list[Any]:
    """Each env's ``reset_first`` of a `Step` (a bool, or an `Autoreset` with its options).

    Raises:
        ValueError: Not ``count`` flags, or a malformed autoreset.
    """
    if len(message.resets) != count:
        raise ValueError(f"resets: expected {count} flags")
    flags: list[Any] = np.frombuffer(message.resets, _B1).tolist()
    for k, entry in message.autoresets.items():
        if not 0 <= k < count or not isinstance(entry, list) or len(entry) != 3:
            raise ValueError(f"autoresets: a malformed entry for env {k}")
        now, seed, options = entry
        flags[k] = Autoreset(Reset(validate_seed(seed), validate_options(options)), bool(now))
    return flags


def mode_of(text: str) -> AutoresetMode:
    """The autoreset mode a request names.

    Raises:
        ValueError: Not one of gymnasium's.
    """
    return AutoresetMode(text)


def validate_seed(seed: object) -> int | None:
    """A seed from the wire: ``None`` or an int in ``[0, 2**64)``.

    Raises:
        ValueError: Anything else.
    """
    if seed is None or (type(seed) is int and 0 <= seed < 2**64):
        return seed
    raise ValueError(f"a seed must be None or an int in [0, 2**64), got {seed!r}")


def validate_options(options: object) -> dict[str, Any] | None:
    """Reset options from the wire: ``None`` or a dict keyed by strings.

    Raises:
        ValueError: Anything else.
    """
    if options is None or (isinstance(options, dict) and all(type(k) is str for k in options)):
        return options
    raise ValueError(f"reset options must be None or a dict keyed by strings, got {options!r}")


# --------------------------------------------------------------------------- results


class WireRows(NamedTuple):
    """The rows of a `StepPart`, decoded without a copy (read-only views of the frame)."""

    envs: np.ndarray
    observations: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray


def _fitter(space: spaces.Space[Any]) -> Callable[[Sequence[Any], Layout, Any], list[bool]]:
    """How to write observations into a layout's views: which fit exactly (those are written)."""
    if isinstance(space, spaces.Box):
        shape, dtype = space.shape, space.dtype

        def fit_box(observations: Sequence[Any], layout: Layout, views: Any) -> list[bool]:
            ok = [
                type(o) is np.ndarray and o.dtype == dtype and o.shape == shape
                for o in observations
            ]
            if all(ok):
                if observations:
                    np.stack(observations, out=views)
                return ok
            for k, fits in enumerate(ok):
                if fits:
                    views[k] = observations[k]
            return ok

        return fit_box

    def fit_any(observations: Sequence[Any], layout: Layout, views: Any) -> list[bool]:
        write = layout.writer(views)
        return [bool(write(k, o)) for k, o in enumerate(observations)]

    return fit_any


class ResultPacker:
    """Packs a step's transitions into `StepPart` fields (the server's side).

    Args:
        observation_space: The sessions' single observation space.
    """

    def __init__(self, observation_space: spaces.Space[Any]) -> None:
        self.layouts = Layouts(observation_space)
        self._check = validate.step_result_checker(observation_space)
        self._fit = _fitter(observation_space)

    def pack(
        self,
        rid: int,
        group: int,
        done: bool,
        results: Mapping[int, Any],
        errors: Mapping[int, BaseException],
    ) -> StepPart:
        """The part answering ``results`` and ``errors`` (by env index)."""
        transitions = {i: results[i] for i in sorted(results)}
        bad = self._check(transitions)
        error_data = {i: codec.error_to_data(e) for i, e in errors.items()}
        for i, error in bad.items():
            del transitions[i]
            error_data[i] = codec.error_to_data(error)
        infos: dict[int, Any] = {}
        finals: dict[int, Any] = {}
        for i, t in list(transitions.items()):
            try:
                if t[4]:
                    infos[i] = codec.pack(t[4])
                if t[5] is not None:
                    finals[i] = codec.pack(t[5])
            except TypeError as exc:  # an info that cannot be sent fails its env
                del transitions[i]
                infos.pop(i, None)
                error_data[i] = codec.error_to_data(exc)
        envs = list(transitions)
        values = list(transitions.values())
        layout = self.layouts(len(envs)) if envs else None
        if layout is None:
            alone = self._singles(envs, values, error_data)
            return _part(rid, group, done, [], b"", [], {}, {}, alone, error_data)
        buffer = bytearray(layout.end)
        fits = self._fit([t[0] for t in values], layout, layout.views(buffer))
        fits = [
            ok
            and type(t[1]) in validate.REWARD_TYPES
            and type(t[2]) in validate.FLAG_TYPES
            and type(t[3]) in validate.FLAG_TYPES
            for ok, t in zip(fits, values, strict=True)
        ]
        singles: dict[int, Any] = {}
        if not all(fits):
            odd = [k for k, ok in enumerate(fits) if not ok]
            singles = self._singles([envs[k] for k in odd], [values[k] for k in odd], error_data)
            for k in odd:
                infos.pop(envs[k], None)
                finals.pop(envs[k], None)
            keep = [k for k, ok in enumerate(fits) if ok]
            if not keep:
                return _part(rid, group, done, [], b"", [], {}, {}, singles, error_data)
            packed = self.layouts(len(keep))
            assert packed is not None
            kept = bytearray(packed.end)
            _copy_leaves(packed, kept, layout, buffer, keep)
            buffer, envs, values = kept, [envs[k] for k in keep], [values[k] for k in keep]
        return _part(
            rid, group, done, envs, bytes(buffer), values, infos, finals, singles, error_data
        )

    @staticmethod
    def _singles(envs: list[int], values: list[Any], error_data: dict[int, Any]) -> dict[int, Any]:
        singles = {}
        for i, transition in zip(envs, values, strict=True):
            try:
                singles[i] = codec.pack(list(transition))
            except TypeError as exc:
                error_data[i] = codec.error_to_data(exc)
        return singles


def _copy_leaves(
    target: Layout, out: bytearray, source: Layout, buffer: bytearray, keep: list[int]
) -> None:
    for to, came in zip(target.leaves, source.leaves, strict=True):
        dst = np.ndarray(to.shape, to.dtype, buffer=out, offset=to.offset)
        src = np.ndarray(came.shape, came.dtype, buffer=buffer, offset=came.offset)
        dst[...] = src[keep]


def _part(  # noqa: PLR0917
    rid: int,
    group: int,
    done: bool,
    rows: list[int],
    obs: bytes,
    values: list[Any],
    infos: dict[int, Any],
    finals: dict[int, Any],
    singles: dict[int, Any],
    errors: dict[int, Any],
) -> StepPart:
    return StepPart(
        rid,
        group,
        done,
        envs_bytes(rows),
        obs,
        np.array([t[1] for t in values], dtype=_F8).tobytes(),
        np.array([t[2] for t in values], dtype=_B1).tobytes(),
        np.array([t[3] for t in values], dtype=_B1).tobytes(),
        infos,
        finals,
        singles,
        errors,
    )


def rows_of(part: StepPart, layouts: Layouts) -> WireRows | None:
    """The rows of a part, as views of its bytes (``None``: it has none).

    Raises:
        ValueError: The bytes do not hold as many rows as it names envs.
    """
    envs = np.frombuffer(part.envs, np.dtype("<u4"))
    count = len(envs)
    if not count:
        return None
    layout = layouts(count)
    if (
        layout is None
        or len(part.obs) != layout.end
        or len(part.rewards) != 8 * count
        or len(part.terminations) != count
        or len(part.truncations) != count
    ):
        raise ValueError(f"a step part whose rows do not hold its {count} envs")
    return WireRows(
        envs,
        layout.views(part.obs),
        np.frombuffer(part.rewards, _F8),
        np.frombuffer(part.terminations, _B1),
        np.frombuffer(part.truncations, _B1),
    )
