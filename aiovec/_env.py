"""``AsyncEnv``: the env protocol of aiovec, ``gymnasium.Env`` with coroutines."""

from __future__ import annotations

import inspect
from typing import Any, Generic, SupportsFloat, TypeVar

import gymnasium
import numpy as np
from gymnasium.core import RenderFrame
from gymnasium.utils import seeding

__all__ = ("AsyncEnv", "is_async_env")

ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")


class AsyncEnv(Generic[ObsType, ActType]):
    """Base class for envs whose ``reset``/``step``/``render``/``close`` are coroutines.

    It mirrors ``gymnasium.Env``: subclasses set ``observation_space`` and
    ``action_space``, implement ``step`` and ``reset``, and call
    ``await super().reset(seed=seed)`` at the start of ``reset`` so that
    ``np_random`` is seeded exactly as ``gymnasium.Env`` seeds it.

    The base class is a convenience, not a requirement: any object with these
    coroutine methods and the two spaces is accepted (duck typing).

    Example:
        >>> class Echo(AsyncEnv[int, int]):
        ...     observation_space = gymnasium.spaces.Discrete(10)
        ...     action_space = gymnasium.spaces.Discrete(10)
        ...     async def reset(self, *, seed=None, options=None):
        ...         await super().reset(seed=seed)
        ...         return 0, {}
        ...     async def step(self, action):
        ...         return int(action), 0.0, False, False, {}
    """

    observation_space: gymnasium.spaces.Space[ObsType]
    action_space: gymnasium.spaces.Space[ActType]
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (as gymnasium.Env)
    render_mode: str | None = None
    spec: gymnasium.envs.registration.EnvSpec | None = None

    _np_random: np.random.Generator | None = None
    _np_random_seed: int | None = None

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsType, dict[str, Any]]:
        """Reset the env; subclasses call ``await super().reset(seed=seed)`` first.

        Args:
            seed: Seeds ``np_random`` when given, as ``gymnasium.Env.reset`` does.
            options: Env-specific reset options.

        Returns:
            The first observation and an info dict (in subclasses; the base
            class only seeds, exactly like ``gymnasium.Env.reset``).
        """
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)
        return None  # type: ignore[return-value]  # as gymnasium.Env.reset

    async def step(
        self, action: ActType
    ) -> tuple[ObsType, SupportsFloat, bool, bool, dict[str, Any]]:
        """Run one timestep: ``(obs, reward, terminated, truncated, info)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement `async def step`")

    async def render(self) -> RenderFrame | list[RenderFrame] | None:
        """Return a frame for ``render_mode`` (``None`` by default)."""
        return None

    async def close(self) -> None:
        """Release the env's resources (connections, clients). Default: nothing."""
        return

    @property
    def np_random(self) -> np.random.Generator:
        """The env's random generator, seeded randomly on first use if never seeded."""
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        return self._np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._np_random = value
        self._np_random_seed = -1  # as gymnasium: the seed of a set generator is unknown

    @property
    def np_random_seed(self) -> int:
        """The seed of ``np_random`` (``-1`` when a generator was assigned directly)."""
        if self._np_random_seed is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        return self._np_random_seed

    @property
    def unwrapped(self) -> AsyncEnv[ObsType, ActType]:
        """The env itself (for symmetry with ``gymnasium.Env``)."""
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} instance>"


def is_async_env(env: object) -> bool:
    """Whether ``env`` speaks the async protocol (coroutine ``reset`` and ``step``).

    Raises:
        TypeError: If only one of ``reset``/``step`` is a coroutine function.
    """
    step_async = inspect.iscoroutinefunction(getattr(env, "step", None))
    reset_async = inspect.iscoroutinefunction(getattr(env, "reset", None))
    if step_async != reset_async:
        raise TypeError(
            f"{type(env).__name__} mixes protocols: step is "
            f"{'a coroutine' if step_async else 'synchronous'} but reset is "
            f"{'a coroutine' if reset_async else 'synchronous'}; make both `async def` "
            "(an AsyncEnv) or both plain (a gymnasium.Env)"
        )
    return step_async
