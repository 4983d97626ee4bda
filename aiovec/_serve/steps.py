"""Step data on the wire: actions out, transitions back, as raw rows where they fit (pure).

A batch of actions (``StepOp.batch``) that fits the action space's layout
exactly travels as one block of bytes; otherwise each env's action is a value
(`aiovec._serve.codec.pack`).  Transitions come back as rows: the server
writes them into step rows of its own with the process workers' `RowWriter`
(one rule for what fits exactly), and sends the rows of a reply's envs as raw
bytes (observations laid out by `aiovec._core.layout.Layout` for that many
envs, rewards ``float64``, flags ``bool``), the infos that are not empty and
``SAME_STEP`` finals as values.  A transition that does not fit the rows
travels whole as a value (*single*), and the client checks and batches it by
the usual rules; one the step checker refuses travels as that error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._core import validate
from aiovec._core.calls import KEEP_ENDED, Autoreset, Reset
from aiovec._core.layout import StepLayout, copy_rows
from aiovec._core.ops import StepOp
from aiovec._serve import codec
from aiovec._serve.calls import check_options, check_seed
from aiovec._serve.protocol import Layouts, StepMsg, StepPart, envs_bytes
from aiovec.backends.pool.host.rows import RowWriter

__all__ = (
    "AnswerRows",
    "WireRows",
    "actions_of",
    "mode_of",
    "pack_actions",
    "pack_resets",
    "resets_of",
    "rows_of",
)

_F8, _B1, _ENVS = np.dtype(np.float64), np.dtype(np.bool_), np.dtype("<u4")
KEEP = 2
"""A ``resets`` byte: under ``SameStep`` the env is not reset if it ends (`KEEP_ENDED`)."""
_BOOL = frozenset({bool})

# --------------------------------------------------------------------------- actions out, in


def pack_actions(op: StepOp, count: int, layouts: Layouts) -> tuple[bytes | None, list[Any] | None]:
    """``(actions, action_values)`` of a step op for ``count`` envs: raw rows, or a value each."""
    batch, layout = op.batch, layouts(count)
    if batch is not None and layout is not None:
        if layout.tree[0] == "leaf":  # one array: its bytes, if it is exactly the leaf's
            leaf = layout.leaves[0]
            if (
                type(batch) is np.ndarray
                and batch.dtype == leaf.dtype
                and batch.shape == leaf.shape
            ):
                return batch.tobytes(), None
        else:
            buffer = bytearray(layout.end)
            if layout.filler(layout.views(buffer))(batch):
                return bytes(buffer), None
    return None, [codec.pack(action) for action in op.actions]


def actions_of(message: StepMsg, count: int, layouts: Layouts) -> tuple[list[Any], Any]:
    """Each env's action of a `StepMsg`, and the batch they came in (``None``: one by one).

    Raises:
        ValueError: The actions do not fit the action space's layout, or are not ``count``.
    """
    raw = message.actions
    if raw is not None:
        layout = layouts(count)
        if layout is None or len(raw) != layout.end:
            raise ValueError(
                f"actions: {len(raw)} bytes do not lay out {count} actions of the "
                "session's action space"
            )
        if layout.tree[0] == "leaf":  # one array, of its own (not the frame's)
            leaf = layout.leaves[0]
            batch = np.ndarray(leaf.shape, leaf.dtype, buffer=bytearray(raw))
            return list(batch), batch
        batch = layout.views(bytearray(raw))
        return layout.split(batch, count), batch
    values = message.action_values
    if values is None or len(values) != count:
        raise ValueError(f"action_values: expected {count} actions")
    return values, None


# --------------------------------------------------------------------------- resets out, in


def pack_resets(op: StepOp) -> tuple[bytes, dict[int, Any]]:
    """``(resets, autoresets)`` of a step op: a flag per env, and the autoresets with options."""
    flags: Sequence[Any] = op.reset_first
    if _BOOL.issuperset(map(type, flags)):  # the usual step: plain flags, looked at in C
        return (np.array(flags, dtype=_B1).tobytes() if any(flags) else bytes(len(flags))), {}
    autoresets = {
        k: [bool(first), first.call.seed, codec.pack(first.call.options)]
        for k, first in enumerate(flags)
        if isinstance(first, Autoreset)
    }
    codes = [KEEP if f is KEEP_ENDED else 1 if f else 0 for f in flags]
    return bytes(codes), autoresets


def resets_of(message: StepMsg, count: int) -> list[Any]:
    """Each env's ``reset_first`` of a `StepMsg` (a bool, or an `Autoreset` with its options).

    Raises:
        ValueError: Not ``count`` flags, or a malformed autoreset.
    """
    raw = message.resets
    if len(raw) != count:
        raise ValueError(f"resets: expected {count} flags")
    if not any(raw):
        flags: list[Any] = [False] * count
    elif max(raw) == 1:
        flags = np.frombuffer(raw, _B1).tolist()
    elif max(raw) == KEEP:
        flags = [KEEP_ENDED if code == KEEP else code == 1 for code in raw]
    else:
        raise ValueError(f"resets: a flag is 0, 1 or {KEEP}, got {max(raw)}")
    for k, entry in message.autoresets.items():
        if not 0 <= k < count or not isinstance(entry, list) or len(entry) != 3:
            raise ValueError(f"autoresets: a malformed entry for env {k}")
        now, seed, options = entry
        flags[k] = Autoreset(Reset(check_seed(seed), check_options(options)), bool(now))
    return flags


_MODES = {mode.value: mode for mode in AutoresetMode}


def mode_of(text: str) -> AutoresetMode:
    """The autoreset mode a request names.

    Raises:
        ValueError: Not one of gymnasium's.
    """
    try:
        return _MODES[text]
    except (KeyError, TypeError):
        raise ValueError(f"{text!r} is not an autoreset mode ({', '.join(_MODES)})") from None


# --------------------------------------------------------------------------- results back


class AnswerRows:
    """A group's step rows on the server: transitions written in, a `StepPart` out.

    Args:
        observation_space: The sessions' single observation space.
        action_space: Their single action space.
        count: How many sessions (rows).
    """

    def __init__(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any], count: int
    ) -> None:
        self.count = count
        self.layouts = Layouts(observation_space)
        self._check = validate.step_result_checker(observation_space)
        self._writer = RowWriter()
        layout = StepLayout.of(observation_space, action_space, count)
        self._layout = layout
        if layout is not None:
            self._writer.use(layout, bytearray(layout.nbytes), 0)

    def pack(
        self,
        rid: int,
        group: int,
        done: bool,
        results: Mapping[int, Any],
        errors: Mapping[int, BaseException],
    ) -> StepPart:
        """The part answering ``results`` and ``errors`` (by env index)."""
        error_data = {i: codec.error_to_data(e) for i, e in errors.items()}
        stepped = results if type(results) is dict else dict(results)
        infos, finals, odd = self._writer.write(stepped)
        singles = self._singles(odd, error_data) if odd else {}
        packed_infos = _packed(infos, error_data) if infos else infos
        packed_finals = _packed(finals, error_data) if finals else finals
        rows: Sequence[int] = range(self.count)
        if len(stepped) != self.count or odd or len(error_data) > len(errors):
            rows = sorted(i for i in stepped if i not in odd and i not in error_data)
            for i in error_data:  # an info or final that cannot be sent fails its env
                packed_infos.pop(i, None)
                packed_finals.pop(i, None)
        return StepPart(
            rid,
            group,
            done,
            envs_bytes(rows),
            *self._row_bytes(rows),
            packed_infos,
            packed_finals,
            singles,
            error_data,
        )

    def _row_bytes(self, rows: Sequence[int]) -> tuple[bytes, bytes, bytes, bytes]:
        """The raw rows of envs ``rows``: observations (laid out for them), rewards, flags."""
        arrays = self._writer.arrays
        if not rows or arrays is None:
            return b"", b"", b"", b""
        layout = self.layouts(len(rows))
        assert layout is not None
        assert self._layout is not None
        if type(rows) is range:  # every row: the buffer's own laid-out observations
            buffer = self._writer.buffer
            return (
                bytes(memoryview(buffer)[: self._layout.observations.end]),
                arrays.rewards.tobytes(),
                arrays.terminations.tobytes(),
                arrays.truncations.tobytes(),
            )
        taken = list(rows)
        out = bytearray(layout.end)
        copy_rows(layout.views(out), arrays.observations, slice(None), taken)
        return (
            bytes(out),
            arrays.rewards[taken].tobytes(),
            arrays.terminations[taken].tobytes(),
            arrays.truncations[taken].tobytes(),
        )

    def _singles(self, odd: dict[int, Any], error_data: dict[int, Any]) -> dict[int, Any]:
        """Transitions that do not fit the rows, as values; the malformed ones as errors."""
        for i, error in self._check(odd).items():
            del odd[i]
            error_data[i] = codec.error_to_data(error)
        singles = {}
        for i, transition in odd.items():
            try:
                singles[i] = codec.pack(list(transition))
            except TypeError as exc:
                error_data[i] = codec.error_to_data(exc)
        return singles


def _packed(values: dict[int, Any], error_data: dict[int, Any]) -> dict[int, Any]:
    """Each value packed for the wire; one that cannot be fails its env (into ``error_data``)."""
    packed = {}
    for i, value in values.items():
        try:
            packed[i] = codec.pack(value)
        except TypeError as exc:
            error_data[i] = codec.error_to_data(exc)
    return packed


class WireRows(NamedTuple):
    """The rows of a `StepPart`, decoded without a copy (read-only views of the frame)."""

    envs: np.ndarray
    observations: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray


def rows_of(part: StepPart, layouts: Layouts) -> WireRows | None:
    """The rows of a part, as views of its bytes (``None``: it has none).

    Raises:
        ValueError: The bytes do not hold as many rows as it names envs.
    """
    count = len(part.envs) // 4
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
    if layout.tree[0] == "leaf":
        leaf = layout.leaves[0]
        observations = np.ndarray(leaf.shape, leaf.dtype, buffer=part.obs)
    else:
        observations = layout.views(part.obs)
    return WireRows(
        np.frombuffer(part.envs, _ENVS),
        observations,
        np.frombuffer(part.rewards, _F8),
        np.frombuffer(part.terminations, _B1),
        np.frombuffer(part.truncations, _B1),
    )
