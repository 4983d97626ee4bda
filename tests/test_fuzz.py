"""Bad-input fuzzing: random actions, seeds, options and call orders, every backend and front end.

Each example builds a fresh aiovec vector env (the front end and backend of the
test) and gymnasium's ``SyncVectorEnv`` oracle over the same :class:`Counted`
envs, feeds both one hypothesis-drawn call, and checks the property:

- the call works, and gives exactly the oracle's result; or it raises a
  documented error: ``ValueError``/``TypeError`` for bad arguments (naming the
  argument), :class:`aiovec.StateError` for a call not allowed now
  (:class:`aiovec.ClosedError` after ``close()``), :class:`aiovec.EnvError`
  when an env itself fails on what it was given (as the oracle's env fails);
- a rejected call touches no env (every env counts its calls);
- afterwards the vector env is consistent: further steps (after a reset where
  the contract demands one) match the oracle's, and nothing is leaked.

Whether an input is valid is decided here, from the contract, before the call
(:func:`action_verdict`, :func:`seed_is_valid`, :func:`options_verdict`); the
oracle only runs valid calls.  The process backend gets fewer examples: each
one starts worker processes.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from conftest import (
    BACKENDS,
    FRONT_ENDS,
    SPACES,
    AwaitFrontEnd,
    FrontEnd,
    Lockstep,
    assert_results_equal,
    assert_same,
    open_front_end,
)
from faults.leaks import checking
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from hypothesis import example, given, settings
from hypothesis import strategies as st

import aiovec
from aiovec.testing import SpaceEnv

NUM_ENVS = 3
# Ray is left out: its conformance and fault suites run on it, and its client's own
# sockets, opened on first use, would read as leaks here.
EXAMPLES = {"inline": 12, "thread": 8, "process": 4}
SETUPS = [
    pytest.param(backend, front_end, id=f"{backend}-{front_end}")
    for backend in BACKENDS
    if backend in EXAMPLES
    for front_end in FRONT_ENDS
]
ARGUMENT_ERRORS = (ValueError, TypeError)  # ValueError includes StateError and ClosedError


def fuzz(
    backend: str, *, examples: Sequence[dict[str, Any]] = (), **strategies: Any
) -> Callable[[Callable[..., None]], Callable[[], None]]:
    """``@given(**strategies)`` with the backend's example count, every example leak-checked.

    ``examples`` (keyword arguments of the body) always run first, so every
    error path is taken in every run, whatever hypothesis draws.  Used on a
    function inside the test (a decorator on the test itself cannot see the
    backend it is parametrized with); no pytest fixture is involved.
    """

    def decorate(body: Callable[..., None]) -> Callable[[], None]:
        @functools.wraps(body)
        def leak_checked(**drawn: Any) -> None:
            with checking():
                body(**drawn)  # returns before the check: its frame holds no vector env

        run = given(**strategies)(leak_checked)
        for kwargs in reversed(examples):
            run = example(**kwargs)(run)
        return settings(max_examples=EXAMPLES[backend], deadline=None)(run)

    return decorate


class Counted(SpaceEnv):
    """A :class:`SpaceEnv` that counts every ``reset`` and ``step`` it gets.

    Its reward sums the action: numpy's floating-point warnings (``inf - inf``)
    are silenced, so that out-of-bounds actions give a NaN or infinite reward,
    as in the oracle, rather than an env error under ``filterwarnings = error``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def reset(self, **kwargs: Any) -> Any:
        self.calls += 1
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.calls += 1
        with np.errstate(all="ignore"):
            return super().step(action)


def counted_fns(space: str) -> list[Callable[[], Counted]]:
    obs_space, act_space = SPACES[space]
    return [functools.partial(Counted, obs_space, act_space, min_len=2, max_len=5)] * NUM_ENVS


@contextmanager
def pair(backend: str, front_end: str, space: str = "box-discrete") -> Iterator[Lockstep]:
    """aiovec and the oracle over the same counted envs, both closed at the end."""
    fns = counted_fns(space)
    venv = open_front_end(front_end, fns, backend=backend)
    try:
        oracle = SyncVectorEnv(fns)
        try:
            yield Lockstep(venv, oracle, action_seed=3)
        finally:
            oracle.close()
    finally:
        venv.shutdown()


def calls(venv: FrontEnd) -> tuple[int, ...]:
    """How many resets and steps each env has had."""
    return tuple(venv.get_attr("calls"))


