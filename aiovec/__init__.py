"""aiovec: an asyncio-based concurrent vector environment for reinforcement learning.

Envs implement ``async def reset/step`` (or are plain ``gymnasium.Env``);
`AsyncioVectorEnv` steps all of them together on one event loop, and
`BlockingVectorEnv` is the same thing as a synchronous
``gymnasium.vector.VectorEnv``.
"""

from aiovec._blocking import BlockingVectorEnv
from aiovec._collector import Collector
from aiovec._core.episodes import DiscardedGroup, Episode, EpisodeBatch, rewards_differ
from aiovec._core.latency import LatencyStats
from aiovec._core.lifecycle import State
from aiovec._core.restart import RestartPolicy
from aiovec._core.segments import SegmentBatch
from aiovec._env import AsyncEnv
from aiovec._episodes import EpisodeCollector
from aiovec._errors import (
    AlreadyPendingCallError,
    ClosedError,
    EnvError,
    EnvTimeoutError,
    NoAsyncCallError,
    StateError,
    WorkerDiedError,
)
from aiovec._make import make
from aiovec._serve import serve
from aiovec._vector import AsyncioVectorEnv

__version__ = "0.1.0"  # equal to pyproject.toml's (tests/test_public_api.py)

__all__ = (
    "AlreadyPendingCallError",
    "AsyncEnv",
    "AsyncioVectorEnv",
    "BlockingVectorEnv",
    "ClosedError",
    "Collector",
    "DiscardedGroup",
    "EnvError",
    "EnvTimeoutError",
    "Episode",
    "EpisodeBatch",
    "EpisodeCollector",
    "LatencyStats",
    "NoAsyncCallError",
    "RestartPolicy",
    "SegmentBatch",
    "State",
    "StateError",
    "WorkerDiedError",
    "__version__",
    "make",
    "rewards_differ",
    "serve",
)

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        _obj.__module__ = "aiovec"
del _name, _obj
