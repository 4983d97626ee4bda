"""The parts `AsyncioVectorEnv` owns, on their own: `Sent`, `Restarter`, `error_for`.

The vector env's behaviour through them is the conformance, partial and
fault suites'; these tests pin each part's own rules without a vector env.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from gymnasium.vector import AutoresetMode

from aiovec import EnvError, EnvTimeoutError, RestartPolicy, WorkerDiedError
from aiovec._core.autoreset import AutoresetState
from aiovec._core.calls import Reset
from aiovec._core.ops import CallOp
from aiovec._flight import error_for
from aiovec._restarter import Restarter, policy_of
from aiovec._sent import Sent
from aiovec.backends._base import Outcomes

# -- Sent --------------------------------------------------------------------------


def test_sent_records_envs_and_when_they_were_sent():
    sent = Sent(4)
    sent.start([1, 3], now=5.0)
    assert sent.envs == {1, 3}
    assert sent.at == [0.0, 5.0, 0.0, 5.0]
    sent.done({1: "row"}, {})
    assert sent.envs == {3}
    sent.done({}, {3: ValueError()})
    assert sent.envs == set()


def test_sent_remembers_which_envs_reset_until_they_are_sent_a_step():
    """A sent reset (an autoreset, a collector's) has ``reset_timeout`` (`Flight.collect`)."""
    sent = Sent(4)
    sent.start([0, 1, 2], now=1.0, resets=[1])
    assert sent.resets == {1}
    sent.start([1, 3], now=2.0, resets=[3])  # env 1 steps now
    assert sent.resets == {3}
    sent.clear()
    assert sent.resets == set()


def test_a_sent_reset_says_why_its_lost_envs_are_still_lost():
    sent = Sent(3)
    lost = ValueError("its worker died")
    sent.unbuilt = {2: lost}
    sent.start([0, 1, 2], now=1.0)
    errors: dict[int, BaseException] = {}
    sent.done({0: "row", 1: "row"}, errors, reset=True)
    assert errors == {2: lost}
    assert sent.envs == set()  # all received: two rows, one error


def test_keep_holds_the_outcomes_of_envs_outside_own():
    sent = Sent(4)
    boom = ValueError("boom")
    results, errors = sent.keep(({0: "a", 2: "c"}, {1: boom, 3: boom}), own={0, 1})
    assert (results, errors) == ({0: "a"}, {1: boom})
    assert sent.held == ({2: "c"}, {3: boom})


def test_keep_without_own_holds_nothing():
    sent = Sent(2)
    outcomes: Outcomes = ({0: "a"}, {})
    assert sent.keep(outcomes, own=None) is outcomes
    assert sent.held == ({}, {})


def test_take_held_adds_the_held_outcomes_once():
    sent = Sent(4)
    boom = ValueError("boom")
    sent.keep(({2: "c"}, {3: boom}), own=set())
    results, errors = sent.take_held(({0: "a"}, {}))
    assert (results, errors) == ({0: "a", 2: "c"}, {3: boom})
    assert sent.take_held(({}, {})) == ({}, {})


def test_clear_forgets_envs_and_held_outcomes():
    sent = Sent(2)
    sent.start([0, 1], now=1.0)
    sent.keep(({1: "b"}, {}), own=set())
    sent.clear()
    assert sent.envs == set()
    assert sent.held == ({}, {})


# -- Restarter ---------------------------------------------------------------------


class FakeBackend:
    """Rebuilds envs; ``refuse`` says how many times each env's rebuild fails first."""

    def __init__(self, refuse: dict[int, int] | None = None) -> None:
        self.refuse = dict(refuse or {})
        self.rebuilt: list[list[int]] = []

    async def rebuild(self, indices: list[int]) -> dict[int, BaseException]:
        self.rebuilt.append(list(indices))
        failed: dict[int, BaseException] = {}
        for i in indices:
            if self.refuse.get(i, 0) > 0:
                self.refuse[i] -= 1
                failed[i] = ConnectionRefusedError(f"server of env {i} away")
        return failed


def restarter(policy: RestartPolicy | None, backend: FakeBackend | None = None) -> Restarter:
    autoreset = AutoresetState(AutoresetMode.NEXT_STEP, 4, None)
    return Restarter(policy, 4, cast(Any, backend or FakeBackend()), autoreset)


async def resets(indices: list[int], op: CallOp) -> Outcomes:
    """A gather whose resets all answer: env i's observation is i."""
    assert op.name == "reset"
    assert all(isinstance(call, Reset) for call in op.calls)
    return {i: (i, {"reset": True}) for i in indices}, {}


def test_on_error_means_a_policy_or_none():
    policy = RestartPolicy(attempts=5)
    assert policy_of(policy) == ("restart", policy)
    assert policy_of("restart") == ("restart", RestartPolicy())
    assert policy_of("raise") == ("raise", None)
    with pytest.raises(ValueError, match=r"on_error must be one of 'raise', 'restart'"):
        policy_of("retry")


def test_only_step_failures_that_are_exceptions_are_restartable():
    errors: dict[int, BaseException] = {0: ValueError()}
    assert restarter(RestartPolicy()).restartable(errors, step=True)
    assert not restarter(None).restartable(errors, step=True)
    assert not restarter(RestartPolicy()).restartable(errors, step=False)
    interrupted: dict[int, BaseException] = {0: ValueError(), 1: KeyboardInterrupt()}
    assert not restarter(RestartPolicy()).restartable(interrupted, step=True)


@pytest.mark.asyncio
async def test_charge_is_all_or_nothing(caplog):
    parts = restarter(RestartPolicy(max_restarts=1))
    assert parts.charge({0: ValueError()}) == ""
    with caplog.at_level(logging.WARNING, logger="aiovec"):
        refusal = parts.charge({0: ValueError(), 1: ValueError()})
    assert refusal.startswith("restart limit reached: env 0 failed 2 times in a row")
    assert "envs 0, 1: giving up: restart limit reached" in caplog.text
    assert parts.charge({1: ValueError()}) == ""  # env 1 was not charged by the refusal


@pytest.mark.asyncio
async def test_restart_tries_until_every_env_is_back():
    backend = FakeBackend(refuse={1: 1})
    parts = restarter(RestartPolicy(attempts=3, backoff=0.0), backend)
    rows = await parts.restart({0: ValueError("a"), 1: ValueError("b")}, "step", resets)
    assert backend.rebuilt == [[0, 1], [1]]
    assert sorted(rows) == [0, 1]
    obs, reward, terminated, truncated, info, _ = rows[1]
    assert (obs, reward, terminated, truncated) == (1, 0.0, False, True)
    assert info["reset"] is True
    assert info["error"].startswith("ValueError: b (in step()")


@pytest.mark.asyncio
async def test_restart_gives_up_after_its_attempts(caplog):
    parts = restarter(RestartPolicy(attempts=2, backoff=0.0), FakeBackend(refuse={2: 5}))
    with caplog.at_level(logging.WARNING, logger="aiovec"), pytest.raises(EnvError) as info:
        await parts.restart({2: ValueError("c")}, "step", resets)
    assert info.value.operation.startswith("step() (restart failed after 2 attempts over ")
    assert isinstance(info.value.errors[2], ConnectionRefusedError)
    assert "env 2: giving up after 2 restart attempt(s)" in caplog.text


# -- error_for ---------------------------------------------------------------------


def test_error_for_is_env_error_for_plain_failures():
    error = error_for({1: ValueError("x")}, "call()")
    assert type(error) is EnvError
    assert error.operation == "call()"


def test_error_for_a_timeout_is_env_timeout_error():
    error = error_for({0: ValueError("x"), 1: TimeoutError("late")}, "step()")
    assert type(error) is EnvTimeoutError


def test_error_for_a_dead_worker_names_each_env_by_its_own_cause():
    died = ChildProcessError("worker 0 died")
    report = WorkerDiedError({0: died, 1: died}, "step()")
    error = error_for({0: report, 1: report, 2: TimeoutError()}, "step()")
    assert type(error) is WorkerDiedError  # a death outranks the timeout
    assert error.errors[0] is died
    assert error.errors[1] is died
