"""TorchRL over aiovec: ``GymWrapper(BlockingVectorEnv(...))``, as docs/migrating.md says.

TorchRL wraps a gymnasium ``VectorEnv`` whose autoreset mode is ``DISABLED``
(TorchRL resets the envs that ended itself) or ``SAME_STEP``; its rollouts
through aiovec must be gymnasium's, value for value, and its collector must run.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium
import pytest

with warnings.catch_warnings():  # TorchRL's own deprecations, as it imports itself
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip(
        "torchrl", reason='needs the "torchrl" extra: pip install "aiovec[torchrl]"'
    )
    import torch
    from torchrl.collectors import Collector
    from torchrl.envs import GymWrapper

import aiovec

BACKENDS = ["inline", "thread", "process"]
MODES = ["Disabled", "SameStep"]


def cartpoles(n: int = 3) -> list[Any]:
    return [lambda: gymnasium.make("CartPole-v1")] * n


def rollout(venv: gymnasium.vector.VectorEnv[Any, Any, Any]) -> Any:
    """60 steps of random actions (torch's generator, seeded), envs reset as they end."""
    env = GymWrapper(venv)
    try:
        env.set_seed(0)
        torch.manual_seed(0)
        return env.rollout(60, break_when_any_done=False)
    finally:
        env.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rollout_is_gymnasiums(backend: str, mode: str) -> None:
    ours = rollout(aiovec.BlockingVectorEnv(cartpoles(), backend=backend, autoreset_mode=mode))
    theirs = rollout(gymnasium.vector.SyncVectorEnv(cartpoles(), autoreset_mode=mode))
    keys = list(theirs.keys(include_nested=True, leaves_only=True))
    assert set(ours.keys(include_nested=True, leaves_only=True)) == set(keys)
    assert theirs["next", "done"].any()  # envs ended and were reset within the rollout
    for key in keys:
        assert torch.equal(ours[key], theirs[key]), key


def test_torchrls_collector_runs(tmp_path: Any) -> None:
    venv = aiovec.BlockingVectorEnv(cartpoles(), backend="process", autoreset_mode="Disabled")
    collector = Collector(GymWrapper(venv), policy=None, frames_per_batch=30, total_frames=90)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert [batch.batch_size for batch in batches] == [torch.Size([3, 10])] * 3
    assert venv.closed


def test_next_step_autoreset_is_refused_by_torchrl() -> None:
    """What the docs say to avoid: aiovec's default mode, which TorchRL does not take."""
    with (
        aiovec.BlockingVectorEnv(cartpoles()) as venv,
        pytest.raises(RuntimeError, match="SAME_STEP or DISABLED"),
    ):
        GymWrapper(venv)
