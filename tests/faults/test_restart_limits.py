"""Restart limits: at most R restarts of an env in a row (no run of clean steps between).

The bookkeeping is pure (``RestartBook``, the time passed in) and tested
without a loop; the limit itself on every backend x front end x flavour with
crash-looping envs, against the oracle for the envs that behave.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from conftest import Lockstep
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec._core.lifecycle import State
from aiovec._core.restart import RestartBook, RestartPolicy
from aiovec.testing import AsyncHangingEnv, AsyncTwin, FaultyEnv, FlakyEnv, SpaceEnv
from faults.conftest import skip_unless_available
from faults.scenarios import (
    EPISODE_COUNTERS,
    GROUP_BACKENDS,
    NUM_ENVS,
    actions_for,
    assert_rows_equal,
    space_env,
)

pytestmark = pytest.mark.timeout(60)

R = 3
LONG = (50, 50)
SETUPS = [("inline", "sync"), ("inline", "async"), ("thread", "sync"), ("process", "sync")]
SETUPS += [("process", "async"), ("ray", "sync"), ("ray", "async")]


# --------------------------------------------------------------------------- the book


def allow(book: RestartBook, i: int) -> bool:
    """Restart env ``i`` if the book allows it, as the vector env does."""
    if not book.may_restart(i):
        return False
    book.record([i])
    return True


def test_the_book_allows_max_restarts_in_a_row_then_refuses():
    book = RestartBook(RestartPolicy(max_restarts=2, clean_steps=3), num_envs=2)
    assert allow(book, 0)
    book.stepped({0, 1})  # one clean step, two short of a run
    assert allow(book, 0)
    book.stepped({0})
    book.stepped({0})
    assert not allow(book, 0)  # a third in a row: never 3 clean steps between
    assert allow(book, 1)  # every env has a count of its own
    book.stepped({1})  # env 0 did not step: its clean steps do not grow
    assert not allow(book, 0)
    book.stepped({0, 1})  # its third clean step since its last restart: a run
    assert allow(book, 0)


def test_a_run_of_clean_steps_starts_the_count_again():
    """An env that fails now and then, and works in between, is never given up on."""
    book = RestartBook(RestartPolicy(max_restarts=2, clean_steps=3), num_envs=1)
    for _ in range(100):
        assert allow(book, 0)
        for _ in range(3):
            book.stepped({0})
    assert not book.watching  # nothing kept for an env that works
    for _ in range(2):
        assert allow(book, 0)
    assert not allow(book, 0)


def test_a_refused_restart_is_not_charged():
    book = RestartBook(RestartPolicy(max_restarts=1, clean_steps=2), num_envs=1)
    assert allow(book, 0)
    for _ in range(3):
        assert not allow(book, 0)
    book.stepped({0})
    book.stepped({0})  # two clean steps after the one restart: refusals added nothing
    assert allow(book, 0)


def test_checking_charges_nothing_until_the_restarts_are_recorded():
    book = RestartBook(RestartPolicy(max_restarts=1, clean_steps=1), num_envs=3)
    assert allow(book, 0)
    assert [book.may_restart(i) for i in range(3)] == [False, True, True]
    assert book.may_restart(1)  # asking twice changes nothing
    book.record([1, 2])
    assert [book.may_restart(i) for i in range(3)] == [False, False, False]
    book.stepped(range(3))
    assert [book.may_restart(i) for i in range(3)] == [True, True, True]


# --------------------------------------------------------------------------- end to end


def crash_looping(flavour: str) -> Any:
    """Every env this factory builds fails on every step."""
    return functools.partial(_flavoured, flavour, FlakyEnv, rate=1.0)


def fails_once(flavour: str, at: int) -> Any:
    """Every env this factory builds fails on its ``at``-th step."""
    return functools.partial(_flavoured, flavour, FaultyEnv, method="step", at=at)


def _flavoured(flavour: str, wrapper: Any, **kwargs: Any) -> Any:
    env = wrapper(space_env(LONG), **kwargs)
    return AsyncTwin(env, max_yields=2, seed=3) if flavour == "async" else env


def oracle() -> SyncVectorEnv:
    return SyncVectorEnv([functools.partial(space_env, LONG)] * NUM_ENVS)


def open_lock(open_venv: Any, backend: str, flavour: str, fns: list[Any], **kw: Any) -> Lockstep:
    skip_unless_available(backend)
    kw.setdefault("on_error", RestartPolicy(max_restarts=R, backoff=0.0))
    lock = Lockstep(open_venv(fns, **kw), oracle())
    lock.reset(seed=3)
    return lock


def step_until_raise(lock: Lockstep, others: list[int], steps: int = 40) -> tuple[Any, int]:
    """Step until the vector env raises; every other env matches the oracle meanwhile."""
    restarts = 0
    for step in range(1, steps):
        try:
            got = lock.venv.step(actions_for(step))
        except aiovec.EnvError as exc:
            lock.oracle.step(actions_for(step))
            return exc, restarts
        assert_rows_equal(got, lock.oracle.step(actions_for(step)), others)
        restarts += int(got[4].get("_error", [False] * NUM_ENVS)[1])
    raise AssertionError(f"no EnvError in {steps} steps ({restarts} restarts)")


def fns_with(failing: dict[int, Any]) -> list[Any]:
    return [failing.get(i, functools.partial(space_env, LONG)) for i in range(NUM_ENVS)]


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
def test_a_crash_looping_env_is_restarted_r_times_then_raises(open_venv, backend, flavour):
    lock = open_lock(open_venv, backend, flavour, fns_with({1: crash_looping(flavour)}))
    try:
        error, restarts = step_until_raise(lock, [0, 2, 3])
        assert restarts == R
        assert type(error) is aiovec.EnvError
        assert set(error.errors) == {1}
        assert isinstance(error.errors[1], RuntimeError)
        assert f"env 1 failed {R + 1} times in a row" in str(error)
        assert f"RestartPolicy(max_restarts={R})" in str(error)
        assert lock.venv.state is State.BROKEN
        # After reset() the env's budget is still spent: its next failure raises at once.
        lock.ignore = EPISODE_COUNTERS
        lock.reset(seed=4)
        with pytest.raises(aiovec.EnvError, match="restart limit"):
            lock.venv.step(actions_for(1))
    finally:
        lock.oracle.close()


def failing_now_and_then(flavour: str) -> Any:
    """Every env this factory builds fails on every 4th step call of the factory's envs."""
    steps = FlakySteps.factory(set(range(4, 400, 4)))
    return steps if flavour == "sync" else lambda: AsyncTwin(steps(), max_yields=2, seed=3)


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
def test_an_env_that_works_between_failures_is_restarted_as_often_as_it_fails(
    open_venv, backend, flavour
):
    """A fault rate is not a crash loop: 3 clean steps between failures start the count again.

    (Under ``NEXT_STEP`` a restarted env's next step is its autoreset; two more are its own.)
    """
    policy = RestartPolicy(max_restarts=R, clean_steps=3, backoff=0.0)
    fns = fns_with({1: failing_now_and_then(flavour)})
    lock = open_lock(open_venv, backend, flavour, fns, on_error=policy)
    try:
        restarts = 0
        for step in range(1, 40):
            got = lock.venv.step(actions_for(step))
            assert_rows_equal(got, lock.oracle.step(actions_for(step)), [0, 2, 3])
            restarts += int(got[4].get("_error", [False] * NUM_ENVS)[1])
        assert restarts > 2 * R
    finally:
        lock.oracle.close()


