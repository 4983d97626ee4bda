"""The shared-memory layout and block rows (``_core/layout.py``, ``_core/rows.py``): pure."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from conftest import SPACES
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from aiovec._core.layout import Layout, StepLayout, copy_rows, take_rows
from aiovec._core.rows import Rows, StepBlock, row_of

ALL_SPACES = {f"{name}/{k}": pair[k] for name, pair in SPACES.items() for k in (0, 1)}
N = 5


def _same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert type(a) is type(b)
        np.testing.assert_array_equal(a, b)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype


def _samples(space: spaces.Space[Any], count: int = N) -> list[Any]:
    space.seed(7)
    return [space.sample() for _ in range(count)]


@pytest.mark.parametrize("name", ALL_SPACES)
def test_rows_written_into_the_buffer_batch_like_gymnasium(name: str) -> None:
    space = ALL_SPACES[name]
    layout = Layout.of(space, N, start=8)
    assert layout is not None
    buffer = bytearray(layout.end)
    views = layout.views(buffer)
    _same(views, create_empty_array(space, n=N, fn=np.zeros))  # shapes, dtypes, zeros
    write = layout.writer(views)
    values = _samples(space)
    for i, value in enumerate(values):
        assert write(i, value)
    expected = concatenate(space, values, create_empty_array(space, n=N, fn=np.zeros))
    _same(take_rows(views, slice(0, N)), expected)
    for i, value in enumerate(values):
        _same(row_of(views, i), value if not isinstance(value, int) else np.int64(value))


@pytest.mark.parametrize("name", ALL_SPACES)
def test_fill_then_split_gives_what_gymnasium_iterate_gives(name: str) -> None:
    space = ALL_SPACES[name]
    batched = batch_space(space, N)
    layout = Layout.of(space, N)
    assert layout is not None
    views = layout.views(bytearray(layout.end))
    batched.seed(3)
    batch = batched.sample()
    assert layout.filler(views)(batch)
    got = layout.split(take_rows(views, [1, 3]), 2)
    want = list(iterate(batched, batch))
    for value, expected in zip(got, [want[1], want[3]], strict=True):
        _same(value, expected)


def test_arrays_never_overlap_and_start_on_cache_lines() -> None:
    obs, act = SPACES["nested-dict-of-tuple"]
    layout = StepLayout.of(obs, act, 7)
    assert layout is not None
    assert layout.actions is not None
    leaves = [
        *layout.observations.leaves,
        *layout.actions.leaves,
        layout.rewards,
        layout.terminations,
        layout.truncations,
        layout.resets,
    ]
    spans = sorted((leaf.offset, leaf.offset + leaf.nbytes) for leaf in leaves)
    assert all(start % 64 == 0 for start, _ in spans)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert layout.nbytes == spans[-1][1]


@pytest.mark.parametrize(
    "space",
    [
        spaces.Text(5),
        spaces.Sequence(spaces.Discrete(2)),
        spaces.Dict({"ok": spaces.Discrete(2), "text": spaces.Text(3)}),
        spaces.Tuple((spaces.Discrete(2), spaces.Graph(spaces.Discrete(2), None))),
    ],
)
def test_spaces_without_fixed_arrays_are_not_laid_out(space: spaces.Space[Any]) -> None:
    assert Layout.of(space, 3) is None
    assert StepLayout.of(space, spaces.Discrete(2), 3) is None


def test_actions_that_cannot_be_laid_out_leave_observations_shared() -> None:
    layout = StepLayout.of(spaces.Discrete(2), spaces.Text(4), 3)
    assert layout is not None
    assert layout.actions is None


BOX = spaces.Box(-1.0, 1.0, (2,), np.float32)


@pytest.mark.parametrize(
    ("space", "value"),
    [
        (BOX, np.zeros(2, np.float64)),  # another dtype: batching casts it, by message
        (BOX, np.zeros(3, np.float32)),  # another shape: batching raises, by message
        (BOX, [0.0, 0.0]),  # not an array
        (BOX, np.float32(0.5)),  # a scalar would broadcast into the row
        (spaces.Discrete(3), 1.0),
        (spaces.Discrete(3), 2**70),
        (spaces.Dict({"a": BOX}), {"b": np.zeros(2, np.float32)}),
        (spaces.Dict({"a": BOX}), [np.zeros(2, np.float32)]),
        (spaces.Tuple((BOX, BOX)), (np.zeros(2, np.float32),)),
    ],
)
def test_values_that_do_not_fit_exactly_are_refused(space: spaces.Space[Any], value: Any) -> None:
    layout = Layout.of(space, 2)
    assert layout is not None
    views = layout.views(bytearray(layout.end))
    assert not layout.writer(views)(1, value)
    assert not layout.filler(views)(value)


def test_fill_refuses_a_batch_of_another_dtype() -> None:
    layout = Layout.of(spaces.Discrete(3), 4)
    assert layout is not None
    views = layout.views(bytearray(layout.end))
    assert not layout.filler(views)(np.zeros(4, np.int32))
    assert not layout.filler(views)([0, 1, 2, 0])
    assert layout.filler(views)(np.array([0, 1, 2, 0]))
    np.testing.assert_array_equal(views, [0, 1, 2, 0])


def test_copy_rows_copies_only_those_rows() -> None:
    source = {"a": np.arange(6.0).reshape(3, 2), "b": (np.arange(3),)}
    target = {"a": np.zeros((3, 2)), "b": (np.zeros(3, np.int64),)}
    copy_rows(target, source, slice(1, 3))
    np.testing.assert_array_equal(target["a"], [[0, 0], [2, 3], [4, 5]])
    np.testing.assert_array_equal(target["b"][0], [0, 1, 2])


def _block(envs: Any, infos: Any = None) -> StepBlock:
    layout = StepLayout.of(BOX, spaces.Discrete(2), 4)
    assert layout is not None
    arrays = layout.arrays(bytearray(layout.nbytes))
    arrays.observations[:] = np.arange(8, dtype=np.float32).reshape(4, 2)
    arrays.rewards[:] = [0.5, 1.5, 2.5, 3.5]
    arrays.terminations[:] = [False, True, False, False]
    return StepBlock(envs, arrays, infos or {}, {})


def test_rows_build_transitions_that_share_no_memory_with_the_block() -> None:
    rows = Rows()
    block = _block(range(0, 2), {1: {"x": 1}})
    rows.add_block(block)
    obs, reward, terminated, truncated, info, final = rows[1]
    np.testing.assert_array_equal(obs, [2.0, 3.0])
    assert (reward, terminated, truncated, info, final) == (1.5, True, False, {"x": 1}, None)
    obs[:] = -1
    assert block.arrays.observations[1, 0] == 2.0
    assert rows[0][4] == {}
    with pytest.raises(KeyError):
        rows[2]


def test_rows_mix_blocks_and_single_transitions() -> None:
    rows = Rows()
    rows.add_block(_block(range(0, 2)))
    rows.add_block(_block([2, 3]))
    assert rows.blocks_covering(4) is not None
    assert len(rows) == 4
    assert sorted(rows) == [0, 1, 2, 3]
    assert 3 in rows
    assert 4 not in rows
    rows[1] = ("restarted", 0.0, False, True, {}, None)
    assert rows.blocks_covering(4) is None  # one row no longer comes from a block
    assert rows[1][0] == "restarted"
    assert len(rows) == 4
    del rows[1]
    del rows[2]
    assert sorted(rows) == [0, 3]
    rows[5] = None  # e.g. render() returning None
    assert rows[5] is None


def test_rows_of_a_whole_step_in_one_block() -> None:
    rows = Rows()
    rows.add_block(_block(range(4)))
    assert rows.blocks_covering(4) is not None
    assert rows.blocks_covering(5) is None
    assert len(rows) == 4
    assert list(rows) == [0, 1, 2, 3]
    del rows[2]
    assert 2 not in rows
    assert rows.blocks_covering(4) is None
    rows[2] = ("restarted", 0.0, False, True, {}, None)
    assert rows.blocks_covering(4) is None  # one row comes alone now
    assert rows[2][0] == "restarted"
    assert rows[3][1] == 3.5
    part = Rows()
    part.add_block(_block(range(0, 2)))
    assert part.blocks_covering(2) is not None
    assert part.blocks_covering(4) is None
    part.add_block(_block(range(2, 4)))  # a second block: both indexed
    assert part.blocks_covering(4) is not None
    assert sorted(part) == [0, 1, 2, 3]


def test_rows_update_from_rows_keeps_only_what_each_block_still_holds() -> None:
    first = Rows()
    first.add_block(_block(range(0, 2)))
    first[0] = ("single", 0.0, False, False, {}, None)
    second = Rows()
    second.update(first)
    assert second[0][0] == "single"
    np.testing.assert_array_equal(second[1][0], [2.0, 3.0])
    assert len(second) == 2
    second.update({2: ("plain", 0.0, False, False, {}, None)})
    assert sorted(second) == [0, 1, 2]
    assert second.blocks_covering(3) is None
