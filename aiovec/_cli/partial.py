"""``aiovec bench``'s partial-stepping measurement: the same envs through a `aiovec.Collector`.

A collector configuration is measured like a lock-step one (build, reset, a
warm-up, then timed work for its share of the time), except that the timed
unit is one batch of segments sized to hold about ``num_envs`` env-steps, so
that its time reads like a vector step's.  The policy replays sampled
actions, as the lock-step measurement does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import aiovec
from aiovec._cli.memory import PeakMemory
from aiovec._cli.report import StepTimes, timed
from aiovec._core.segments import tree_map

__all__ = ("SEGMENT", "collector_shape", "measure_collector")

SEGMENT = 8
"""The longest segment the bench collects (fewer for fewer envs)."""


def collector_shape(num_envs: int) -> tuple[int, int]:
    """``(segment_length, batch_size)`` for a batch of about ``num_envs`` env-steps."""
    length = min(SEGMENT, num_envs)
    return length, max(1, num_envs // length)


async def measure_collector(
    venv: aiovec.AsyncioVectorEnv[Any, Any],
    actions: list[Any],
    seconds: float,
    memory: PeakMemory,
    min_batches: int,
) -> StepTimes:
    """Time batches of a collector over ``venv`` (a random policy) for ``seconds``."""
    length, size = collector_shape(venv.num_envs)
    calls = [0]

    def policy(obs: Any, env_ids: np.ndarray) -> Any:
        calls[0] += 1
        return tree_map(lambda a: a[: len(env_ids)], actions[calls[0] % len(actions)])

    collector = aiovec.Collector(venv, policy, segment_length=length, batch_size=size, seed=0)
    async with collector:
        batches = aiter(collector)
        await anext(batches)  # warm-up
        times = await timed(lambda k: anext(batches), length * size, seconds, memory, min_batches)
        await batches.aclose()  # type: ignore[attr-defined]
    return times
