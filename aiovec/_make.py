"""``aiovec.make``: a vector env from a gymnasium registry id or an env factory."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec, VectorizeMode

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


_BACKEND_OF_MODE = {VectorizeMode.SYNC: "inline", VectorizeMode.ASYNC: "process"}
"""The backend each of ``gymnasium.make_vec``'s modes stands for (its vector env's twin)."""


def make(
    env_id: str | EnvSpec | Callable[..., Any],
    num_envs: int = 1,
    vectorization_mode: VectorizeMode | str | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[Any], Any]] | None = None,
    *,
    blocking: bool | None = None,
    backend: str | None = None,
    **kwargs: Any,
) -> AsyncioVectorEnv[Any, Any] | BlockingVectorEnv:
    """Build a vector env of ``num_envs`` copies of one env, like ``gymnasium.make_vec``.

    The first five arguments are ``gymnasium.make_vec``'s, in its order: a call
    of ``gymnasium.make_vec`` works unchanged as a call of ``aiovec.make`` and
    returns a `BlockingVectorEnv` (a ``gymnasium.vector.VectorEnv``).

    Args:
        env_id: A gymnasium registry id (``"CartPole-v1"``) or ``EnvSpec``, or a
            callable building one env (e.g. an `aiovec.AsyncEnv` subclass).
        num_envs: How many copies.
        vectorization_mode: ``"sync"`` or ``"async"`` (or gymnasium's
            ``VectorizeMode``), as in ``gymnasium.make_vec``: a
            `BlockingVectorEnv` on the ``"inline"`` (``SyncVectorEnv``'s twin)
            or ``"process"`` (``AsyncVectorEnv``'s twin) backend, unless
            ``backend`` says otherwise.  ``None``: see ``blocking``.
        vector_kwargs: Arguments of the vector env (``backend``,
            ``num_workers``, ``autoreset_mode``, ``copy``, ...), as in
            ``gymnasium.make_vec``; they may also be given as keywords.
        wrappers: Callables applied, in order, to each single env.
        blocking: Return a `BlockingVectorEnv` instead of an
            `AsyncioVectorEnv` (default: ``True`` when ``vectorization_mode``
            is given, else ``False``).
        backend: Where envs live (see `AsyncioVectorEnv`); default:
            ``vectorization_mode``'s, else ``"inline"``.
        **kwargs: The vector env's options (``num_workers``, ``step_timeout``,
            ``max_concurrency``, ...: every keyword of `AsyncioVectorEnv`) go to the
            vector env; everything else is passed to ``gymnasium.make`` (or to the factory).

    Returns:
        The vector env.

    Raises:
        TypeError: ``env_id`` is neither an id nor a callable, ``num_envs``
            is not an int, or ``vector_kwargs`` is not a dict of the vector
            env's arguments.
        ValueError: ``num_envs`` is below 1; ``vectorization_mode`` is not
            ``"sync"`` or ``"async"``, or is given with ``blocking=False`` (an
            `AsyncioVectorEnv` is not a gymnasium vector env); an argument is
            given both in ``vector_kwargs`` and as a keyword.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int):
        raise TypeError(f"num_envs must be an int >= 1, got {describe(num_envs)}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs}")
    mode = _check_mode(vectorization_mode, blocking)
    options = _vector_options(vector_kwargs, kwargs, backend)
    env_kwargs = {k: v for k, v in kwargs.items() if k not in _VECTOR_KWARGS}
    backend = options.pop("backend", None)
    if backend is None:
        backend = "inline" if mode is None else _BACKEND_OF_MODE[mode]
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
    cls = BlockingVectorEnv if blocking or mode is not None else AsyncioVectorEnv
    return cls([factory] * num_envs, backend=backend, **options)


def _check_mode(mode: object, blocking: bool | None) -> VectorizeMode | None:
    """``vectorization_mode``: ``None``, or a mode aiovec has a twin for."""
    if mode is None:
        return None
    try:
        checked = VectorizeMode(mode)
    except (ValueError, TypeError):
        checked = None
    if checked not in _BACKEND_OF_MODE:
        raise ValueError(
            "vectorization_mode must be 'sync' or 'async' (or gymnasium's VectorizeMode.SYNC/"
            f"ASYNC; aiovec does not use vector entry points), got {describe(mode)}"
        )
    if blocking is False:
        raise ValueError(
            f"vectorization_mode={checked.value!r} builds a gymnasium vector env (a "
            "BlockingVectorEnv), but blocking=False asks for an AsyncioVectorEnv; "
            "give one of them"
        )
    return checked


def _vector_options(
    vector_kwargs: object, kwargs: dict[str, Any], backend: str | None
) -> dict[str, Any]:
    """The vector env's arguments: from ``vector_kwargs`` and from keywords (each once)."""
    given = {} if vector_kwargs is None else vector_kwargs
    if not isinstance(given, dict):
        raise TypeError(f"vector_kwargs must be a dict or None, got {describe(given)}")
    allowed = _VECTOR_KWARGS
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise TypeError(
            f"vector_kwargs holds {unknown}, which are not arguments of aiovec's vector envs "
            f"(those are {sorted(allowed)})"
        )
    keywords = {k: v for k, v in kwargs.items() if k in _VECTOR_KWARGS}
    if backend is not None:
        keywords["backend"] = backend
    twice = sorted(set(given) & set(keywords))
    if twice:
        raise ValueError(f"{twice} given both in vector_kwargs and as keywords; give each once")
    return {**given, **keywords}
