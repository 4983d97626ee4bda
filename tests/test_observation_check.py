"""An observation that does not fit its space is refused, naming the env, the call and the misfit.

Shapes and dtypes are checked in every reset and step result (a batch cannot
be made without them); values (bounds, as gymnasium's ``Space.contains``) in
the first reset's and the first step's, and in every call's with
``check_observations=True`` (``False``: never).  The rule itself
(``aiovec._core.fits``) is tested without a loop; the refusals run over every
backend x front end x env flavour (``make_venv``), the process backend's shared
rows included (observations of the exact shape and dtype come back as blocks).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import aiovec
from aiovec._core.fits import ResultCheck, misfit, rows_fit
from aiovec._core.rows import Rows, StepBlock
from aiovec.testing import SpaceEnv

pytestmark = pytest.mark.timeout(60)

BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)
IMAGE = spaces.Box(0, 255, (2, 2), np.uint8)
DISCRETE = spaces.Discrete(4, start=-1)
MULTI = spaces.MultiDiscrete([2, 3])
BINARY = spaces.MultiBinary(3)
DICT = spaces.Dict({"pos": BOX, "inner": spaces.Tuple((DISCRETE, MULTI))})


def f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


# --------------------------------------------------------------------------- the rule

FITS = [
    (BOX, f32(-1, 0, 1)),  # the bounds themselves
    (BOX, np.array([1.00000001, 0, 0])),  # float64 that rounds onto the float32 bound
    (BOX, [0.5, 0.5, 0.5]),  # a list, as the batcher takes it
    (IMAGE, np.full((2, 2), 255, np.uint16)),  # a wider dtype, of uint8 values
    (spaces.Box(-np.inf, np.inf, (2,)), f32(np.inf, -np.inf)),
    (DISCRETE, -1),
    (DISCRETE, np.int32(2)),
    (DISCRETE, True),  # a bool is 1
    (BINARY, np.array([False, True, True])),
    (MULTI, np.array([1, 2])),
    (BINARY, np.array([0, 1, 1], np.int8)),
    (DICT, {"pos": f32(0, 0, 0), "inner": (0, np.array([1, 0]))}),
    (spaces.Text(3), "ab"),
    (spaces.Text(3), "abcd"),  # other spaces: their values are not looked at
    (spaces.Sequence(DISCRETE), (7, 8)),
]

MISFITS = [
    (BOX, f32(0, 1.5, 0), "observation[1] = 1.5 is above its high bound 1.0"),
    (BOX, f32(0, 0, -2), "observation[2] = -2.0 is below its low bound -1.0"),
    (BOX, f32(np.nan, 0, 0), "observation[0] = nan is NaN, which no Box holds"),
    (BOX, np.array([0, 0, 1e40]), "observation[2] = inf is above its high bound 1.0"),
    (  # not as the batch would wrap it (44): as it is
        IMAGE,
        np.array([[0, 0], [0, 300]], np.uint16),
        "observation[1, 1] = 300 is above its high bound 255",
    ),
    (DISCRETE, 3, "observation = 3 is outside -1..2"),
    (DISCRETE, np.int64(-2), "observation = -2 is outside -1..2"),
    (spaces.Discrete(1), np.True_, "observation = 1 is outside 0..0"),
    (MULTI, np.array([1, 3]), "observation[1] = 3 is outside 0..2"),
    (BINARY, np.array([0, 2, 1]), "observation[1] = 2 is neither 0 nor 1"),
    (
        DICT,
        {"pos": f32(0, 0, 0), "inner": (0, np.array([0, 5]))},
        "observation['inner'][1][1] = 5 is outside 0..2 (MultiDiscrete([2 3]))",  # its space
    ),
]


@pytest.mark.parametrize(("space", "obs"), FITS)
def test_what_fits_its_space(space, obs):
    assert misfit(space, obs) is None


@pytest.mark.parametrize(("space", "obs", "says"), MISFITS)
def test_what_does_not_fit_is_named(space, obs, says):
    assert misfit(space, obs).startswith(says)
    assert str(space if isinstance(space, spaces.Box | spaces.Discrete) else "") in misfit(
        space, obs
    )


@pytest.mark.parametrize(
    "space",
    [BOX, spaces.Box(0, 100, (2, 2), np.uint8), DISCRETE, MULTI, BINARY, DICT],
    ids=["box", "uint8-box", "discrete", "multidiscrete", "multibinary", "dict"],
)
def test_the_rule_is_gymnasiums_contains_for_values_of_the_spaces_dtype(space):
    """Values of the space's own dtype: ``misfit`` and ``rows_fit`` agree with ``contains``."""
    rng = np.random.default_rng(0)
    space.seed(1)
    values = [space.sample() for _ in range(40)]
    values += [_nudged(space, value, rng) for value in values]
    expected = [space.contains(value) for value in values]
    assert [misfit(space, value) is None for value in values] == expected
    batch = gymnasium.vector.utils.concatenate(
        space, values, gymnasium.vector.utils.create_empty_array(space, len(values))
    )
    assert rows_fit(space, batch).tolist() == expected
    assert 0 < sum(expected) < len(values)  # both kinds were tried


