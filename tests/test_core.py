"""The pure core, tested without an event loop (h11 style: tables, no I/O)."""

from __future__ import annotations

import ast
import collections
import pathlib
import re

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec import AlreadyPendingCallError, ClosedError, NoAsyncCallError, StateError
from aiovec._core import validate
from aiovec._core.autoreset import AutoresetState
from aiovec._core.batching import Batcher, copy_batch
from aiovec._core.calls import AUTORESET, KEEP_ENDED, STEP, new_step_flow
from aiovec._core.deadlines import overdue
from aiovec._core.lifecycle import Lifecycle, State, VectorCall

CORE = pathlib.Path(__file__).parent.parent / "aiovec" / "_core"
FORBIDDEN = {"asyncio", "anyio", "threading", "multiprocessing", "pickle", "cloudpickle", "ray"}


def test_core_imports_no_io_module():
    for path in CORE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


# -- the step flow: (mode, reset_first, what the env returns) -> calls and transition --

OBS, INFO = "obs", {"k": 1}
RESET_OBS, RESET_INFO = "reset-obs", {"reset": True}


def run_flow(mode, reset_first, terminated=False, truncated=False):
    """Push one step through a fresh flow; return (calls made, transition)."""
    flow = new_step_flow(mode)
    calls = []
    call = flow.send(reset_first)
    while type(call) is not tuple:
        calls.append(call)
        if call is STEP:
            call = flow.send((OBS, 1.5, terminated, truncated, INFO))
        else:
            call = flow.send((RESET_OBS, RESET_INFO))
    return calls, call


FLOW_TABLE = [
    # mode, reset_first, terminated, truncated -> calls, transition
    (AutoresetMode.NEXT_STEP, False, False, False, [STEP], (OBS, 1.5, False, False, INFO, None)),
    (AutoresetMode.NEXT_STEP, False, True, False, [STEP], (OBS, 1.5, True, False, INFO, None)),
    (
        AutoresetMode.NEXT_STEP,
        True,
        False,
        False,
        [AUTORESET],
        (RESET_OBS, 0.0, False, False, RESET_INFO, None),
    ),
    (AutoresetMode.DISABLED, False, False, True, [STEP], (OBS, 1.5, False, True, INFO, None)),
    (AutoresetMode.SAME_STEP, False, False, False, [STEP], (OBS, 1.5, False, False, INFO, None)),
    (
        AutoresetMode.SAME_STEP,
        False,
        True,
        False,
        [STEP, AUTORESET],
        (RESET_OBS, 1.5, True, False, RESET_INFO, {"final_obs": OBS, "final_info": INFO}),
    ),
    (
        AutoresetMode.SAME_STEP,
        False,
        False,
        True,
        [STEP, AUTORESET],
        (RESET_OBS, 1.5, False, True, RESET_INFO, {"final_obs": OBS, "final_info": INFO}),
    ),
    # KEEP_ENDED (the EpisodeCollector's steps): its caller resets an env that ended
    (AutoresetMode.SAME_STEP, KEEP_ENDED, True, False, [STEP], (OBS, 1.5, True, False, INFO, None)),
    (AutoresetMode.SAME_STEP, KEEP_ENDED, False, True, [STEP], (OBS, 1.5, False, True, INFO, None)),
    (AutoresetMode.NEXT_STEP, KEEP_ENDED, True, False, [STEP], (OBS, 1.5, True, False, INFO, None)),
]


@pytest.mark.parametrize(
    ("mode", "reset_first", "term", "trunc", "calls", "transition"), FLOW_TABLE
)
def test_step_flow_table(mode, reset_first, term, trunc, calls, transition):
    assert run_flow(mode, reset_first, term, trunc) == (calls, transition)


def test_a_flow_serves_many_steps():
    flow = new_step_flow(AutoresetMode.NEXT_STEP)
    for reset_first in (False, True, False, False, True):
        call = flow.send(reset_first)
        assert call is (AUTORESET if reset_first else STEP)
        result = (RESET_OBS, RESET_INFO) if reset_first else (OBS, 0.0, False, False, {})
        assert type(flow.send(result)) is tuple


