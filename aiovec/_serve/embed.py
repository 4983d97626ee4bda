"""``aiovec.serve``: the server embedded in a program, on its loop or on a thread of its own.

- ``async with aiovec.serve(factory) as server`` runs the server on the
  caller's event loop (an async app that also serves envs).  A client on that
  loop must never block it: ``await server.connect(num_envs)`` builds the
  await API with ``AsyncioVectorEnv.create``, and a ``backend="remote"`` vector
  env whose server runs on its own loop connects through the loop
  (`served_here`); a constructor there (``aiovec.make(url, ...)``) is refused,
  saying so, since it would wait on the loop it holds.
- ``with aiovec.serve(factory) as server`` runs it on a thread with a loop of
  its own: what a script or a test that steps its envs with a blocking client
  in the same process needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from aiovec._serve.server import Server
from aiovec._vector import AsyncioVectorEnv

__all__ = ("Serving", "served_here")

_ON_LOOP: weakref.WeakValueDictionary[str, asyncio.AbstractEventLoop] = (
    weakref.WeakValueDictionary()
)
"""The URLs of the servers running on a caller's loop (``async with``), and their loops."""


def served_here(url: str) -> bool:
    """Whether ``url`` is served by a server of this process running on the running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return _ON_LOOP.get(url) is loop


class Serving:
    """What ``aiovec.serve`` returns: `Server` on the caller's loop, or on a thread of its own.

    ``async with`` runs it on the running loop; ``with`` on a thread (and loop)
    of its own.  Either way ``url`` is its ``ws://HOST:PORT`` once entered, and
    leaving closes every session and connection.
    """

    def __init__(self, factory: Callable[..., Any], **options: Any) -> None:
        self._server = Server(factory, **options)  # the arguments are checked here, now
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._entered = False
        self.url = ""

    @property
    def server(self) -> Server:
        """The server (on a thread, its state lives there: look, do not touch)."""
        return self._server

    def _enter(self) -> None:
        if self._entered:
            raise RuntimeError("this server was started already")
        self._entered = True

    # -- on the caller's loop ----------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._enter()
        await self._server.start()
        self.url = self._server.url
        _ON_LOOP[self.url] = asyncio.get_running_loop()
        return self

    async def connect(self, num_envs: int, **kwargs: Any) -> AsyncioVectorEnv[Any, Any]:
        """``num_envs`` sessions on this server, as an `aiovec.AsyncioVectorEnv` built on this loop.

        ``aiovec.make(server.url, num_envs, blocking=False, **kwargs)``, built
        with ``await AsyncioVectorEnv.create``: for a client on the loop the
        server runs on (``async with``), which a constructor would block.
        """
        from aiovec._make import remote_arguments  # noqa: PLC0415  (make imports this module)

        return await AsyncioVectorEnv.create(**remote_arguments(self.url, num_envs, kwargs))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _ON_LOOP.pop(self.url, None)
        await self._server.aclose()

    # -- on a thread of its own --------------------------------------------------------

    def __enter__(self) -> Self:
        self._enter()
        self._thread = threading.Thread(target=self._run, name="aiovec-serve", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop ended already
                loop.call_soon_threadsafe(stop.set)
        thread.join()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self._server.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self.url = self._server.url
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await self._server.aclose()
