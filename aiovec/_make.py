"""``aiovec.make``: a vector env from a gymnasium registry id or an env factory."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec

from aiovec._blocking import BlockingVectorEnv
from aiovec._core.options import VECTOR_OPTIONS
from aiovec._core.validate import describe
from aiovec._vector import AsyncioVectorEnv

__all__ = ("make",)

_VECTOR_KWARGS = frozenset(VECTOR_OPTIONS)


def _build(
    maker: Callable[..., Any], kwargs: dict[str, Any], wrappers: Sequence[Callable[[Any], Any]]
) -> Any:
    env = maker(**kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


def make(
    env_id: str | EnvSpec | Callable[..., Any],
    num_envs: int = 1,
    *,
    blocking: bool = False,
    backend: str = "inline",
    wrappers: Sequence[Callable[[Any], Any]] | None = None,
    **kwargs: Any,
) -> AsyncioVectorEnv[Any, Any] | BlockingVectorEnv:
    """Build a vector env of ``num_envs`` copies of one env, like ``gymnasium.make_vec``.

    Args:
        env_id: A gymnasium registry id (``"CartPole-v1"``) or ``EnvSpec``, or a
            callable building one env (e.g. an `aiovec.AsyncEnv` subclass).
        num_envs: How many copies.
        blocking: Return a `BlockingVectorEnv` instead of an
            `AsyncioVectorEnv`.
        backend: Where envs live (see `AsyncioVectorEnv`).
        wrappers: Callables applied, in order, to each single env.
        **kwargs: The vector env's options (``num_workers``, ``step_timeout``,
            ``max_concurrency``, ...: every keyword of `AsyncioVectorEnv`) go to the
            vector env; everything else is passed to ``gymnasium.make`` (or to the factory).

    Returns:
        The vector env.

    Raises:
        TypeError: ``env_id`` is neither an id nor a callable, or ``num_envs``
            is not an int.
        ValueError: ``num_envs`` is below 1.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int):
        raise TypeError(f"num_envs must be an int >= 1, got {describe(num_envs)}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs}")
    vector_kwargs = {k: v for k, v in kwargs.items() if k in _VECTOR_KWARGS}
    env_kwargs = {k: v for k, v in kwargs.items() if k not in _VECTOR_KWARGS}
    maker: Callable[..., Any]
    if isinstance(env_id, str | EnvSpec):
        maker = functools.partial(gymnasium.make, env_id)
    elif callable(env_id):
        maker = env_id
    else:
        raise TypeError(
            f"env_id must be a gymnasium registry id, an EnvSpec or a callable that builds an env, "
            f"got {describe(env_id)}"
        )
    factory = functools.partial(_build, maker, env_kwargs, tuple(wrappers or ()))
    cls = BlockingVectorEnv if blocking else AsyncioVectorEnv
    return cls([factory] * num_envs, backend=backend, **vector_kwargs)