def test_autoreset_is_a_reset_without_seed_or_options():
    assert AUTORESET.seed is None
    assert AUTORESET.options is None


# -- autoreset state across steps -----------------------------------------------------


def test_next_step_plans_a_reset_for_envs_that_ended():
    state = AutoresetState(AutoresetMode.NEXT_STEP, 3)
    assert state.plan() == [False, False, False]
    state.stepped(None, np.array([False, True, False]), np.zeros(3, bool))
    assert state.plan() == [False, True, False]
    state.was_reset(np.array([False, True, False]))
    assert state.plan() == [False, False, False]


def test_same_step_never_plans_a_reset():
    state = AutoresetState(AutoresetMode.SAME_STEP, 2)
    state.stepped(None, np.array([True, False]), np.array([False, True]))
    assert state.plan() == [False, False]


def test_disabled_refuses_to_step_an_ended_env_and_names_it():
    state = AutoresetState(AutoresetMode.DISABLED, 4)
    state.stepped(None, np.zeros(4, bool), np.array([False, False, True, False]))
    with pytest.raises(StateError, match=r"\[2\].*reset_mask"):
        state.plan()
    state.was_reset(np.array([False, False, True, False]))
    assert state.plan() == [False] * 4


def test_full_reset_clears_every_ended_flag():
    state = AutoresetState(AutoresetMode.NEXT_STEP, 2)
    state.stepped(None, np.array([True, False]), np.array([False, True]))
    state.was_reset(None)
    assert state.plan() == [False, False]


# -- lifecycle table ------------------------------------------------------------------

LIFECYCLE_TABLE = [
    (State.NEEDS_RESET, VectorCall.RESET, None),
    (State.NEEDS_RESET, VectorCall.STEP, "reset\\(\\) first"),
    (State.NEEDS_RESET, VectorCall.RESET_MASK, "reset\\(\\) first"),
    (State.NEEDS_RESET, VectorCall.INSPECT, None),
    (State.READY, VectorCall.STEP, None),
    (State.READY, VectorCall.RESET_MASK, None),
    (State.BUSY, VectorCall.STEP, "in flight"),
    (State.BUSY, VectorCall.RESET, "in flight"),
    (State.BUSY, VectorCall.INSPECT, "in flight"),
    (State.BROKEN, VectorCall.RESET, None),
    (State.BROKEN, VectorCall.STEP, "only a full reset\\(\\)"),
    (State.BROKEN, VectorCall.RESET_MASK, "only a full reset\\(\\)"),
    (State.BROKEN, VectorCall.INSPECT, "only a full reset\\(\\)"),
]


def _no_call(name: str) -> tuple[type[StateError], str, str]:
    """gymnasium's NoAsyncCallError for ``{name}_wait``: its class, message start, ``.name``."""
    text = f"Calling `{name}_wait` without any prior call to `{name}_async`."
    return NoAsyncCallError, re.escape(text), name


def _pending(call: str, name: str) -> tuple[type[StateError], str, str]:
    """gymnasium's AlreadyPendingCallError for ``call`` while ``name`` is pending."""
    text = f"Calling `{call}` while waiting for a pending call to `{name}` to complete"
    return AlreadyPendingCallError, re.escape(text), name


