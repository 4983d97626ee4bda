"""``aiovec.make``: a vector env from a gymnasium registry id or an env factory."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import gymnasium
from gymnasium.envs.registration import EnvSpec, VectorizeMode

from aiovec._blocking import BlockingVectorEnv
from aiovec._core.options import VECTOR_OPTIONS
from aiovec._core.validate import describe
from aiovec._vector import AsyncioVectorEnv

__all__ = ("make",)

_VECTOR_KWARGS = frozenset(VECTOR_OPTIONS)

_GYMNASIUM_TRANSPORT = frozenset({"shared_memory", "context", "daemon"})
"""``gymnasium.vector.AsyncVectorEnv`` arguments that say how its subprocesses run.

aiovec decides these itself (observations always travel through shared memory,
workers are started and ended by the vector env), so they are accepted in
``vector_kwargs`` and have no effect; its ``worker`` argument is refused."""


def _build(
    maker: Callable[..., Any], kwargs: dict[str, Any], wrappers: Sequence[Callable[[Any], Any]]
) -> Any:
    env = maker(**kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


_BACKEND_OF_MODE = {VectorizeMode.SYNC: "inline", VectorizeMode.ASYNC: "process"}
"""The backend each of ``gymnasium.make_vec``'s modes stands for (its vector env's twin)."""

_ENTRY_POINT = VectorizeMode.VECTOR_ENTRY_POINT

EnvId = str | EnvSpec | Callable[..., Any]


@overload
def make(  # gymnasium's own vector env, not aiovec's
    env_id: EnvId | None,
    num_envs: int,
    vectorization_mode: Literal["vector_entry_point", VectorizeMode.VECTOR_ENTRY_POINT],
    vector_kwargs: dict[str, Any] | None = ...,
    wrappers: Sequence[Callable[[Any], Any]] | None = ...,
    *,
    blocking: bool | None = ...,
    backend: str | None = ...,
    **kwargs: Any,
) -> gymnasium.vector.VectorEnv[Any, Any, Any]: ...


@overload
def make(
    env_id: EnvId | None = ...,
    num_envs: int = ...,
    vectorization_mode: VectorizeMode | str | None = ...,
    vector_kwargs: dict[str, Any] | None = ...,
    wrappers: Sequence[Callable[[Any], Any]] | None = ...,
    *,
    blocking: Literal[False],
    backend: str | None = ...,
    **kwargs: Any,
) -> AsyncioVectorEnv[Any, Any]: ...


@overload
def make(
    env_id: EnvId | None = ...,
    num_envs: int = ...,
    vectorization_mode: VectorizeMode | str | None = ...,
    vector_kwargs: dict[str, Any] | None = ...,
    wrappers: Sequence[Callable[[Any], Any]] | None = ...,
    *,
    blocking: Literal[True] | None = ...,
    backend: str | None = ...,
    **kwargs: Any,
) -> BlockingVectorEnv: ...


def make(
    env_id: EnvId | None = None,
    num_envs: int = 1,
    vectorization_mode: VectorizeMode | str | None = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[Any], Any]] | None = None,
    *,
    blocking: bool | None = None,
    backend: str | None = None,
    **kwargs: Any,
) -> AsyncioVectorEnv[Any, Any] | BlockingVectorEnv | gymnasium.vector.VectorEnv[Any, Any, Any]:
    """Build a vector env of ``num_envs`` copies of one env, like ``gymnasium.make_vec``.

    The first five arguments are ``gymnasium.make_vec``'s, in its order and
    under its names (its first one may be given as ``id=``): a call of
    ``gymnasium.make_vec`` works unchanged as a call of ``aiovec.make`` and
    returns a `BlockingVectorEnv`, a ``gymnasium.vector.VectorEnv``.

    Unlike ``gymnasium.make_vec``, no mode does not mean the id's vector
    entry point: aiovec builds its own vector env unless
    ``vectorization_mode="vector_entry_point"`` asks for gymnasium's (see
    that argument), so that what ``make`` returns does not depend on the id.

    ``blocking=False`` returns an `AsyncioVectorEnv`, the await API, instead.
    That is a keyword rather than the default because code that calls
    ``make_vec`` expects a gymnasium vector env (``obs, info = envs.reset()``);
    ``async with aiovec.make(..., blocking=False) as venv`` is the way in for
    code that awaits.  The keyword, not a second function, keeps one place
    that turns make_vec's arguments into aiovec's.

    Args:
        env_id: A gymnasium registry id (``"CartPole-v1"``) or ``EnvSpec``, or a
            callable building one env (e.g. an `aiovec.AsyncEnv` subclass);
            also accepted as ``id=``, ``gymnasium.make_vec``'s name for it.
        num_envs: How many copies.
        vectorization_mode: ``"sync"`` or ``"async"`` (or gymnasium's
            ``VectorizeMode``), as in ``gymnasium.make_vec``: the
            ``"inline"`` (``SyncVectorEnv``'s twin) or ``"process"``
            (``AsyncVectorEnv``'s twin) backend, unless ``backend`` says
            otherwise.  ``None``: ``"inline"``.  ``"vector_entry_point"``
            returns what ``gymnasium.make_vec`` returns for it: the id's own
            vector env (e.g. CartPole's, which steps every env in one numpy
            call), built with ``num_envs`` and the env kwargs; it is not an
            aiovec vector env, so it takes none of aiovec's options
            (``backend``, ``blocking``, ``vector_kwargs``, the vector env's
            keywords) and no ``wrappers``.
        vector_kwargs: Arguments of the vector env (``backend``,
            ``num_workers``, ``autoreset_mode``, ``copy``, ...), as in
            ``gymnasium.make_vec``; they may also be given as keywords.
            ``AsyncVectorEnv``'s ``shared_memory``, ``context`` and ``daemon``
            are accepted and have no effect (aiovec runs its own workers).
        wrappers: Callables applied, in order, to each single env.
        blocking: ``False``: return an `AsyncioVectorEnv` (the await API)
            instead of a `BlockingVectorEnv`.  ``None`` and ``True``: a
            `BlockingVectorEnv`.
        backend: Where envs live (see `AsyncioVectorEnv`); default:
            ``vectorization_mode``'s, else ``"inline"``.
        **kwargs: The vector env's options (``num_workers``, ``step_timeout``,
            ``max_concurrency``, ...: every keyword of `AsyncioVectorEnv`) go to the
            vector env; everything else is passed to ``gymnasium.make`` (or to the factory).

    Returns:
        A `BlockingVectorEnv`, or an `AsyncioVectorEnv` with ``blocking=False``
        (gymnasium's own vector env with ``"vector_entry_point"``).

    Raises:
        TypeError: ``env_id`` is neither an id nor a callable, or given twice
            (as ``env_id`` and ``id``); ``num_envs`` is not an int;
            ``vector_kwargs`` is not a dict of the vector env's arguments.
        ValueError: ``num_envs`` is below 1; ``vectorization_mode`` is not a
            mode, or is given with ``blocking=False`` (an `AsyncioVectorEnv` is
            not a gymnasium vector env); an argument is given both in
            ``vector_kwargs`` and as a keyword; ``"vector_entry_point"`` with an
            id that has none, a factory, ``wrappers`` or an aiovec option.

    Example:
        >>> envs = aiovec.make("CartPole-v1", 8)  # as gymnasium.make_vec  # doctest: +SKIP
        >>> obs, infos = envs.reset(seed=0)  # doctest: +SKIP
        >>> async with aiovec.make("CartPole-v1", 8, blocking=False) as venv:  # doctest: +SKIP
        ...     obs, infos = await venv.reset(seed=0)
    """
    given_id = _the_env_id(env_id, kwargs)
    token = kwargs.pop("token", None)
    remote = isinstance(given_id, str) and given_id.startswith(("ws://", "wss://"))
    if token is not None and not remote:
        raise TypeError("token= is for a ws:// URL (a server's sessions); this env_id is none")
    if isinstance(num_envs, bool) or not isinstance(num_envs, int):
        raise TypeError(f"num_envs must be an int >= 1, got {describe(num_envs)}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs}")
    mode = _check_mode(vectorization_mode, blocking)
    if mode is _ENTRY_POINT:
        return _from_entry_point(
            given_id,
            num_envs,
            vector_kwargs=vector_kwargs,
            wrappers=wrappers,
            backend=backend,
            kwargs=kwargs,
        )
    options = _vector_options(vector_kwargs, kwargs, backend)
    env_kwargs = {k: v for k, v in kwargs.items() if k not in _VECTOR_KWARGS}
    backend = options.pop("backend", None)
    if backend is None:
        backend = "inline" if mode is None else _BACKEND_OF_MODE[mode]
    cls = AsyncioVectorEnv if blocking is False else BlockingVectorEnv
    if remote:
        arguments = _remote(str(given_id), num_envs, backend, options, env_kwargs, token, wrappers)
        _not_on_its_own_loop(str(given_id))
        return cls(**arguments)
    maker: Callable[..., Any]
    if isinstance(given_id, str | EnvSpec):
        maker = functools.partial(gymnasium.make, given_id)
    elif callable(given_id):
        maker = given_id
    else:
        raise TypeError(
            f"env_id must be a gymnasium registry id, an EnvSpec or a callable that builds an env, "
            f"got {describe(given_id)}"
        )
    factory = functools.partial(_build, maker, env_kwargs, tuple(wrappers or ()))
    return cls([factory] * num_envs, backend=backend, **options)


def _remote(  # noqa: PLR0917
    url: str,
    num_envs: int,
    backend: str,
    options: dict[str, Any],
    env_kwargs: dict[str, Any],
    token: str | None,
    wrappers: Sequence[Callable[[Any], Any]] | None,
) -> dict[str, Any]:
    """The vector env's arguments for ``num_envs`` sessions on the server at ``url``.

    The keywords that are not the vector env's go to the server's factory (plain
    data only); the server's deadline is the vector env's ``step_timeout``.
    """
    if backend not in {"inline", "remote"} or wrappers:
        what = "wrappers" if wrappers else f"backend={backend!r}"
        raise ValueError(
            f"{url} is an aiovec server: its envs are sessions there (backend='remote'); "
            f"{what} cannot apply to them (the server chooses its own backend and wrappers)"
        )
    from aiovec.backends import load_backend  # noqa: PLC0415  (loaded lazily, with its extra)

    remote = load_backend("remote")
    backend_options = dict(options.pop("backend_options", None) or {})
    backend_options.setdefault("token", token)
    if options.get("step_timeout") is not None:
        backend_options.setdefault("deadline", options["step_timeout"])
    session = remote.session(url, env_kwargs)  # type: ignore[attr-defined]
    return {
        "env_fns": [session] * num_envs,
        "backend": "remote",
        "backend_options": backend_options,
        **options,
    }


def remote_arguments(url: str, num_envs: int, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The vector env's arguments for ``num_envs`` sessions on ``url`` (``make``'s routing).

    ``kwargs`` are `make`'s keywords: the vector env's options, ``token``, and
    the server's factory's keywords.
    """
    kwargs = dict(kwargs)
    token = kwargs.pop("token", None)
    options = _vector_options(None, kwargs, None)
    env_kwargs = {k: v for k, v in kwargs.items() if k not in _VECTOR_KWARGS}
    backend = options.pop("backend", None) or "inline"
    return _remote(url, num_envs, backend, options, env_kwargs, token, None)


def _not_on_its_own_loop(url: str) -> None:
    """Refuse a constructor on the loop that serves ``url``: it would wait on itself."""
    from aiovec._serve.embed import served_here  # noqa: PLC0415  (with the serve extra)

    if served_here(url):
        raise RuntimeError(
            f"the aiovec server at {url} runs on this event loop, and a constructor cannot "
            "wait on the loop it runs on: build the client with "
            "`venv = await server.connect(num_envs, ...)` (the await API), or run the server "
            "on a thread of its own (`with aiovec.serve(...) as server:`)"
        )


def _the_env_id(env_id: object, kwargs: dict[str, Any]) -> object:
    """``env_id``, or ``id=`` (``gymnasium.make_vec``'s name), taken out of ``kwargs``."""
    if "id" not in kwargs:
        if env_id is None:
            raise TypeError("aiovec.make() needs env_id (a registry id, EnvSpec or factory)")
        return env_id
    given = kwargs.pop("id")
    if env_id is not None:
        raise TypeError(
            f"aiovec.make() got the env twice: env_id={describe(env_id)} and id={describe(given)}"
        )
    return given


def _check_mode(mode: object, blocking: bool | None) -> VectorizeMode | None:
    """``vectorization_mode``: ``None``, or one of gymnasium's ``VectorizeMode``."""
    if mode is None:
        return None
    try:
        checked = VectorizeMode(mode)
    except (ValueError, TypeError):
        raise ValueError(
            "vectorization_mode must be 'sync', 'async' or 'vector_entry_point' (or "
            f"gymnasium's VectorizeMode), got {describe(mode)}"
        ) from None
    if blocking is False:
        built = "gymnasium's own" if checked is _ENTRY_POINT else "a BlockingVectorEnv"
        raise ValueError(
            f"vectorization_mode={checked.value!r} returns a gymnasium vector env ({built}), "
            "but blocking=False asks for an AsyncioVectorEnv; give one of them"
        )
    return checked


def _from_entry_point(
    env_id: object,
    num_envs: int,
    *,
    vector_kwargs: object,
    wrappers: object,
    backend: str | None,
    kwargs: dict[str, Any],
) -> gymnasium.vector.VectorEnv[Any, Any, Any]:
    """``gymnasium.make_vec`` of the id's vector entry point, once nothing of aiovec's is asked."""
    if not isinstance(env_id, str | EnvSpec):
        raise ValueError(
            "vectorization_mode='vector_entry_point' needs a registry id or EnvSpec (the vector "
            f"entry point is registered with the id), got {describe(env_id)}"
        )
    spec = gymnasium.spec(env_id) if isinstance(env_id, str) else env_id
    if spec.vector_entry_point is None:
        raise ValueError(
            f"{spec.id} has no vector entry point (vectorization_mode='vector_entry_point'); "
            "leave vectorization_mode out (or 'sync'/'async') to vectorize its single envs"
        )
    asked = sorted(
        [k for k in kwargs if k in _VECTOR_KWARGS]
        + (["backend"] if backend is not None else [])
        + (["vector_kwargs"] if vector_kwargs else [])
        + (["wrappers"] if wrappers else [])
    )
    if asked:
        raise ValueError(
            f"vectorization_mode='vector_entry_point' returns gymnasium's own vector env for "
            f"{spec.id} ({spec.vector_entry_point}), which takes none of aiovec's options: "
            f"leave out {', '.join(asked)}, or leave vectorization_mode out to build aiovec's "
            "vector env"
        )
    return gymnasium.make_vec(env_id, num_envs, vectorization_mode=_ENTRY_POINT, **kwargs)


def _vector_options(
    vector_kwargs: object, kwargs: dict[str, Any], backend: str | None
) -> dict[str, Any]:
    """The vector env's arguments: from ``vector_kwargs`` and from keywords (each once)."""
    given = {} if vector_kwargs is None else vector_kwargs
    if not isinstance(given, dict):
        raise TypeError(f"vector_kwargs must be a dict or None, got {describe(given)}")
    if given.get("worker") is not None:
        raise TypeError(
            "vector_kwargs['worker']: aiovec runs its own workers and takes no worker function "
            "of gymnasium's AsyncVectorEnv; leave it out"
        )
    given = {k: v for k, v in given.items() if k not in _GYMNASIUM_TRANSPORT and k != "worker"}
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
