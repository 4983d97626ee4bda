"""`ServerThread`: a `GameServer` on a thread of its own, for synchronous code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

if TYPE_CHECKING:
    from aiovec.gameserver.server import GameServer

__all__ = ("ServerThread",)

T = TypeVar("T")


class ServerThread:
    """A `GameServer` running on a thread of its own, with its own event loop.

    Made by `GameServer.start_in_thread`.  Its methods may be called
    from any other thread; ``stop()`` stops the server and joins the thread.

    Args:
        server: The server to run (not started yet).
    """

    def __init__(self, server: GameServer) -> None:
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="aiovec-game-server", daemon=True)

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self.server.port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the server."""
        return self.server.address

    def start(self) -> None:
        """Start the thread and wait until the server listens (or raise why it could not)."""
        self._thread.start()
        try:
            self._ready.result()
        except BaseException:
            self._thread.join()
            raise

    def stop(self) -> None:
        """Stop the server, let its loop finish and join the thread (idempotent)."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread.ident is not None:
            self._thread.join()

    def drop_all(self) -> int:
        """`GameServer.drop_all`, run on the server's loop."""
        return self._call(self.server.drop_all)

    def pause_accepting(self, *, refuse: bool = False) -> None:
        """`GameServer.pause_accepting`, run on the server's loop."""
        self._call(lambda: self.server.pause_accepting(refuse=refuse))

    def resume_accepting(self) -> None:
        """`GameServer.resume_accepting`, run on the server's loop."""
        self._call(self.server.resume_accepting)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, fn: Callable[[], T]) -> T:
        if self._loop is None or not self._thread.is_alive():
            raise RuntimeError("the server thread is not running")

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        try:
            await self.server.start()
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._loop = asyncio.get_running_loop()
        self._ready.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await self.server.stop()