# gymnasium's AsyncVectorEnv spellings: (state, op, (error class, message regex, .name) or None)
ASYNC_SPELLINGS_TABLE = [
    (State.NEEDS_RESET, VectorCall.RESET_ASYNC, None),
    (State.BROKEN, VectorCall.RESET_ASYNC, None),
    (State.READY, VectorCall.STEP_ASYNC, None),
    (State.READY, VectorCall.RESET_ASYNC, None),
    (State.SENT, VectorCall.STEP_WAIT, None),
    (State.RESET_SENT, VectorCall.RESET_WAIT, None),
    (
        State.NEEDS_RESET,
        VectorCall.STEP_ASYNC,
        (StateError, r"cannot call step_async\(\): .*reset", ""),
    ),
    (
        State.BROKEN,
        VectorCall.STEP_ASYNC,
        (StateError, r"cannot call step_async\(\): why; only", ""),
    ),
    (State.READY, VectorCall.STEP_WAIT, _no_call("step")),
    (State.READY, VectorCall.RESET_WAIT, _no_call("reset")),
    (State.NEEDS_RESET, VectorCall.RESET_WAIT, _no_call("reset")),
    (State.SENT, VectorCall.RESET_WAIT, _no_call("reset")),
    (State.RESET_SENT, VectorCall.STEP_WAIT, _no_call("step")),
    (State.BROKEN, VectorCall.STEP_WAIT, _no_call("step")),
    (State.SENT, VectorCall.STEP_ASYNC, _pending("step_async", "step")),
    (State.SENT, VectorCall.RESET_ASYNC, _pending("reset_async", "step")),
    (State.RESET_SENT, VectorCall.STEP_ASYNC, _pending("step_async", "reset")),
    (State.RESET_SENT, VectorCall.RESET_ASYNC, _pending("reset_async", "reset")),
    (
        State.RESET_SENT,
        VectorCall.SEND,
        (StateError, r"cannot call send\(\): a reset is in flight", ""),
    ),
    (
        State.RESET_SENT,
        VectorCall.RECV,
        (StateError, r"cannot call recv\(\): .*reset_wait\(\)", ""),
    ),
    (
        State.RESET_SENT,
        VectorCall.STEP,
        (StateError, r"cannot call step\(\): .*reset_wait\(\)", ""),
    ),
    (State.BUSY, VectorCall.STEP_WAIT, (StateError, "cannot call step_wait.*in flight", "")),
    (State.BUSY, VectorCall.STEP_ASYNC, (StateError, "cannot call step_async.*in flight", "")),
]


@pytest.mark.parametrize(("state", "op", "refusal"), ASYNC_SPELLINGS_TABLE)
def test_lifecycle_table_of_gymnasiums_async_spellings(state, op, refusal):
    life = Lifecycle()
    life.state, life.broken_because = state, "why"
    if refusal is None:
        life.check(op)
        return
    error, pattern, name = refusal
    with pytest.raises(StateError, match=f"^{pattern}") as caught:
        life.check(op)
    assert type(caught.value) is error
    if name:  # gymnasium's errors: .name is the call waited for, or the one pending
        assert caught.value.name == name


def test_no_async_call_error_says_why_nothing_is_pending():
    life = Lifecycle()
    life.break_("step_wait() failed in env 1")
    with pytest.raises(NoAsyncCallError, match=r"Nothing is pending.*BROKEN: step_wait\(\) failed"):
        life.check(VectorCall.STEP_WAIT)


@pytest.mark.parametrize(("state", "op", "error"), LIFECYCLE_TABLE)
def test_lifecycle_table(state, op, error):
    life = Lifecycle()
    life.state = state
    if error is None:
        life.check(op)
    else:
        with pytest.raises(StateError, match=error):
            life.check(op)


@pytest.mark.parametrize("op", list(VectorCall))
def test_closed_allows_nothing(op):
    life = Lifecycle()
    life.state = State.CLOSED
    with pytest.raises(ClosedError, match="closed"):
        life.check(op)


def test_broken_message_says_why():
    life = Lifecycle()
    life.break_("step() failed in env 3")
    with pytest.raises(StateError, match="env 3"):
        life.check(VectorCall.STEP)


def test_a_closed_env_cannot_be_broken_again():
    life = Lifecycle()
    life.state = State.CLOSED
    life.break_("late failure")
    assert life.state is State.CLOSED


# -- validation -----------------------------------------------------------------------

SEEDS_TABLE = [
    (None, 3, [None, None, None]),
    (7, 3, [7, 8, 9]),
    (np.int64(5), 2, [5, 6]),
    ([1, None, 3], 3, [1, None, 3]),
]


