"""Property tests: random programs of steps and resets give the oracle's results, step by step.

Hypothesis draws the number of envs, episode lengths, the autoreset mode, the
space pair, seeds and a program of steps, masked resets and full resets; aiovec
(every backend x front end x flavour) and ``SyncVectorEnv`` run it in lockstep.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import (
    BACKENDS,
    FLAVOURS,
    FRONT_ENDS,
    MODES,
    SPACES,
    Lockstep,
    driven,
    oracle_env,
    space_env_fns,
)
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st

from aiovec.testing import AsyncTwin

STEP, MASKED_RESET, FULL_RESET = "step", "masked-reset", "full-reset"


@dataclass(frozen=True)
class Scenario:
    num_envs: int
    space: str
    mode: AutoresetMode
    min_len: int
    max_len: int
    first_seed: int | list[int]
    action_seed: int
    program: list[tuple[str, int]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    num_envs = draw(st.integers(1, 8))
    min_len = draw(st.integers(1, 4))
    per_env_seeds = st.lists(st.integers(0, 2**31 - 1), min_size=num_envs, max_size=num_envs)
    op = st.sampled_from([STEP] * 8 + [MASKED_RESET, FULL_RESET])
    return Scenario(
        num_envs=num_envs,
        space=draw(st.sampled_from(list(SPACES))),
        mode=draw(st.sampled_from(MODES)),
        min_len=min_len,
        max_len=min_len + draw(st.integers(0, 4)),
        first_seed=draw(st.integers(0, 2**31 - 1) | per_env_seeds),
        action_seed=draw(st.integers(0, 2**16)),
        program=draw(st.lists(st.tuples(op, st.integers(0, 2**16)), min_size=1, max_size=30)),
    )


def masked_reset_args(num_envs: int, draw_seed: int, must: np.ndarray) -> dict:
    """A reset_mask with every ``must`` env and some random others; maybe seeds."""
    rng = np.random.default_rng(draw_seed)
    mask = must | (rng.random(num_envs) < 0.3)
    if not mask.any():
        mask[rng.integers(num_envs)] = True
    kwargs: dict = {"options": {"reset_mask": mask}}
    if draw_seed % 3 == 0:
        kwargs["seed"] = draw_seed
    elif draw_seed % 3 == 1:
        kwargs["seed"] = [int(s) if s % 2 else None for s in rng.integers(0, 1000, num_envs)]
    return kwargs


def run_program(lock: Lockstep, scenario: Scenario) -> None:
    lock.reset(seed=scenario.first_seed)
    for kind, value in scenario.program:
        if kind == STEP:
            lock.step()
            ended = lock.ended()
            if scenario.mode is AutoresetMode.DISABLED and ended.any():
                # The user's job in DISABLED mode: reset what ended before stepping again.
                lock.reset(**masked_reset_args(lock.num_envs, value, ended))
        elif kind == MASKED_RESET:
            lock.reset(**masked_reset_args(lock.num_envs, value, lock.ended()))
        else:
            lock.reset(seed=value if value % 2 else None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("flavour", FLAVOURS)
@settings(max_examples=25, deadline=None)
@given(scenario=scenarios())
def test_random_programs_match_the_oracle(backend, front_end, flavour, scenario):
    fns = space_env_fns(
        scenario.num_envs, scenario.space, min_len=scenario.min_len, max_len=scenario.max_len
    )
    with (
        driven(
            front_end, fns, flavour=flavour, backend=backend, autoreset_mode=scenario.mode
        ) as venv,
        oracle_env(fns, autoreset_mode=scenario.mode) as oracle,
    ):
        run_program(Lockstep(venv, oracle, action_seed=scenario.action_seed), scenario)


def _twin(fn, max_yields: int, seed: int) -> AsyncTwin:
    return AsyncTwin(fn(), max_yields=max_yields, seed=seed)


@pytest.mark.async_envs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("front_end", FRONT_ENDS)
@settings(max_examples=15, deadline=None)
@given(
    num_envs=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    max_yields=st.integers(0, 12),
    steps=st.integers(1, 25),
)
def test_completion_order_never_changes_results(
    backend, front_end, num_envs, seed, max_yields, steps
):
    """Async twins finishing in any order give what the sync envs give."""
    fns = space_env_fns(num_envs, "dict-tuple", min_len=1, max_len=4)
    twins = [functools.partial(_twin, fn, max_yields, seed + i) for i, fn in enumerate(fns)]
    # The twins are already async: "sync" flavour hands them to aiovec as they are.
    with (
        driven(front_end, twins, flavour="sync", backend=backend) as venv,
        oracle_env(fns) as oracle,
    ):
        lock = Lockstep(venv, oracle, action_seed=seed % 1000)
        lock.reset(seed=seed)
        for _ in range(steps):
            lock.step()