def assert_in_sync(lock: Lockstep) -> None:
    """aiovec's envs had exactly the calls the oracle's had: nothing ran that should not have."""
    assert calls(lock.venv) == tuple(lock.oracle.get_attr("calls"))


def assert_rejected(
    lock: Lockstep, call: Callable[[], Any], errors: Any, match: str | None = None
) -> BaseException:
    """``call()`` raises one of ``errors`` (matching ``match``) and no env was touched."""
    before = calls(lock.venv)
    with pytest.raises(errors, match=match) as info:
        call()
    assert calls(lock.venv) == before, "a rejected call touched an env"
    return info.value


def assert_consistent(lock: Lockstep, seed: int, *, steps: int = 4) -> None:
    """A few more steps (and a reset, then steps again) agree with the oracle."""
    for _ in range(steps):
        lock.step()
    lock.reset(seed=seed)
    for _ in range(steps):
        lock.step()


# --------------------------------------------------------------------------- actions

FLOAT_VALUES = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.sampled_from(
    [math.nan, math.inf, -math.inf, 1e30, -7.5]
)
INT_VALUES = st.integers(-5, 8) | st.sampled_from([2**31, -(2**31), 2**62])


@st.composite
def action_batches(draw: st.DrawFn, space: spaces.Space[Any]) -> Any:
    """A batch of actions for ``space``: well formed, out of the space, or malformed."""
    row_shape = space.shape or ()
    kind = draw(
        st.sampled_from(
            [
                "valid",
                "out-of-space",
                "wrong-length",
                "extra-axis",
                "scalar",
                "wrong-dtype",
                "python-list",
                "list-with-none",
                "none",
                "string",
                "dict",
            ]
        )
    )
    length = NUM_ENVS
    if kind == "wrong-length":
        length = draw(st.sampled_from([0, 1, NUM_ENVS - 1, NUM_ENVS + 1, 2 * NUM_ENVS]))
    shape = (length, *row_shape)
    ints = isinstance(space, spaces.Discrete)
    if kind in ("valid", "out-of-space", "wrong-length"):
        if kind == "valid" and ints:
            values = st.integers(0, int(space.n) - 1)
        elif kind == "valid":
            values = st.floats(float(space.low.min()), float(space.high.max()), width=32)
        else:
            values = INT_VALUES if ints else FLOAT_VALUES
        dtypes = ["int64", "int32", "uint8"] if kind == "valid" else ["int64"]
        dtype = draw(st.sampled_from(dtypes if ints else ["float32", "float64"]))
        flat = draw(st.lists(values, min_size=math.prod(shape), max_size=math.prod(shape)))
        return np.array(flat, dtype=dtype).reshape(shape)
    if kind == "extra-axis":
        return np.zeros((*shape, draw(st.integers(1, 3))), dtype=np.int64)
    if kind == "scalar":
        return draw(st.sampled_from([np.int64(1), 1, 0.5]))
    if kind == "wrong-dtype":
        dtype = draw(st.sampled_from(["float64", "complex128", "U1", "object"] if ints else ["U1"]))
        return np.zeros(shape, dtype=dtype)
    if kind == "python-list":
        return np.zeros(shape, dtype=np.int64 if ints else np.float32).tolist()
    if kind == "list-with-none":
        return [0] * (NUM_ENVS - 1) + [None]
    if kind == "dict":
        return {"actions": np.zeros(shape)}
    return None if kind == "none" else "0" * NUM_ENVS


def action_verdict(space: spaces.Space[Any], actions: Any) -> str:
    """What the contract says about ``actions``: ``"bad"`` (refused) or ``"ok"`` (passed on).

    Shape and dtype are checked (one action per env, the single space's shape,
    numbers of the right kind); values are not, as gymnasium does not.
    """
    if isinstance(actions, str | dict) or actions is None:
        return "bad"
    array = np.asarray(actions)
    allowed = "iu" if isinstance(space, spaces.Discrete) else "biuf"
    if array.shape != (NUM_ENVS, *(space.shape or ())) or array.dtype.kind not in allowed:
        return "bad"
    return "ok"


def failing_rows(space: spaces.Space[Any], actions: Any) -> dict[int, type[BaseException]]:
    """Rows whose action a single env cannot take (``SpaceEnv`` flattens it): index -> error."""
    failing = {}
    for i, action in enumerate(np.asarray(actions)):
        try:
            spaces.flatten(space, action)
        except Exception as exc:
            failing[i] = type(exc)
    return failing