@pytest.mark.parametrize(("seed", "n", "expected"), SEEDS_TABLE)
def test_seeds(seed, n, expected):
    assert validate.check_seeds(seed, n) == expected


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [
        ([1, 2], ValueError, "length 2"),
        (-1, ValueError, ">= 0"),
        (1.5, TypeError, "float"),
        (True, TypeError, "bool"),
        ("12", TypeError, "str"),
        ([1, "a", 3], TypeError, r"seed\[1\]"),
    ],
)
def test_bad_seeds(seed, error, match):
    with pytest.raises(error, match=match):
        validate.check_seeds(seed, 3)


def test_a_reset_mask_of_all_true_is_a_full_reset():
    rest, mask = validate.check_options({"reset_mask": np.ones(3, bool), "level": 1}, 3)
    assert (rest, mask) == ({"level": 1}, None)


MASK_MUST = "`options['reset_mask']` must"


@pytest.mark.parametrize(
    ("mask", "error", "message"),
    [  # gymnasium's own messages, which its tests pin
        ([True] * 3, TypeError, "be a numpy array, got <class 'list'>"),
        (np.array([True]), ValueError, "have shape `(3,)`, got (1,)"),
        (np.ones((1, 3), bool), ValueError, "have shape `(3,)`, got (1, 3)"),
        (np.array([1, 1, 0]), TypeError, "have `dtype=np.bool_`, got int64"),
        (
            np.zeros(3, bool),
            ValueError,
            "contain a boolean array with at least one True value, "
            "got reset_mask=[False False False]",
        ),
    ],
)
def test_reset_mask_errors_are_gymnasiums(mask, error, message):
    with pytest.raises(error) as caught:
        validate.check_options({"reset_mask": mask}, 3)
    assert str(caught.value) == f"{MASK_MUST} {message}"


@pytest.mark.parametrize(
    ("hook_says", "explicit", "env_gets"),
    [
        (None, None, None),
        (None, {}, None),  # only a reset_mask: the hook's answer, None included
        (None, {"a": 1}, {"a": 1}),
        ({"a": 1}, None, {"a": 1}),
        ({"a": 1}, {}, {"a": 1}),
        ({"a": 1, "b": 2}, {"b": 3}, {"a": 1, "b": 3}),
    ],
)
def test_reset_options_are_the_hooks_overridden_by_the_calls(hook_says, explicit, env_gets):
    state = AutoresetState(AutoresetMode.DISABLED, 2, lambda i, episode: hook_says)
    assert state.reset_options(1, explicit) == env_gets
    assert AutoresetState(AutoresetMode.DISABLED, 2).reset_options(1, explicit) == explicit


def test_options_never_modify_the_callers_dict():
    mask = np.array([True, False])
    options = {"reset_mask": mask, "level": 2}
    rest, got = validate.check_options(options, 2)
    assert rest == {"level": 2}
    assert got is not mask
    assert np.array_equal(got, mask)
    assert "reset_mask" in options


@pytest.mark.parametrize(
    ("space", "actions", "error"),
    [
        (spaces.Discrete(3), [0, 1], ValueError),
        (spaces.Discrete(3), np.zeros(3, np.float32), TypeError),
        (spaces.Box(0, 1, (2,)), np.zeros((3, 3)), ValueError),
        (spaces.Box(0, 1, (2,)), np.array([["a", "b"]] * 3), TypeError),
        (spaces.MultiBinary(2), np.zeros((3, 2), np.float64), TypeError),
        (spaces.Dict(a=spaces.Discrete(2)), {"b": [0, 0, 0]}, ValueError),
        (spaces.Tuple([spaces.Discrete(2)] * 2), ([0, 0, 0],), TypeError),
        (spaces.Text(5), ["a", "b"], ValueError),
    ],
)
def test_bad_actions_are_named(space, actions, error):
    with pytest.raises(error, match="actions"):
        validate.check_actions(space, actions, 3, "actions")


@pytest.mark.parametrize(
    ("space", "actions"),
    [
        (spaces.Discrete(3), [0, 1, 2]),
        (spaces.Box(0, 1, (2,), np.float32), np.zeros((3, 2), np.float64)),
        (spaces.MultiBinary(2), np.zeros((3, 2), np.bool_)),
        (spaces.Dict(a=spaces.Discrete(2)), {"a": np.zeros(3, np.int64)}),
        (spaces.Text(5), ["a", "b", "c"]),
    ],
)
def test_good_actions_pass(space, actions):
    validate.check_actions(space, actions, 3, "actions")