def _nudged(space: Any, value: Any, rng: np.random.Generator) -> Any:
    """``value`` with one element pushed past its space's bounds, half the time."""
    if isinstance(space, spaces.Dict):
        return {key: _nudged(sub, value[key], rng) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_nudged(sub, part, rng) for sub, part in zip(space.spaces, value, strict=True))
    if rng.random() < 0.5:
        return value
    array = np.array(value, dtype=space.dtype)
    flat = array.reshape(-1)
    k = rng.integers(flat.size)
    if isinstance(space, spaces.Box):
        flat[k] = space.high.reshape(-1)[k] + 1
    elif isinstance(space, spaces.MultiBinary):
        flat[k] = 2
    else:
        flat[k] += 7
    return array if array.ndim else array.item()


def transition(obs: Any) -> tuple[Any, ...]:
    return obs, 0.0, False, False, {}, None


def refusing(*spaces_and_values: Any) -> Any:
    """``ResultCheck(...).check`` as a function of the results and call: the errors it makes.

    The envs refused must leave the results for the errors.
    """
    check = ResultCheck(*spaces_and_values).check

    def refused(results: Any, call: str) -> dict[int, Exception]:
        errors: dict[int, Exception] = {}
        before = set(results)
        check(results, errors, call)
        assert set(results) == before - set(errors)
        return errors

    return refused


def test_values_are_checked_in_the_first_reset_and_step_by_default():
    check = refusing([BOX, BOX], None)
    out = f32(2, 0, 0)
    assert list(check({0: (f32(0, 0, 0), {}), 1: (out, {})}, "reset")) == [1]
    assert check({0: (out, {})}, "reset") == {}  # the second reset: values are not looked at
    (error,) = check({0: transition(f32(0, 0, 0)), 1: transition(out)}, "step").values()
    assert isinstance(error, ValueError)
    assert str(error).startswith("the step result's observation[0] = 2.0 is above its high bound")
    assert "check_observations=True: every call, False: never" in str(error)
    assert check({0: transition(out)}, "step") == {}
    assert check({0: (f32(0, 0, 0), {})}, "call") == {}  # not batched: not checked


def test_every_call_or_none():
    always, never = refusing([BOX], True), refusing([BOX], False)
    for _ in range(3):
        assert list(always({0: transition(f32(0, 0, 9))}, "step")) == [0]
        assert never({0: transition(f32(0, 0, 9))}, "step") == {}
    assert list(never({0: transition(f32(0, 0))}, "step")) == [0]  # a shape, always


def test_each_env_is_held_to_its_own_space():
    """``observation_mode="different"``: one shape and dtype, bounds of each env's own."""
    wide = spaces.Box(-5.0, 5.0, (3,), np.float32)
    check = refusing([BOX, wide], True)
    obs = f32(3, 0, 0)
    assert list(check({0: transition(obs), 1: transition(obs)}, "step")) == [0]


def test_the_shared_rows_of_a_process_worker_are_checked_as_blocks():
    observations = np.zeros((4, 3), np.float32)
    observations[2, 1] = 7.0  # env 2's row
    block = StepBlock(range(4), SimpleNamespace(observations=observations), {}, {})
    rows = Rows()
    rows.add_block(block)
    rows[3] = transition(f32(0, 0, 0))  # came one by one: no longer the block's
    refused = refusing([BOX], True)(rows, "step")
    assert list(refused) == [2]
    assert list(rows) == [3, 0, 1]  # env 2's row left the block
    (error,) = refused.values()
    assert str(error).startswith("the step result's observation[1] = 7.0 is above its high")


