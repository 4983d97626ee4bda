"""Envs grouped on workers fail alike on ``backend="process"`` and ``backend="ray"``.

Both backends share one pool (``aiovec/backends/pool/``) for what a
worker's death, a step timeout and an env that raises mean.  Each scenario runs
on both, and what a user sees must be the same: the error's type, its message
(once the worker's own name is taken out), the envs it names, the type of each
cause, the vector env's state afterwards, and what the next ``reset()`` does.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any

import gymnasium
import pytest
from conftest import HAVE_RAY
from gymnasium import spaces

import aiovec
from aiovec.testing import FaultyEnv, KillingEnv
from faults.scenarios import (
    LONG,
    NUM_ENVS,
    NUM_WORKERS,
    RESET_TIMEOUT,
    STEP_TIMEOUT,
    Ctx,
    Once,
    _hanging,
    _killing,
    _raising,
    actions_for,
    oracle_fns,
    space_env,
)

pytestmark = pytest.mark.timeout(180)

FAILING = 2  # its worker hosts envs 2-3
SCENARIOS = {
    "worker-killed": _killing,
    "step-timeout": _hanging,
    "env-raises": lambda ctx: _raising("step", ctx),
}


def _normalised(text: str) -> str:
    """``text`` with what names one worker in particular (kind, pid, node) taken out."""
    text = re.sub(r"worker process \d+|Ray actor", "<worker>", text)
    text = re.sub(r" on node \w+", "", text)
    return re.sub(r"died \([^)]*\)", "died (<how>)", text)


def _aiovec_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        _normalised(r.getMessage())
        for r in caplog.records
        if r.name == "aiovec" and r.levelno == logging.WARNING
    ]


def _what_a_user_sees(
    backend: str, scenario: str, gates: Any, caplog: pytest.LogCaptureFixture
) -> dict[str, Any]:
    fns = oracle_fns(LONG)
    ctx = Ctx(flavour="sync", at=1, lengths=LONG, gates=gates)
    fns[FAILING] = SCENARIOS[scenario](ctx)
    timeouts = {"step_timeout": STEP_TIMEOUT, "reset_timeout": RESET_TIMEOUT}
    venv = aiovec.BlockingVectorEnv(
        fns, backend=backend, num_workers=NUM_WORKERS, on_error="raise", **timeouts
    )
    seen: dict[str, Any] = {}
    try:
        venv.reset(seed=0)
        caplog.clear()
        with pytest.raises(aiovec.EnvError) as info:
            venv.step(actions_for(1))
        error = info.value
        seen["error"] = type(error).__name__
        seen["message"] = _normalised(str(error))
        seen["envs"] = sorted(error.errors)
        seen["causes"] = {i: type(cause).__name__ for i, cause in error.errors.items()}
        seen["cause messages"] = {i: _normalised(str(c)) for i, c in error.errors.items()}
        seen["state"] = venv.vector_env.state.name
        gates.release_all()
        venv.reset(seed=1)  # rebuilds what is lost, replaces what is stuck
        seen["state after reset"] = venv.vector_env.state.name
        seen["warnings"] = _aiovec_warnings(caplog)
        _, rewards, *_ = venv.step(actions_for(2))
        seen["steps after reset"] = len(rewards) == NUM_ENVS
    finally:
        gates.release_all()
        venv.close()
    return seen


@pytest.mark.ray
@pytest.mark.skipif(not HAVE_RAY, reason='needs the "ray" extra: pip install "aiovec[ray]"')
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_process_and_ray_fail_alike(
    scenario: str, gates: Any, caplog: pytest.LogCaptureFixture, ray_cluster: Any
) -> None:
    caplog.set_level(logging.WARNING, logger="aiovec")
    on_process = _what_a_user_sees("process", scenario, gates, caplog)
    on_ray = _what_a_user_sees("ray", scenario, gates, caplog)
    assert on_process == on_ray
    assert on_process["state"] == "BROKEN"
    assert on_process["steps after reset"]


def test_a_killed_worker_is_named_with_how_it_died(gates: Any) -> None:
    ctx = Ctx(flavour="sync", at=1, lengths=LONG, gates=gates)
    fns = oracle_fns(LONG)
    fns[FAILING] = _killing(ctx)
    with aiovec.BlockingVectorEnv(fns, backend="process", num_workers=NUM_WORKERS) as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.WorkerDiedError) as first:
            venv.step(actions_for(1))
        cause = first.value.errors[FAILING]
        assert isinstance(cause, ChildProcessError)
        assert re.fullmatch(
            r"worker process \d+ hosting envs 2-3 died \(killed by SIGKILL\)", str(cause)
        ), str(cause)


def test_a_replaced_worker_is_logged_as_a_warning_naming_it_and_its_envs(
    gates: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = Ctx(flavour="sync", at=1, lengths=LONG, gates=gates)
    fns = oracle_fns(LONG)
    fns[FAILING] = _killing(ctx)
    caplog.set_level(logging.WARNING, logger="aiovec")
    with aiovec.BlockingVectorEnv(fns, backend="process", num_workers=NUM_WORKERS) as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.WorkerDiedError):
            venv.step(actions_for(1))
        dead = venv.vector_env._backend.pids[1]
        assert not [r for r in caplog.records if r.name == "aiovec"], "nothing replaced yet"
        venv.reset(seed=1)
    (record,) = [r for r in caplog.records if r.name == "aiovec"]
    assert record.levelno == logging.WARNING
    assert f"worker process {dead} hosting envs 2-3" in record.getMessage()
    assert "[2, 3]" in record.getMessage()


def test_a_healthy_worker_rebuilds_in_place_without_a_warning(
    gates: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = Ctx(flavour="sync", at=1, lengths=LONG, gates=gates)
    fns = oracle_fns(LONG)
    fns[FAILING] = _raising("step", ctx)
    caplog.set_level(logging.WARNING, logger="aiovec")
    policy = aiovec.RestartPolicy(backoff=0.0)
    with aiovec.BlockingVectorEnv(
        fns, backend="process", num_workers=NUM_WORKERS, on_error=policy
    ) as venv:
        venv.reset(seed=0)
        pids = venv.vector_env._backend.pids
        *_, truncations, _ = venv.step(actions_for(1))
        assert truncations.tolist() == [i == FAILING for i in range(NUM_ENVS)]
        assert venv.vector_env._backend.pids == pids
    assert not [r for r in caplog.records if r.name == "aiovec" and "replacing" in r.getMessage()]
    assert any("restarting" in r.getMessage() for r in caplog.records)  # the restart is said


class OtherSpace(gymnasium.Wrapper[Any, Any, Any, Any]):
    """An env whose observation space is not the others'."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self.observation_space = spaces.Discrete(7)