ACTION_EXAMPLES = {
    "box-discrete": [
        {"actions": np.array([0, 1]), "seed": 1},  # one action too few
        {"actions": np.array([0.0, 1.0, 2.0]), "seed": 1},  # floats for Discrete
        {"actions": np.array([0, 1, 3]), "seed": 1},  # env 2 cannot take 3
        {"actions": np.array([9, -1, 2**40]), "seed": 1},  # envs 0 and 2 fail; -1 is taken
        {"actions": [2, None, 1], "seed": 1},
        {"actions": None, "seed": 1},
    ],
    "image-box": [
        {"actions": np.full((NUM_ENVS, 2), np.nan, np.float32), "seed": 1},
        {"actions": np.array([[1e30, -np.inf]] * NUM_ENVS), "seed": 1},  # out of bounds
        {"actions": [[0.5, 0.5]] * NUM_ENVS, "seed": 1},  # a python list
        {"actions": np.zeros((NUM_ENVS, 3), np.float32), "seed": 1},
    ],
}


@pytest.mark.parametrize("space", ["box-discrete", "image-box"])
@pytest.mark.parametrize(("backend", "front_end"), SETUPS)
def test_random_action_batches(backend: str, front_end: str, space: str) -> None:
    act_space = SPACES[space][1]

    @fuzz(
        backend,
        examples=ACTION_EXAMPLES[space],
        actions=action_batches(act_space),
        seed=st.integers(0, 2**31 - 1),
    )
    def check(actions: Any, seed: int) -> None:
        with pair(backend, front_end, space) as lock:
            lock.reset(seed=seed)
            lock.step()
            step_with(lock, act_space, actions)
            assert_consistent(lock, seed + 1)

    check()


def step_with(lock: Lockstep, act_space: spaces.Space[Any], actions: Any) -> None:
    """Step with fuzzed ``actions``: refused, the oracle's result, or the env's own failure."""
    if action_verdict(act_space, actions) == "bad":
        error = assert_rejected(
            lock, lambda: lock.venv.step(copy.deepcopy(actions)), ARGUMENT_ERRORS
        )
        assert "action" in str(error), f"the error must name the actions: {error}"
        return
    ended = lock.ended()  # their actions are ignored: they are reset instead
    failing = {i: e for i, e in failing_rows(act_space, actions).items() if not ended[i]}
    if not failing:  # out-of-space values the env accepts: the oracle's result, NaN included
        lock.step(actions)
        return
    with pytest.raises(failing[min(failing)]):  # SyncVectorEnv stops at the first failing env
        lock.oracle.step(copy.deepcopy(actions))
    with pytest.raises(aiovec.EnvError) as info:
        lock.venv.step(copy.deepcopy(actions))
    assert set(info.value.errors) == set(failing), "the error must name every failing env"
    assert info.value.env_index == min(failing)
    for i, error in info.value.errors.items():
        assert isinstance(error, failing[i]), f"env {i}: {error!r}"
    # A step that failed half-way leaves aiovec needing a full reset.
    with pytest.raises(aiovec.StateError, match=r"reset\(\)"):
        lock.venv.step(lock.sample())
    lock.reset(seed=0)


# --------------------------------------------------------------------------- seeds and options

SEEDS = (
    st.none()
    | st.integers(0, 2**63)
    | st.integers(-(2**40), -1)
    | st.integers(2**64, 2**80)
    | st.floats(allow_nan=True)
    | st.booleans()
    | st.text(max_size=3)
    | st.lists(st.none() | st.integers(-3, 2**40), max_size=NUM_ENVS + 2)
    | st.tuples(*[st.integers(0, 100)] * NUM_ENVS)
    | st.lists(st.floats(0, 10), min_size=NUM_ENVS, max_size=NUM_ENVS)
)


def seed_is_valid(seed: Any) -> bool:
    """The contract: ``None``, an int >= 0, or one such seed (or ``None``) per env."""

    def one(s: Any) -> bool:
        return s is None or (type(s) is int and s >= 0)

    if isinstance(seed, list | tuple):
        return len(seed) == NUM_ENVS and all(map(one, seed))
    return one(seed)


