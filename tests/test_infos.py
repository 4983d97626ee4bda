"""Info merging: ``merge_infos`` gives exactly gymnasium's ``VectorEnv._add_info``, env by env.

The reference is gymnasium's own method, applied entry by entry.  Hypothesis
draws random per-env infos (nested dicts, mixed and clashing types, missing
keys, numpy scalars and arrays, ``final_obs``, keys next to their ``_key``);
the results must agree in keys and their order, types, dtypes, shapes and
values (object arrays: the very same objects), or both must raise the same
error.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any
from unittest import mock

import numpy as np
import pytest
from gymnasium.vector import VectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aiovec._core import infos as infos_module
from aiovec._core.infos import merge_infos

Entries = list[tuple[int, dict[str, Any]]]


class _Vector:
    num_envs: int
    _add_info = VectorEnv._add_info


def gymnasium_merge(num_envs: int, entries: Entries) -> dict[str, Any]:
    """gymnasium's ``_add_info`` env by env: the oracle (written apart from aiovec's)."""
    vector = _Vector()
    vector.num_envs = num_envs
    merged: dict[str, Any] = {}
    for i, info in entries:
        merged = vector._add_info(merged, info, i)
    return merged


def outcome(merge: Any, num_envs: int, entries: Entries) -> tuple[str, Any]:
    try:
        return "result", merge(num_envs, entries)
    except Exception as exc:
        return "error", (type(exc), str(exc))


def assert_same(got: Any, want: Any, path: str = "infos") -> None:
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
        if want.dtype == object:
            for k, (x, y) in enumerate(zip(got.ravel(), want.ravel(), strict=True)):
                assert x is y, f"{path}[{k}]: {x!r} is not {y!r}"
        else:
            np.testing.assert_array_equal(got, want, err_msg=path, strict=True)
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), path
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def assert_merges_alike(num_envs: int, entries: Entries) -> None:
    got, want = outcome(merge_infos, num_envs, entries), outcome(gymnasium_merge, num_envs, entries)
    assert got[0] == want[0], f"aiovec: {got}, gymnasium: {want}"
    if want[0] == "error":
        assert got[1] == want[1]
    else:
        assert_same(got[1], want[1])


# ------------------------------------------------------------ random infos

KEYS = st.sampled_from(["a", "b", "steps", "_a", "final_obs", "final_info"]) | st.just(0)
NUMPY_SCALARS = st.sampled_from([np.int8, np.int64, np.uint16, np.float32, np.float64, np.bool_])
ARRAYS = hnp.arrays(
    st.sampled_from([np.int64, np.float32, np.bool_]), st.sampled_from([(2,), (3,), (2, 2)])
)
LEAVES = st.one_of(
    st.integers(-5, 5),
    st.integers(-(2**65), 2**65),
    st.floats(),
    st.booleans(),
    st.builds(lambda kind, x: kind(x), NUMPY_SCALARS, st.integers(0, 100)),
    ARRAYS,
    st.text(max_size=2),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),
)
INFOS = st.dictionaries(
    KEYS,
    st.recursive(LEAVES, lambda inner: st.dictionaries(KEYS, inner, max_size=3), max_leaves=6),
    max_size=4,
)


@st.composite
def entries_of(draw: st.DrawFn, infos: st.SearchStrategy[dict[str, Any]]) -> tuple[int, Entries]:
    """``num_envs`` and 0-2 infos per row, rows ascending (as final info, then info)."""
    num_envs = draw(st.integers(1, 6))
    entries: Entries = []
    for row in range(num_envs):
        entries += [(row, info) for info in draw(st.lists(infos, max_size=2))]
    return num_envs, entries


@settings(max_examples=400, deadline=None)
@given(entries_of(INFOS))
def test_random_infos_merge_as_gymnasium_merges_them(drawn: tuple[int, Entries]) -> None:
    assert_merges_alike(*drawn)


# ----------------------------------------------- regular infos: the fast path

REGULAR_LEAF_KINDS = st.sampled_from(
    [
        st.integers(-(2**40), 2**40),
        st.floats(),
        st.booleans(),
        st.integers(0, 100).map(np.float32),
        st.integers(0, 100).map(np.int16),
        hnp.arrays(np.float64, (2,)),
        st.text(max_size=2),
    ]
)


@st.composite
def regular_entries(draw: st.DrawFn) -> tuple[int, Entries]:
    """Infos whose every key has one type in all envs (nested dicts too); keys may be missing."""
    shape: dict[str, Any] = draw(
        st.dictionaries(
            st.sampled_from(["a", "b", "steps", "final_obs"]),
            st.recursive(
                REGULAR_LEAF_KINDS,
                lambda inner: st.dictionaries(st.sampled_from(["x", "y"]), inner, max_size=2),
                max_leaves=4,
            ),
            max_size=3,
        )
    )

    def info_like(template: dict[str, Any]) -> dict[str, Any]:
        info = {}
        for key, kind in template.items():
            if draw(st.booleans()):  # some envs lack some keys
                info[key] = info_like(kind) if isinstance(kind, dict) else draw(kind)
        return info

    num_envs = draw(st.integers(1, 6))
    return num_envs, [(row, info_like(shape)) for row in range(num_envs)]


@settings(max_examples=200, deadline=None)
@given(regular_entries())
def test_regular_infos_merge_per_key_without_falling_back(drawn: tuple[int, Entries]) -> None:
    def no_fallback(num_envs: int, entries: Entries) -> dict[str, Any]:
        raise AssertionError("fell back to merging env by env")

    with mock.patch.object(infos_module, "merge_infos_one_by_one", no_fallback):
        got = merge_infos(*drawn)
    assert_same(got, gymnasium_merge(*drawn))


# ------------------------------------------------------------ named cases


@pytest.mark.parametrize(
    "entries",
    [
        pytest.param([(0, {"a": 1}), (1, {"a": 2.7})], id="int-then-float-truncates"),
        pytest.param([(0, {"a": 1.5}), (2, {"a": True})], id="float-then-bool"),
        pytest.param([(0, {"a": 1}), (1, {"a": "x"})], id="int-then-str-raises"),
        pytest.param([(0, {"a": 1}), (1, {"a": 2**70})], id="int64-overflow-raises"),
        pytest.param([(0, {"a": {"x": 1}}), (1, {"a": 3})], id="dict-then-scalar"),
        pytest.param([(0, {"a": 3}), (1, {"a": {}})], id="scalar-then-empty-dict"),
        pytest.param(
            [(0, {"a": {"x": 1}}), (1, {"a": MappingProxyType({"x": 2})})],
            id="dict-then-other-mapping",
        ),
        pytest.param([(0, {"a": 1, "_a": 5}), (1, {"a": 2})], id="key-next-to-its-mask"),
        pytest.param([(0, {"final_obs": {"x": 1}}), (1, {"final_obs": 2})], id="final-obs"),
        pytest.param([(0, {"a": 1}), (0, {"a": 2})], id="one-env-twice"),
        pytest.param([(0, {"a": np.zeros(2)}), (1, {"a": np.ones(3)})], id="array-shapes-clash"),
        pytest.param([(0, {"a": np.bool_(True)}), (1, {"a": False})], id="numpy-bool-is-object"),
        pytest.param([(1, {"a": {}}), (2, {"a": {"x": np.int8(3)}})], id="nested-missing"),
    ],
)
def test_irregular_infos_merge_as_gymnasium_merges_them(entries: Entries) -> None:
    assert_merges_alike(3, entries)


def test_a_full_key_has_all_true_mask_and_the_values_dtype() -> None:
    merged = merge_infos(3, [(i, {"steps": i, "distance": 0.5 * i}) for i in range(3)])
    assert list(merged) == ["steps", "_steps", "distance", "_distance"]
    assert merged["steps"].dtype == np.int64
    assert merged["distance"].tolist() == [0.0, 0.5, 1.0]
    assert merged["_steps"].all()
    assert merge_infos(3, []) == {}