@pytest.mark.parametrize(("backend", "flavour"), SETUPS)
def test_each_env_has_its_own_budget(open_venv, backend, flavour):
    """Envs 1 and 2 each use up their own R restarts; both are named when they run out."""
    fns = fns_with({1: crash_looping(flavour), 2: crash_looping(flavour)})
    lock = open_lock(open_venv, backend, flavour, fns)
    try:
        error, restarts = step_until_raise(lock, [0, 3])
        assert restarts == R
        assert set(error.errors) == {1, 2}
    finally:
        lock.oracle.close()


def test_every_env_that_failed_is_named_when_one_is_over_its_limit(open_venv, backend):
    # env 1 crash-loops; env 2 fails once, on its 7th step: the step on which env 1
    # runs out of restarts (R=3 restarts at steps 1, 3, 5: under NEXT_STEP each
    # restart is followed by an autoreset step; step 7 would be one too many).
    fns = fns_with({1: crash_looping("sync"), 2: fails_once("sync", at=2 * R + 1)})
    lock = open_lock(open_venv, backend, "sync", fns)
    try:
        error, _ = step_until_raise(lock, [0, 3])
        assert set(error.errors) == {1, 2}
    finally:
        lock.oracle.close()


def test_envs_not_restarted_are_not_charged(open_venv, backend):
    policy = RestartPolicy(max_restarts=1, backoff=0.0)
    # env 1 is restarted at step 1, and over its limit at step 3, when env 2 fails too;
    # then neither fails again until env 2's 4th step call (env 1's 3rd works).
    fns = fns_with({1: FlakySteps.factory({1, 2}), 2: FlakySteps.factory({3, 4})})
    lock = open_lock(open_venv, backend, "sync", fns, on_error=policy)
    try:
        lock.venv.step(actions_for(1))  # env 1 restarted
        lock.venv.step(actions_for(2))  # env 1 autoreset
        with pytest.raises(aiovec.EnvError, match="restart limit") as info:
            lock.venv.step(actions_for(3))
        assert set(info.value.errors) == {1, 2}
        lock.venv.reset(seed=5)
        # env 2 fails on its 4th step call now; it was never restarted, so it is.
        _, _, _, truncations, infos = lock.venv.step(actions_for(1))
        assert truncations[2]
        assert infos["_error"].tolist() == [False, False, True, False]
    finally:
        lock.oracle.close()


class FlakySteps(SpaceEnv):
    """Fails on the given step calls (counted over the whole life of the factory)."""

    def __init__(self, failing: set[int], counter: list[int]) -> None:
        super().__init__(min_len=LONG[0], max_len=LONG[1])
        self.failing, self.counter = failing, counter

    @classmethod
    def factory(cls, failing: set[int]) -> Any:
        return functools.partial(cls, failing, [0])

    def step(self, action: Any) -> Any:
        self.counter[0] += 1
        if self.counter[0] in self.failing:
            raise RuntimeError(f"step call {self.counter[0]} fails")
        return super().step(action)


@pytest.mark.async_envs
def test_the_limit_keeps_the_error_subclass(open_venv, backend, gates):
    gate = gates()
    fns = fns_with({1: functools.partial(_hanging_every_time, gate)})
    policy = RestartPolicy(max_restarts=1, backoff=0.0)
    lock = open_lock(open_venv, backend, "async", fns, on_error=policy, step_timeout=0.2)
    try:
        # on a group backend env 0 shares env 1's stuck worker, and is restarted with it
        error, restarts = step_until_raise(lock, [2, 3] if backend in GROUP_BACKENDS else [0, 2, 3])
        assert restarts == 1
        assert isinstance(error, aiovec.EnvTimeoutError)
    finally:
        lock.oracle.close()


def _hanging_every_time(gate: Any) -> Any:
    return AsyncHangingEnv(space_env(LONG), gate, at=1)