MASKS = st.lists(st.booleans(), min_size=0, max_size=NUM_ENVS + 1).map(np.array) | st.lists(
    st.integers(0, 1), min_size=NUM_ENVS, max_size=NUM_ENVS
).map(lambda m: np.array(m, dtype=np.int64))
OPTIONS = (
    st.none()
    | st.just({})
    | st.fixed_dictionaries({"length": st.integers(1, 6)})
    | st.fixed_dictionaries({"reset_mask": MASKS})
    | st.sampled_from([[], "reset_mask", 3])
)


RESET_EXAMPLES = [
    (-1, None),
    ([1, 2], None),
    ([1, 2, -3], None),
    (2**70, None),
    (1.0, None),
    (True, None),
    ([None, 4, None], {"reset_mask": np.array([True, False, True])}),
    (None, {"reset_mask": np.zeros(NUM_ENVS, dtype=bool)}),
    (None, {"reset_mask": np.ones(NUM_ENVS, dtype=np.int64)}),
    (None, "reset_mask"),
]


def options_verdict(options: Any) -> str:
    """``"bad"``, ``"ok"`` (a full reset) or ``"masked"`` (a valid ``reset_mask``)."""
    if options is None:
        return "ok"
    if not isinstance(options, dict):
        return "bad"
    if "reset_mask" not in options:
        return "ok"
    mask = options["reset_mask"]
    if mask.shape != (NUM_ENVS,) or mask.dtype != np.bool_ or not mask.any():
        return "bad"
    return "masked"


@pytest.mark.parametrize(("backend", "front_end"), SETUPS)
def test_random_seeds_and_options(backend: str, front_end: str) -> None:
    @fuzz(
        backend,
        examples=[
            {"seed": seed, "options": options, "first": 5} for seed, options in RESET_EXAMPLES
        ],
        seed=SEEDS,
        options=OPTIONS,
        first=st.integers(0, 2**31 - 1),
    )
    def check(seed: Any, options: Any, first: int) -> None:
        kwargs = {"seed": seed, "options": options}
        verdict = options_verdict(options) if seed_is_valid(seed) else "bad"
        with pair(backend, front_end) as lock:
            lock.reset(seed=first)
            lock.step()
            if verdict == "bad":
                error = assert_rejected(lock, lambda: lock.venv.reset(**kwargs), ARGUMENT_ERRORS)
                named = {"options"} if seed_is_valid(seed) else {"seed", "options"}
                if options_verdict(options) != "bad":
                    named = {"seed"}
                assert any(n in str(error) for n in named), f"{error} names none of {named}"
            else:
                lock.reset(**kwargs)
            assert_consistent(lock, first + 1)

    check()


# --------------------------------------------------------------------------- call orders

STEP, RESET, CLOSE, SEND, RECV, INSPECT, OVERLAP = (
    "step",
    "reset",
    "close",
    "send",
    "recv",
    "get_attr",
    "overlapping-step",
)
NEEDS_RESET, READY, SENT, CLOSED = "needs-reset", "ready", "sent", "closed"
ALLOWED = {
    NEEDS_RESET: {RESET, INSPECT, CLOSE},
    READY: {STEP, RESET, CLOSE, SEND, INSPECT, OVERLAP},
    SENT: {RECV, CLOSE},
    CLOSED: {CLOSE},
}