@pytest.mark.parametrize(
    ("fns", "error", "match"),
    [
        ([], ValueError, "empty"),
        (lambda: None, TypeError, "sequence"),
        ("CartPole-v1", TypeError, "sequence"),
        ([1], TypeError, r"env_fns\[0\]"),
    ],
)
def test_bad_env_fns(fns, error, match):
    with pytest.raises(error, match=match):
        validate.check_env_fns(fns)


def test_an_env_class_is_a_factory():
    class Env:
        def reset(self): ...
        def step(self): ...

    assert validate.check_env_fns([Env]) == [Env]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_bad_timeouts(value):
    with pytest.raises(ValueError, match="step_timeout"):
        validate.check_timeout("step_timeout", value)


# -- batching -------------------------------------------------------------------------


def test_copy_batch_shares_no_memory():
    value = {"a": np.zeros(3), "b": (np.ones(2), np.zeros(1))}
    copied = copy_batch(value)
    assert not np.shares_memory(copied["a"], value["a"])
    assert not np.shares_memory(copied["b"][0], value["b"][0])


def test_step_batch_orders_by_env_index_and_types_arrays():
    batcher = Batcher(spaces.Discrete(5), spaces.Discrete(2), 3, copy=True)
    results = {
        2: (4, 1, 0, 0, {}, None),
        0: (1, 2.5, True, False, {"x": 1}, None),
        1: (3, -1, False, True, {}, None),
    }
    obs, rewards, terminations, truncations, infos = batcher.step_batch(range(3), results)
    assert obs.tolist() == [1, 3, 4]
    assert rewards.dtype == np.float64
    assert rewards.tolist() == [2.5, -1.0, 1.0]
    assert terminations.tolist() == [True, False, False]
    assert truncations.tolist() == [False, True, False]
    assert infos["x"].tolist() == [1, 0, 0]
    assert infos["_x"].tolist() == [True, False, False]


def test_copy_false_may_return_a_reused_buffer():
    batcher = Batcher(spaces.Discrete(3), spaces.Discrete(2), 2, copy=False)
    first, _ = batcher.reset_batch(range(2), {0: (0, {}), 1: (1, {})})
    second, _ = batcher.reset_batch([0], {0: (2, {})})
    assert first is second
    assert second.tolist() == [2, 1]


def test_box_observations_are_fresh_arrays_even_without_copy():
    batcher = Batcher(spaces.Box(0, 1, (2,)), spaces.Discrete(2), 2, copy=False)
    first, _ = batcher.reset_batch(range(2), {0: (np.zeros(2), {}), 1: (np.ones(2), {})})
    second, _ = batcher.reset_batch([0], {0: (np.ones(2), {})})
    assert first.tolist() == [[0, 0], [1, 1]]
    assert second.tolist() == [[1, 1], [1, 1]]


# -- the Box fast path behaves exactly like gymnasium's concatenate ---------------------

from gymnasium.vector.utils import concatenate, create_empty_array  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aiovec._core.batching import stack_box  # noqa: E402

DTYPES = [np.float32, np.float64, np.int64, np.uint8, np.int8, np.bool_]


@settings(max_examples=120, deadline=None)
@given(
    space_dtype=st.sampled_from(DTYPES),
    item_dtype=st.sampled_from([*DTYPES, np.complex64]),
    shape=st.lists(st.integers(0, 3), max_size=3).map(tuple),
    item_shape_delta=st.sampled_from([0, 0, 0, 1]),
    n=st.integers(1, 4),
    as_lists=st.booleans(),
)
def test_stack_box_equals_gymnasium_concatenate(
    space_dtype, item_dtype, shape, item_shape_delta, n, as_lists
):
    space = spaces.Box(0, 1, shape, dtype=space_dtype)
    item_shape = (*shape, 1) if item_shape_delta else shape
    items = [np.full(item_shape, k % 2, dtype=item_dtype) for k in range(n)]
    if as_lists:
        items = [item.tolist() for item in items]
    buffer = create_empty_array(space, n=n, fn=np.zeros)
    try:
        expected = concatenate(space, items, buffer).copy()
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            stack_box(items, buffer.shape, buffer.dtype)
        return
    got = stack_box(items, buffer.shape, buffer.dtype)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert np.array_equal(got, expected)


