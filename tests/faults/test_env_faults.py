"""Envs that fail on purpose, over every backend x front end x env flavour.

For each fault (``scenarios.FAULTS``: raise in step or in the autoreset, at a
chosen or a random step; hang until ``step_timeout``; a malformed step result;
the worker process SIGKILLed mid-step):

- ``on_error="raise"``: the step raises the fault's ``EnvError`` subclass
  naming exactly the failing envs, the vector env is ``BROKEN``, and after
  ``reset()`` it matches gymnasium's ``SyncVectorEnv`` step for step again;
- ``on_error="restart"``: the step returns; the failed rows are restarts
  (reset observation, reward 0, truncated, ``infos["error"]``), every other
  row is the oracle's, and so is every later step of the other envs.

Until the fault, every result is compared with the oracle in full.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import pytest
from conftest import Lockstep
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec._core.lifecycle import State
from aiovec._errors import LostWithWorkerError
from aiovec.testing import KillingEnv
from faults.conftest import skip_unless_available
from faults.scenarios import (
    EPISODE_COUNTERS,
    FAULTS,
    GROUP_BACKENDS,
    LONG,
    NUM_ENVS,
    NUM_WORKERS,
    SHORT,
    STEP_TIMEOUT,
    Ctx,
    Fault,
    actions_for,
    assert_restarted_row,
    assert_rows_equal,
    fault_cases,
    oracle_fns,
    space_env,
    worker_group,
)

pytestmark = pytest.mark.timeout(60)


class Run:
    """aiovec and the oracle, driven to the step on which the fault strikes."""

    def __init__(self, fault: Fault, backend: str, flavour: str, gates: Any, request: Any):
        skip_unless_available(backend)
        self.fault = fault
        self.env, self.at, self.step = fault.place(request.node.nodeid)
        lengths = fault.lengths
        self.failing = fault.failing(self.env, backend, flavour)
        # envs that finished the fault's step before their worker died, lost with it:
        # their next call fails and restarts them
        self.lost_later: set[int] = set()
        if fault.name == "worker-killed" and backend in GROUP_BACKENDS:
            self.lost_later = set(worker_group(self.env)) - self.failing
        self.ctx = Ctx(flavour, self.at, lengths, gates)
        self.fns = oracle_fns(lengths)
        self.oracle_fns = list(self.fns)
        self.fns[self.env] = fault.make(self.ctx)
        self.kwargs = fault.kwargs()
        if backend in GROUP_BACKENDS:
            self.kwargs["num_workers"] = NUM_WORKERS
        self.gates = gates
        self._oracle: SyncVectorEnv | None = None

    def open(self, open_venv: Any, **kwargs: Any) -> Lockstep:
        venv = open_venv(self.fns, **{**self.kwargs, **kwargs})
        self._oracle = SyncVectorEnv(self.oracle_fns)
        return Lockstep(venv, self._oracle)

    def until_fault(self, lock: Lockstep) -> tuple[Any, ...]:
        """Reset, then step in lockstep up to (not including) the failing step."""
        lock.reset(seed=123)
        for step in range(1, self.step):
            lock.step(actions_for(step))
        return actions_for(self.step)

    def close_oracle(self) -> None:
        if self._oracle is not None:
            self._oracle.close()


@pytest.fixture
def run(request: Any, gates: Any) -> Any:
    made: list[Run] = []

    def make(fault: Fault, backend: str, flavour: str) -> Run:
        made.append(Run(fault, backend, flavour, gates, request))
        return made[-1]

    yield make
    for r in made:
        r.close_oracle()


def expect_failure(r: Run, lock: Lockstep, actions: Any) -> aiovec.EnvError:
    with pytest.raises(r.fault.error) as info:
        lock.venv.step(actions)
    lock.oracle.step(actions)  # the other envs did step: keep the oracle's in step too
    error = info.value
    assert set(error.errors) == r.failing, f"named {sorted(error.errors)}, not {r.failing}"
    blamed = r.env if r.fault.blocks else min(r.failing)  # a hang blames the env that hung
    assert error.env_index == blamed
    assert next(iter(error.errors)) == blamed
    assert f"env {blamed} failed in step()" in str(error)
    for i, cause in error.errors.items():
        if r.fault.blocks and i != r.env:  # lost with the worker the hung env blocks
            assert isinstance(cause, LostWithWorkerError), f"env {i}: {cause!r}"
            assert f"lost with its worker, blocked by env {r.env}" in str(cause)
            assert "did not answer" not in str(cause)
            continue
        assert isinstance(cause, r.fault.cause), f"env {i}: {cause!r}"
    assert error.__cause__ is error.errors[error.env_index]
    return error


@pytest.mark.parametrize(("fault", "backend", "flavour"), fault_cases())
def test_raise_names_the_failing_env(run, open_venv, fault, backend, flavour):
    r = run(fault, backend, flavour)
    lock = r.open(open_venv, on_error="raise")
    actions = r.until_fault(lock)
    expect_failure(r, lock, actions)
    assert lock.venv.state is State.BROKEN
    with pytest.raises(aiovec.StateError, match=r"only a full reset\(\)"):
        lock.venv.step(actions)


@pytest.mark.parametrize(("fault", "backend", "flavour"), fault_cases())
def test_raise_then_reset_matches_the_oracle_again(run, open_venv, fault, backend, flavour):
    r = run(fault, backend, flavour)
    lock = r.open(open_venv, on_error="raise")
    actions = r.until_fault(lock)
    expect_failure(r, lock, actions)
    r.gates.release_all()  # a hung server answers again: its late reply must be dropped
    lock.ignore = EPISODE_COUNTERS
    lock.reset(seed=7)
    assert lock.venv.state is State.READY
    for step in range(1, 5):
        lock.step(actions_for(step))


@pytest.mark.parametrize(("fault", "backend", "flavour"), fault_cases())
def test_restart_marks_the_slot_and_keeps_every_other_transition(
    run, open_venv, fault, backend, flavour
):
    r = run(fault, backend, flavour)
    policy = aiovec.RestartPolicy(backoff=0.0)
    lock = r.open(open_venv, on_error=policy)
    actions = r.until_fault(lock)
    got = lock.venv.step(actions)
    want = lock.oracle.step(actions)
    others = [i for i in range(NUM_ENVS) if i not in r.failing]
    assert_rows_equal(got, want, others)
    for i in r.failing:
        assert_restarted_row(got, i, lock.venv.single_observation_space, "Error")
        if r.fault.blocks and i != r.env:  # restarted as lost, not as timed out
            assert f"lost with its worker, blocked by env {r.env}" in got[4]["error"][i]
    assert lock.venv.state is State.READY
    # NEXT_STEP: each restarted env is reset on its next step (reward 0, no flags),
    # and every other env goes on exactly as the oracle's.
    got = lock.venv.step(actions_for(0))
    want = lock.oracle.step(actions_for(0))
    for i in r.lost_later:
        assert_restarted_row(got, i, lock.venv.single_observation_space, "WorkerDiedError")
    others = [i for i in others if i not in r.lost_later]
    assert_rows_equal(got, want, others)
    for i in r.failing:
        assert (got[1][i], got[2][i], got[3][i]) == (0.0, False, False)
    assert "_error" not in got[4] or r.lost_later
    for step in range(1, 4):
        got = lock.venv.step(actions_for(step))
        assert_rows_equal(got, lock.oracle.step(actions_for(step)), others)
        assert "_error" not in got[4]


@pytest.mark.parametrize(
    ("fault", "backend", "flavour"),
    fault_cases(
        [f for f in FAULTS if f.name in {"raise-in-step-at-random", "hang", "worker-killed"}]
    ),
)
def test_restart_with_random_episode_ends(run, open_venv, fault, backend, flavour):
    """Short random episodes: autoresets around the restart never disturb the other envs.

    The env fails on its ``at``-th call of step, which comes later than the
    ``at``-th vector step when it ended an episode before (NEXT_STEP resets it
    instead of stepping it): every row matches the oracle until a restart shows up.
    """
    r = run(dataclasses.replace(fault, lengths=SHORT), backend, flavour)
    lock = r.open(open_venv, on_error=aiovec.RestartPolicy(backoff=0.0))
    lock.reset(seed=5)
    others = [i for i in range(NUM_ENVS) if i not in r.failing]
    restarted_at = None
    for step in range(1, 16):
        got = lock.venv.step(actions_for(step))
        want = lock.oracle.step(actions_for(step))
        if restarted_at is None and "_error" in got[4]:
            restarted_at = step
            assert {int(i) for i in got[4]["_error"].nonzero()[0]} == r.failing
            for i in r.failing:
                assert_restarted_row(got, i, lock.venv.single_observation_space, "Error")
        if restarted_at is not None and restarted_at < step:
            others = [i for i in others if i not in r.lost_later]
        assert_rows_equal(got, want, range(NUM_ENVS) if restarted_at is None else others)
    assert restarted_at is not None, "the fault never struck"


HANG = next(f for f in FAULTS if f.name == "hang")
KILLED = next(f for f in FAULTS if f.name == "worker-killed")


@pytest.mark.parametrize(("fault", "backend", "flavour"), fault_cases([HANG]))
def test_reset_while_the_env_still_hangs(run, open_venv, fault, backend, flavour):
    """A call that cannot be interrupted (thread) keeps its env busy.

    The inline backend cancels a late async call, and so does a process
    worker, so ``reset()`` works at once.  A worker blocked in a late sync call
    (process), or a Ray actor still running one, is replaced by ``reset()``,
    as a dead one is.  On the thread backend the late call still runs:
    ``reset()`` of that env waits behind it and fails with ``EnvTimeoutError``
    too (bounded by ``reset_timeout``), naming it; the vector env stays
    consistent, and once the env answers, ``reset()`` recovers.
    """
    r = run(fault, backend, flavour)
    lock = r.open(open_venv, on_error="raise", reset_timeout=STEP_TIMEOUT)
    expect_failure(r, lock, r.until_fault(lock))
    lock.ignore = EPISODE_COUNTERS  # the timed-out reset still runs, late
    if backend != "thread":
        lock.reset(seed=5)
    else:
        with pytest.raises(aiovec.EnvTimeoutError, match=r"in reset\(\)") as info:
            lock.venv.reset(seed=5)
        assert r.env in info.value.errors
        assert lock.venv.state is State.BROKEN
        r.gates.release_all()
        lock.reset(seed=6)
    for step in range(1, 4):
        lock.step(actions_for(step))


@pytest.mark.parametrize(
    ("fault", "backend", "flavour"), [c for c in fault_cases([KILLED]) if "process" in c.values]
)
def test_a_dead_worker_is_reported_once_not_nested(run, open_venv, fault, backend, flavour):
    r = run(fault, backend, flavour)
    lock = r.open(open_venv, on_error="raise")
    error = expect_failure(r, lock, r.until_fault(lock))
    for cause in error.errors.values():
        assert isinstance(cause, ChildProcessError)
        assert "killed by SIGKILL" in str(cause)


def _killed_then_refused(kill: Any, refuse: Any, spare: int) -> Any:
    """Kills its worker on step 2; the first rebuild fails; later builds are healthy."""
    if kill.take():
        return KillingEnv(space_env(LONG), spare=spare, at=2)
    if refuse.take():
        raise ConnectionRefusedError("the server is still down")
    return space_env(LONG)


@pytest.mark.parametrize("backend", ["process"])
def test_reset_rebuilds_a_dead_worker_and_names_envs_it_cannot_rebuild(open_venv, gates):
    """``reset()`` after a worker died rebuilds its envs; a factory that fails is named."""
    fns = oracle_fns(LONG)
    fns[1] = functools.partial(_killed_then_refused, gates.once(), gates.once(), os.getpid())
    lock = Lockstep(open_venv(fns, num_workers=NUM_WORKERS), SyncVectorEnv(oracle_fns(LONG)))
    try:
        lock.reset(seed=1)
        lock.step(actions_for(1))
        with pytest.raises(aiovec.WorkerDiedError):
            lock.venv.step(actions_for(2))
        lock.oracle.step(actions_for(2))
        with pytest.raises(aiovec.EnvError, match=r"in reset\(\)") as info:
            lock.venv.reset(seed=2)
        assert type(info.value) is aiovec.EnvError
        assert set(info.value.errors) == {0, 1}  # the worker's envs: neither is rebuilt
        assert isinstance(info.value.errors[1], ConnectionRefusedError)
        assert lock.venv.state is State.BROKEN
        lock.ignore = EPISODE_COUNTERS
        lock.reset(seed=3)
        for step in range(1, 4):
            lock.step(actions_for(step))
    finally:
        lock.oracle.close()