class Program:
    """Runs one call on aiovec and, where the model allows it, on the oracle."""

    def __init__(self, lock: Lockstep) -> None:
        self.lock = lock
        self.state = NEEDS_RESET
        self.sent: tuple[Any, ...] | None = None  # the oracle's step for the envs in flight

    def run(self, op: str, value: int) -> None:
        if op not in ALLOWED[self.state]:
            self.refused(op, value)
        else:
            getattr(self, op.replace("-", "_"))(value)

    def refused(self, op: str, value: int) -> None:
        """``op`` is not allowed now: ``StateError`` (``ClosedError`` once closed), nothing runs."""
        error = aiovec.ClosedError if self.state == CLOSED else aiovec.StateError
        venv = self.lock.venv
        call = {
            STEP: lambda: venv.step(self.lock.sample()),
            OVERLAP: lambda: venv.step(self.lock.sample()),
            RESET: lambda: venv.reset(seed=value),
            SEND: lambda: self.send_call(self.lock.sample()),
            RECV: self.recv_call,
            INSPECT: lambda: venv.get_attr("calls"),
        }[op]
        if self.state == READY or self.state == NEEDS_RESET:
            assert_rejected(self.lock, call, error)
        else:  # the counters cannot be read now; assert_in_sync checks them later
            with pytest.raises(error):
                call()

    def step(self, value: int) -> None:
        self.lock.step()

    def reset(self, value: int) -> None:
        self.lock.reset(seed=value)
        self.state = READY

    def close(self, value: int) -> None:
        venv = self.lock.venv
        if self.state == SENT and not isinstance(venv, AwaitFrontEnd):  # as AsyncVectorEnv
            with pytest.warns(UserWarning, match="pending call to `step` to complete"):
                assert venv.close() is None
        else:
            assert venv.close() is None
        assert venv.closed
        self.state = CLOSED

    def get_attr(self, value: int) -> None:
        assert_in_sync(self.lock)

    def send_call(self, actions: Any) -> None:
        venv = self.lock.venv
        if isinstance(venv, AwaitFrontEnd):  # send() starts envs on the running loop
            venv.run(_in_loop(venv.venv.send, actions))
        else:
            venv.send(actions)

    def recv_call(self) -> Any:
        venv = self.lock.venv
        if isinstance(venv, AwaitFrontEnd):
            return venv.run(venv.venv.recv())
        return venv.recv()

    def send(self, value: int) -> None:
        actions = self.lock.sample()
        self.sent = self.lock.oracle.step(copy.deepcopy(actions))
        self.send_call(actions)
        self.state = SENT

    def recv(self, value: int) -> None:
        *got, env_ids = self.recv_call()
        assert self.sent is not None
        assert_results_equal(tuple(got), self.sent)
        assert_same(env_ids, np.arange(NUM_ENVS))
        self.lock.last, self.state, self.sent = self.sent, READY, None

    def overlapping_step(self, value: int) -> None:
        """Two steps at once: the second is refused, or runs after the first has finished."""
        if not isinstance(self.lock.venv, AwaitFrontEnd):
            self.step(value)  # a blocking call cannot overlap another
            return
        first, second = self.lock.sample(), self.lock.sample()
        want = self.lock.oracle.step(copy.deepcopy(first))
        got_first, got_second = self.lock.venv.run(_both(self.lock.venv.venv, first, second))
        assert_results_equal(got_first, want)
        if isinstance(got_second, BaseException):
            assert isinstance(got_second, aiovec.StateError), repr(got_second)
            assert "in flight" in str(got_second)
            assert_in_sync(self.lock)  # the refused step ran nothing
            self.lock.last = want
        else:
            self.lock.last = self.lock.oracle.step(copy.deepcopy(second))
            assert_results_equal(got_second, self.lock.last)


async def _in_loop(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


async def _both(venv: aiovec.AsyncioVectorEnv, first: Any, second: Any) -> list[Any]:
    return await asyncio.gather(venv.step(first), venv.step(second), return_exceptions=True)


PROGRAM_EXAMPLES = [
    [(STEP, 0), (SEND, 0), (RECV, 0), (INSPECT, 0)],  # before the first reset
    [(RESET, 1), (SEND, 0), (SEND, 0), (STEP, 0), (RESET, 2), (INSPECT, 0), (RECV, 0)],
    [(RESET, 1), (RECV, 0), (OVERLAP, 0), (OVERLAP, 0)],
    [(RESET, 1), (CLOSE, 0), (CLOSE, 0), (STEP, 0)],
    [(RESET, 1), (SEND, 0), (CLOSE, 0)],
]
OPS = st.sampled_from([STEP, STEP, STEP, RESET, SEND, RECV, RECV, INSPECT, OVERLAP, CLOSE])


@pytest.mark.parametrize(("backend", "front_end"), SETUPS)
def test_random_call_orders(backend: str, front_end: str) -> None:
    ops = st.lists(st.tuples(OPS, st.integers(0, 2**31 - 1)), min_size=1, max_size=14)

    @fuzz(backend, examples=[{"program": p} for p in PROGRAM_EXAMPLES], program=ops)
    def check(program: list[tuple[str, int]]) -> None:
        with pair(backend, front_end) as lock:
            model = Program(lock)
            for op, value in program:
                model.run(op, value)
            if model.state == SENT:
                model.recv(0)
            if model.state == NEEDS_RESET:
                model.reset(0)
            if model.state != CLOSED:
                assert_in_sync(lock)
                assert_consistent(lock, 1)
            model.close(0)
            model.close(0)  # a second close is a no-op
            for op in (STEP, RESET, SEND, RECV, INSPECT, OVERLAP):
                model.refused(op, 0)

    check()