# -- latency bookkeeping --------------------------------------------------------------

from aiovec._core.latency import LatencyBook  # noqa: E402


def test_latency_summary_per_env_and_overall():
    book = LatencyBook(3, window=4)
    for seconds in (0.1, 0.2, 0.3):
        book.record(0, seconds)
    for seconds in (1.0, 2.0, 3.0, 4.0, 5.0):  # one more than the window: the oldest goes
        book.record(2, seconds)
    stats = book.summary()
    assert stats.count.tolist() == [3, 0, 4]
    assert stats.p50[0] == pytest.approx(0.2)
    assert np.isnan(stats.p50[1])
    assert stats.mean[2] == pytest.approx(3.5)
    assert stats.slowest(2) == [2, 0]
    assert stats.overall_p50 == pytest.approx(np.median([0.1, 0.2, 0.3, 2, 3, 4, 5]))
    book.clear()
    assert np.isnan(book.summary().overall_p99)


def test_latency_shared_and_single_samples_keep_their_order():
    book = LatencyBook(3, window=4)
    whole = range(3)
    for seconds in (1.0, 2.0, 3.0):  # whole steps: listed, not yet spread
        book.record_many(whole, seconds)
    book.record(1, 10.0)  # a single sample comes after them
    book.record_many(whole, 4.0)
    book.record_many([2, 0], 5.0)
    stats = book.summary()
    assert stats.count.tolist() == [4, 4, 4]
    # env 0: 2, 3, 4, 5; env 1: 2, 3, 10, 4; env 2: 2, 3, 4, 5
    assert stats.mean.tolist() == pytest.approx([3.5, 4.75, 3.5])
    assert stats.p99[1] == pytest.approx(np.percentile([2.0, 3.0, 10.0, 4.0], 99))


def test_latency_of_many_more_whole_steps_than_the_window():
    book = LatencyBook(2, window=8)
    for k in range(100):  # spread in batches as they pile up
        book.record_many(range(2), float(k))
    stats = book.summary()
    assert stats.count.tolist() == [8, 8]
    assert stats.mean.tolist() == pytest.approx([95.5, 95.5])  # the last 8: 92..99
    book.record_many(range(2), 1.0)
    book.clear()
    assert book.summary().count.tolist() == [0, 0]


def test_latency_of_envs_that_ended_together():
    book = LatencyBook(5, window=2)
    book.record_many(range(1, 4), 1.0)  # a worker's group
    book.record_many([4, 0], 2.0)  # any envs
    book.record_many(range(2, 4), 3.0)
    book.record_many(range(3, 4), 4.0)  # one more than the window: the oldest goes
    stats = book.summary()
    assert stats.count.tolist() == [1, 1, 2, 2, 1]
    assert stats.mean.tolist() == pytest.approx([2.0, 1.0, 2.0, 3.5, 2.0])


