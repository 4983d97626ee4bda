"""The scenario suites' aiovec server: ``backend="remote"`` runs every scenario through it.

One server (`aiovec.serve`, on a thread of its own) serves the whole session,
started before the first test's leak check when a collected test needs it.  Its
factory builds the env registered under the session's ``key``: `sessions`
registers a test's factories (local callables: the server runs in this process)
and gives the vector env `Remote` sessions naming them, so a scenario hands
aiovec the same envs on every backend.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

HAVE_SERVE = all(importlib.util.find_spec(name) is not None for name in ("aiohttp", "msgspec"))
SERVE_SKIP = 'needs the "serve" extra: pip install "aiovec[serve]"'

FACTORIES: dict[str, Callable[[], Any]] = {}
_keys = itertools.count()
URL: list[str] = []  # the session's server, while it runs


def build(key: str) -> Any:
    """The server's factory: the env of the factory registered under ``key``."""
    return FACTORIES[key]()


def sessions(env_fns: Any) -> Any:
    """Sessions on the session's server for ``env_fns`` (anything else is passed on, as is)."""
    if not isinstance(env_fns, list | tuple) or not all(map(callable, env_fns)):
        return env_fns
    from aiovec.backends.remote import Remote

    made = []
    for fn in env_fns:
        key = str(next(_keys))
        FACTORIES[key] = fn
        made.append(Remote(URL[0], {"key": key}))
    return made


def forget() -> None:
    """Drop the registered factories (a test's envs are closed)."""
    FACTORIES.clear()


def running_server(**options: Any) -> Iterator[str]:
    """Run the session's server; yields its URL."""
    import aiovec

    with aiovec.serve(build, **options) as server:
        URL.append(server.url)
        try:
            yield server.url
        finally:
            URL.clear()


def remote_options(fns: Sequence[Any]) -> dict[str, Any]:
    """Nothing more: the sessions name their server."""
    return {}