def _faulty_then_other_spaces(once: Once, fault: str, spare: int) -> Any:
    """A faulty env on the first build; every rebuild has another observation space."""
    if not once.take():
        return OtherSpace(space_env(LONG))
    if fault == "killed":
        return KillingEnv(space_env(LONG), spare=spare, at=1)
    return FaultyEnv(space_env(LONG), method="step", at=1)


@pytest.mark.parametrize("fault", ["raises", "killed"])
def test_a_rebuilt_env_with_other_spaces_is_refused_alike(
    backend: str, fault: str, gates: Any
) -> None:
    # rebuilt inside its worker (raises), or in a new worker (killed), on every backend
    fns = oracle_fns(LONG)
    fns[FAILING] = functools.partial(_faulty_then_other_spaces, gates.once(), fault, os.getpid())
    policy = aiovec.RestartPolicy(backoff=0.0, max_restarts=1)
    with aiovec.BlockingVectorEnv(
        fns, backend=backend, num_workers=NUM_WORKERS, on_error=policy
    ) as venv:
        venv.reset(seed=0)
        with pytest.raises(aiovec.EnvError) as info:
            venv.step(actions_for(1))
        cause = info.value.errors[FAILING]
        assert isinstance(cause, ValueError), repr(cause)
        assert str(cause).startswith(
            "the rebuilt env 2 has observation_space Discrete(7), the others"
        )