def test_latency_of_two_groups_that_alternate():
    """A pipelined loop's samples: two disjoint groups in turn, spread group by group."""
    book = LatencyBook(4, window=8)
    first, second = range(0, 2), range(2, 4)
    for k in range(19):
        book.record_many(first if k % 2 == 0 else second, float(k))
    book.record(1, 100.0)  # spreads the samples listed so far first: it comes last
    stats = book.summary()
    assert stats.count.tolist() == [8, 8, 8, 8]
    # envs 0-1: 4, 6, ..., 18 (and env 1: 6, ..., 18, 100); envs 2-3: 3, 5, ..., 17
    assert stats.mean.tolist() == pytest.approx([11.0, 23.0, 10.0, 10.0])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("one"), st.integers(0, 4)),
            st.tuples(st.just("many"), st.sampled_from(range(4))),  # a kept set, reused
            st.tuples(st.just("new"), st.sets(st.integers(0, 4), min_size=1)),
        ),
        max_size=40,
    )
)
def test_latency_keeps_each_envs_last_window_samples_in_order(calls):
    """Against a deque per env fed sample by sample: sets that alternate, overlap or repeat."""
    kept = [range(0, 2), range(2, 5), [1, 2], [4, 0]]  # disjoint and overlapping sets
    book, model = LatencyBook(5, window=3), [collections.deque(maxlen=3) for _ in range(5)]
    for t, (kind, arg) in enumerate(calls):
        seconds = float(t)
        if kind == "one":
            book.record(arg, seconds)
            model[arg].append(seconds)
            continue
        envs = kept[arg] if kind == "many" else sorted(arg)
        book.record_many(envs, seconds)
        for i in envs:
            model[i].append(seconds)
        if t % 7 == 6:  # spread now and then, as a full list of shared samples would
            book._spread()
    stats = book.summary()
    assert stats.count.tolist() == [len(samples) for samples in model]
    for i, samples in enumerate(model):
        if samples:
            assert stats.mean[i] == pytest.approx(np.mean(samples))
            assert stats.p99[i] == pytest.approx(np.percentile(list(samples), 99))


# -- the step-result check hands what it made to the batcher ----------------------------


def test_a_clean_batch_is_handed_to_the_batcher_once_only_as_checked_in_env_order():
    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    checker = validate.step_result_checker(space)
    row = (np.zeros(2, np.float32), 1.0, False, False, {}, None)
    results = {0: row, 1: row}
    assert checker(results) == {}
    clean = checker.clean_columns(results, (0, 1))
    assert clean is not None
    columns, stacked = clean
    assert columns[1] == (1.0, 1.0)
    assert stacked.shape == (2, 2)
    assert stacked.dtype == np.float32
    assert checker.clean_columns(results, (0, 1)) is None  # handed over once
    assert checker(results) == {}
    assert checker.clean_columns(dict(results), (0, 1)) is None  # another mapping
    reordered = {1: row, 0: row}
    assert checker(reordered) == {}
    assert checker.clean_columns(reordered, (0, 1)) is None  # not in env order
    bad = {0: row, 1: (np.zeros(3, np.float32), 1.0, False, False, {}, None)}
    assert set(checker(bad)) == {1}
    assert checker.clean_columns(bad, (0, 1)) is None  # nothing clean to hand over
    batcher = Batcher(space, spaces.Discrete(2), 2, copy=True)
    assert checker(results) == {}
    got = batcher.step_batch(range(2), results, checker.clean_columns(results, (0, 1)))
    want = Batcher(space, spaces.Discrete(2), 2, copy=True).step_batch(range(2), results)
    for g, w in zip(got[:4], want[:4], strict=True):
        assert np.array_equal(g, w)
        assert g.dtype == w.dtype


# -- per-env deadlines: (starts, now) -> late envs and the next wait -------------------

DEADLINES = [
    # starts (None: queued for a slot), now, late, wait   (timeout = 1.0)
    ({0: 0.0, 1: 0.0}, 0.25, [], 0.75),
    ({0: 0.0, 1: 0.5}, 1.0, [0], 0.5),  # env 1 started later: it has time left
    ({0: 0.0, 1: None}, 1.0, [0], 1.0),  # a queued env is never late; look again in 1 s
    ({0: None, 1: None}, 5.0, [], 1.0),
    ({0: 3.5, 1: 0.0, 2: 3.25}, 4.0, [1], 0.25),
    ({}, 0.0, [], None),  # no deadline to wait for
]


@pytest.mark.parametrize(("starts", "now", "late", "wait"), DEADLINES)
def test_each_env_is_due_timeout_after_its_own_start(starts, now, late, wait):
    assert overdue(((i, start, 1.0) for i, start in starts.items()), now) == (late, wait)


