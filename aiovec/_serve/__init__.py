"""``aiovec serve``: envs on a server, stepped by a local vector env over one WebSocket.

The parts (docs/serve.md is the user's page and the protocol's description):

- ``codec.py``: values, spaces and errors as msgpack data (no pickle, pure);
- ``protocol.py``: the messages (msgspec structs), frames, step payloads (pure);
- ``calls.py``: calls other than steps on the wire, and the checks of what a peer sends;
- ``steps.py``: step data on the wire (actions out, rows of transitions back);
- ``server.py``, ``connection.py``, ``group.py``: the server (aiohttp): connections,
  session groups on aiovec's own backends, answers kept for resume;
- ``embed.py``: `serve`'s server, on the caller's loop or on a thread of its own;
- ``wsclient.py``, ``link.py``: the client's side of a WebSocket over a plain socket
  (framing and handshake; the connection, its waits, its resume).

The client is ``aiovec/backends/remote.py`` (``backend="remote"``), which
``aiovec.make("ws://host:port", num_envs)`` builds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiovec._serve.embed import Serving

__all__ = ("serve",)


def serve(
    factory: Callable[..., Any],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    backend: str = "inline",
    token: str | None = None,
    **options: Any,
) -> Serving:
    """Serve envs built by ``factory``: ``async with aiovec.serve(make_env) as server: ...``.

    Each session a client opens is one env from ``factory(**kwargs)`` (the
    client's keyword arguments; none by default), run on aiovec's ``backend``
    on the server, and clients connect with ``aiovec.make(server.url, num_envs)``
    (docs/serve.md).  Needs ``pip install "aiovec[serve]"``.

    ``async with`` runs the server on the running event loop (a client on that
    same loop: ``await server.connect(num_envs)``); ``with`` runs it on a thread
    with a loop of its own (a blocking client in the same process).

    Args:
        factory: Builds one env (a ``gymnasium.Env`` or an `aiovec.AsyncEnv`).
        host: The address to listen on; any but a loopback address needs ``token``.
        port: The port (0: any free one; ``server.url`` says which).
        backend: Where the sessions' envs run: ``"inline"``, ``"thread"`` or ``"process"``.
        token: The token clients must give (default: ``$AIOVEC_SERVE_TOKEN``).
        **options: ``num_workers`` (the backend's), ``resume_window`` (seconds a
            dropped client's sessions wait for it; default 60), ``heartbeat``
            (seconds; default 5), ``max_sessions`` (per connection), ``max_frame``
            (bytes), ``window`` (requests in the works per connection).

    Returns:
        The server, not started: an async context manager (on this loop) and a
        plain one (on a thread); ``url`` is its ``ws://HOST:PORT`` once entered.

    Raises:
        ValueError: ``host`` is not a loopback address and there is no token.
        ModuleNotFoundError: The ``serve`` extra is not installed.

    Example:
        >>> async with aiovec.serve(make_env) as server:  # doctest: +SKIP
        ...     async with await server.connect(8) as venv:
        ...         obs, infos = await venv.reset(seed=0)
    """
    try:
        from aiovec._serve.embed import Serving  # noqa: PLC0415  (its extra, on first use)
    except ModuleNotFoundError as exc:
        if exc.name not in {"aiohttp", "msgspec"}:
            raise
        raise ModuleNotFoundError(
            f'aiovec.serve needs {exc.name}, which is not installed: pip install "aiovec[serve]"',
            name=exc.name,
        ) from exc
    return Serving(factory, host=host, port=port, backend=backend, token=token, **options)