def test_a_reset_result_that_is_not_a_pair_is_refused():
    check = refusing([BOX], None)
    bad = check({0: f32(0, 0, 0), 1: (f32(0, 0, 0), None)}, "reset")
    assert str(bad[0]).startswith("the reset result must be a pair (observation, info)")
    assert str(bad[1]).startswith("the reset result's info must be a dict, got NoneType")


def test_the_option_is_checked():
    with pytest.raises(TypeError, match="check_observations must be True, False or None, got"):
        aiovec.AsyncioVectorEnv([SpaceEnv], check_observations="always")


# --------------------------------------------------------------------------- every backend


class Misfit(gymnasium.Wrapper[Any, Any, Any, Any]):
    """Returns ``bad`` instead of its observation at ``at``: ``"reset"``, or the n-th step."""

    def __init__(self, space: spaces.Space[Any], bad: Any, at: str | int) -> None:
        super().__init__(SpaceEnv(space, spaces.Discrete(2), min_len=50, max_len=50))
        self.bad, self.at, self.steps = bad, at, 0

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        return (self.bad if self.at == "reset" else obs), info

    def step(self, action: Any) -> Any:
        obs, *rest = self.env.step(action)
        self.steps += 1
        return (self.bad if self.at == self.steps else obs), *rest


def fns(space: spaces.Space[Any], bad: Any, at: str | int) -> list[Any]:
    """Three envs of ``space``; env 1 returns ``bad`` at ``at``."""
    return [
        functools.partial(SpaceEnv, space, spaces.Discrete(2), min_len=50, max_len=50),
        functools.partial(Misfit, space, bad, at),
        functools.partial(SpaceEnv, space, spaces.Discrete(2), min_len=50, max_len=50),
    ]


KINDS = {
    "shape": (BOX, np.zeros(4, np.float32), ValueError, r"observation must have shape \(3,\)"),
    "dtype": (BOX, np.full(3, "x"), TypeError, "observation must have a dtype that casts"),
    "bound": (BOX, f32(0, 0, 3), ValueError, r"observation\[2\] = 3.0 is above its high bound"),
    "discrete": (DISCRETE, 7, ValueError, r"observation = 7 is outside -1..2"),
    "key path": (
        DICT,
        {"pos": f32(0, -4, 0), "inner": (0, np.array([0, 0]))},
        ValueError,
        r"observation\['pos'\]\[1\] = -4.0 is below its low bound -1.0",
    ),
}
ACTIONS = np.zeros(3, np.int64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("call", ["reset", "step"])
def test_a_misfit_is_refused_naming_the_env_the_call_and_what(make_venv, kind, call):
    space, bad, error, says = KINDS[kind]
    venv = make_venv(fns(space, bad, "reset" if call == "reset" else 1))
    if call == "step":
        venv.reset(seed=0)
    with pytest.raises(aiovec.EnvError, match=rf"env 1 failed in {call}\(\)") as info:
        venv.reset(seed=0) if call == "reset" else venv.step(ACTIONS)
    assert list(info.value.errors) == [1]
    assert isinstance(info.value.errors[1], error)
    assert f"the {call} result's" in str(info.value.errors[1])
    assert info.value.errors[1].args[0] == str(info.value.errors[1])
    with pytest.raises(error, match=says):
        raise info.value.errors[1]


@pytest.mark.parametrize("check", [None, True, False])
def test_values_are_checked_where_asked(make_venv, check):
    """Out of bounds at the third step: refused only when every call is checked."""
    venv = make_venv(fns(BOX, f32(0, 0, 3), 3), check_observations=check)
    venv.reset(seed=0)
    venv.step(ACTIONS)
    venv.step(ACTIONS)
    if check:
        with pytest.raises(aiovec.EnvError, match=r"env 1 failed in step\(\).*above its high"):
            venv.step(ACTIONS)
    else:
        observations = venv.step(ACTIONS)[0]
        assert observations[1].tolist() == [0, 0, 3]


def test_never_checking_values_lets_a_first_misfit_through(make_venv):
    venv = make_venv(fns(BOX, f32(0, 0, 3), "reset"), check_observations=False)
    observations, _ = venv.reset(seed=0)
    assert observations[1].tolist() == [0, 0, 3]