def test_each_env_has_a_timeout_of_its_own():
    """A reset (an autoreset too) is due after ``reset_timeout``, a step after ``step_timeout``."""
    starts = [(0, 0.0, 0.2), (1, 0.0, 5.0), (2, 0.0, None), (3, None, 0.2)]
    assert overdue(starts, 0.5) == ([0], 0.2)  # env 1 has 4.5 s left; env 2 no deadline
    assert overdue([(2, 0.0, None)], 100.0) == ([], None)


def test_latency_and_restart_books_take_no_memory_per_env_until_used():
    """At 100,000 envs an empty deque per env was 150 MB (docs/performance.md).

    The bound is per env, so 10,000 envs check it as well as 100,000 (an empty
    deque is 760 bytes, 76 times the bound) at a tenth of the time: ``summary()``
    below walks every env.
    """
    import tracemalloc

    from aiovec._core.restart import RestartBook, RestartPolicy

    n = 10_000
    tracemalloc.start()
    try:
        books = LatencyBook(n), RestartBook(RestartPolicy(), n)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert used < n * 10  # a list slot per env (8 bytes) at most
    latency, restarts = books
    latency.record(7, 0.5)
    assert restarts.may_restart(7)
    restarts.record([7])
    assert latency.summary().count[7] == 1
    assert latency.summary().count.sum() == 1


def test_an_outage_counts_failures_and_says_at_most_one_line_per_interval():
    from aiovec._core.restart import CALM_STEPS, SAY_EVERY, Outage

    outage = Outage(since=100.0, said=100.0)
    outage.failed([(3, ConnectionResetError()), (1, TimeoutError())])
    outage.failed([(3, ConnectionResetError())])
    outage.restarts += 5
    assert outage.envs == {1, 3}
    assert outage.counts() == "5 restarts; 3 failures: ConnectionResetError x2, TimeoutError x1"
    assert not outage.due(100.0 + SAY_EVERY / 2)  # said as it started
    assert outage.due(100.0 + SAY_EVERY)
    assert not outage.due(100.0 + SAY_EVERY * 1.5)  # counted from the last line
    assert [outage.calmed() for _ in range(CALM_STEPS)][-1]
    outage.calm = 0
    for _ in range(CALM_STEPS - 1):
        assert not outage.calmed()
    outage.failed([(1, TimeoutError())])  # a failure starts the calm steps over
    assert not outage.calmed()


def test_frequent_outages_are_summed_up_in_one_line_per_interval():
    from aiovec._core.restart import FREQUENT, SUMMARY_EVERY, OutageLog

    log = OutageLog()
    t = 0.0
    for _ in range(FREQUENT):  # a few a minute: each says its start and its end
        outage, say, last = log.start(t)
        assert (outage.own, say, last) == (True, True, None)
        assert log.ended(outage, t + 0.5) is None
        t += 1.0
    outage, say, last = log.start(t)  # one more within the interval: summing starts, said
    assert (outage.own, say, last) == (False, True, None)
    outage.failed([(2, RuntimeError())])
    outage.restarts = 1
    assert log.ended(outage, t + 0.5) is None  # counted; a line is not due yet
    start = t
    tallies = []
    for k in range(60):  # one outage a second: nothing said but a tally each interval
        t += 1.0
        outage, say, last = log.start(t)
        assert (outage.own, say, last) == (False, False, None)
        outage.failed([(k % 5, TimeoutError())])
        outage.restarts = 2
        tally = log.ended(outage, t + 0.5)
        if tally is not None:
            tallies.append((t + 0.5, tally))
    ((when, tally),) = tallies
    assert when - start >= SUMMARY_EVERY
    assert tally.outages == 1 + int(when - 0.5 - start)
    assert tally.envs == {0, 1, 2, 3, 4}
    assert tally.causes == {"RuntimeError": 1, "TimeoutError": tally.outages - 1}
    assert tally.restarts == 1 + 2 * (tally.outages - 1)
    # Quiet for an interval: the next outage says its own lines, after the last tally.
    outage, say, last = log.start(t + SUMMARY_EVERY + 1.0)
    assert (outage.own, say) == (True, True)
    assert last is not None
    assert last.outages == 60 - tally.outages + 1
