"""The game server: one `Session` per TCP connection on 127.0.0.1, replies delayed on one timer.

Each connection is an ``asyncio.Protocol`` with its session; no task per
connection.  Each ``reset``/``step`` reply waits ``latency`` (+ seeded
``jitter``) seconds in one heap shared by every connection, under one loop
timer.  Any protocol error gets an ``error`` reply and that connection
closed; other sessions never notice.  Tests make failures with
`GameServer.drop_all` and `GameServer.pause_accepting`;
`GameServer.start_in_thread` runs the server on its own thread and loop for
synchronous code (`ServerThread`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import random
from types import TracebackType
from typing import Self

from aiovec.gameserver.game import ChaseGame
from aiovec.gameserver.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    LOOPBACK,
    Framer,
    ProtocolError,
    error_frame,
)
from aiovec.gameserver.session import Session
from aiovec.gameserver.thread import ServerThread

__all__ = ("GameServer", "ServerStats")


@dataclasses.dataclass
class ServerStats:
    """Counters of a `GameServer` (updated on the server's loop).

    Attributes:
        connections: Connections admitted (refused ones not included).
        refused: Connections closed at once while ``pause_accepting(refuse=True)``.
        resets: ``reset`` requests answered.
        steps: ``step`` requests answered.
        errors: ``error`` replies sent (each closed its connection).
        wakeups: Times the reply timer woke the server's loop.  Replies that
            fall due together are sent in one wakeup, so under load this is
            far below ``resets + steps``.
    """

    connections: int = 0
    refused: int = 0
    resets: int = 0
    steps: int = 0
    errors: int = 0
    wakeups: int = 0


class GameServer:
    """Host one `ChaseGame` session per TCP connection, on 127.0.0.1 only.

    Each connection is an ``asyncio.Protocol``: requests are parsed as bytes
    arrive, and every delayed reply waits in one heap shared by all
    connections, under one loop timer set for the earliest (one timer per
    request would cost a timer handle and a wakeup each).  A connection's
    replies leave in the order of its requests.

    Args:
        port: Port to listen on; ``0`` picks a free one (read ``.port`` after start).
        size: Grid side of every session's game.
        max_steps: Steps before truncation in every session's game.
        latency: Seconds each ``reset``/``step`` reply waits before it is sent.
        jitter: Up to this many extra seconds per reply, uniformly at random.
        jitter_seed: Seed of the jitter generator.
        max_message_bytes: Longest request payload accepted; longer ones are
            refused from their length prefix, before the body is read.

    Example:
        >>> async with GameServer(latency=0.001) as server:  # doctest: +SKIP
        ...     env = GameClientEnv(port=server.port)
    """

    def __init__(
        self,
        *,
        port: int = 0,
        size: int = 8,
        max_steps: int = 200,
        latency: float = 0.0,
        jitter: float = 0.0,
        jitter_seed: int | None = 0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        ChaseGame(size, max_steps)  # validates the game's parameters
        if latency < 0 or jitter < 0 or max_message_bytes < 1:
            raise ValueError(
                f"need latency >= 0, jitter >= 0, max_message_bytes >= 1, got "
                f"{latency=}, {jitter=}, {max_message_bytes=}"
            )
        self.size, self.max_steps = size, max_steps
        self.latency, self.jitter = latency, jitter
        self.max_message_bytes = max_message_bytes
        self.stats = ServerStats()
        self._requested_port = port
        self._port: int | None = None
        self._jitter = random.Random(jitter_seed)
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[_Connection] = set()
        self._held: list[_Connection] = []  # connected while pause_accepting() held them
        self._holding = False
        self._refusing = False
        self._replies = _ReplyTimer(self.stats)

    @property
    def port(self) -> int:
        """The port listened on (known once started)."""
        if self._port is None:
            raise RuntimeError("GameServer is not started: use `async with GameServer()`")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the server."""
        return LOOPBACK, self.port

    @property
    def active_connections(self) -> int:
        """Connections open right now (held ones included)."""
        return len(self._connections)

    async def start(self) -> None:
        """Start listening (``async with`` does this for you)."""
        if self._server is not None:
            raise RuntimeError("GameServer is already started")
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Connection(self), LOOPBACK, self._requested_port
        )
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, drop every connection and wait until each is closed (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        self._replies.clear()
        while self._connections:
            closed = [c.closed for c in self._connections]
            for connection in self._connections:
                connection.transport.abort()
            await asyncio.wait(closed)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def start_in_thread(self) -> ServerThread:
        """Run this server on a new thread with its own event loop (for sync code).

        Returns:
            The started `ServerThread`; call its ``stop()`` (or use it in
            a ``with`` block) to stop the server and join the thread.
        """
        thread = ServerThread(self)
        thread.start()
        return thread

    def drop_all(self) -> int:
        """Abort every open connection at once, as a crashing server would.

        Returns:
            How many connections were dropped.
        """
        open_ = [c for c in self._connections if not c.transport.is_closing()]
        for connection in open_:
            connection.transport.abort()
        return len(open_)

    def pause_accepting(self, *, refuse: bool = False) -> None:
        """Stop admitting new connections until `resume_accepting`.

        Args:
            refuse: ``False`` holds new connections unanswered (clients time
                out, as with a stalled accept loop); ``True`` closes them at
                once (clients fail immediately with a ``ConnectionError``).
        """
        self._refusing = refuse
        self._holding = not refuse

    def resume_accepting(self) -> None:
        """Admit connections again, held ones included."""
        self._refusing = self._holding = False
        held, self._held = self._held, []
        for connection in held:
            if not connection.transport.is_closing():
                self._admit(connection)

    def _connected(self, connection: _Connection) -> bool:
        """A new connection: admitted, held or refused; ``False`` if it was refused."""
        if self._refusing or self._server is None:
            self.stats.refused += 1
            connection.transport.abort()
            return False
        self._connections.add(connection)
        if self._holding:
            connection.transport.pause_reading()
            self._held.append(connection)
        else:
            self._admit(connection)
        return True

    def _admit(self, connection: _Connection) -> None:
        self.stats.connections += 1
        connection.admitted = True
        connection.resume_reading()

    def _delay(self) -> float:
        return self.latency + (self._jitter.uniform(0, self.jitter) if self.jitter else 0.0)


class _Connection(asyncio.Protocol):
    """One client's session on a `GameServer`: frames in, replies out (in order)."""

    transport: asyncio.Transport

    def __init__(self, server: GameServer) -> None:
        self.server = server
        self.session = Session(server.size, server.max_steps)
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.admitted = False
        self.last_due = 0.0  # loop time at which this connection's last queued reply leaves
        self._frames = Framer(server.max_message_bytes)
        self._writing_paused = False
        self._done = False  # an error reply is on its way: read nothing more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport
        if not self.server._connected(self):
            self.closed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:  # the client does not read: stop reading it too
        self._writing_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.resume_reading()

    def resume_reading(self) -> None:
        if self.admitted and not self._writing_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        session = self.session
        try:
            for payload in self._frames.feed(data):
                kind, reply = session.handle(payload)
                self._send(kind, reply)
        except ProtocolError as exc:
            self.server.stats.errors += 1
            self._done = True
            self._send("error", error_frame(str(exc)))

    def _send(self, kind: str, reply: bytes) -> None:
        """Send ``reply`` after the server's latency, after this connection's earlier replies."""
        delay = 0.0 if kind in ("hello", "error") else self.server._delay()
        now = self._loop.time()
        due = max(now + delay, self.last_due)
        self.last_due = due
        if due <= now:
            self.write(kind, reply)
        else:
            self.server._replies.add(self._loop, due, self, kind, reply)

    def write(self, kind: str, data: bytes) -> None:
        """Write a reply now (dropped if the connection is gone); an error closes it."""
        if self.transport.is_closing():
            return
        stats = self.server.stats  # counted first: the client may read them once it has the reply
        if kind == "step":
            stats.steps += 1
        elif kind == "reset":
            stats.resets += 1
        self.transport.write(data)
        if kind == "error":
            self.transport.close()  # after the reply has been flushed


class _ReplyTimer:
    """Replies waiting for their time, for every connection, under one loop timer."""

    def __init__(self, stats: ServerStats) -> None:
        self._stats = stats
        self._heap: list[tuple[float, int, _Connection, str, bytes]] = []
        self._order = itertools.count()  # keeps equal times in the order they came
        self._timer: asyncio.TimerHandle | None = None

    def add(
        self, loop: asyncio.AbstractEventLoop, due: float, to: _Connection, kind: str, data: bytes
    ) -> None:
        heapq.heappush(self._heap, (due, next(self._order), to, kind, data))
        timer = self._timer
        if timer is None or due < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._fire, loop)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stats.wakeups += 1
        self._timer = None
        heap, now = self._heap, loop.time()
        while heap and heap[0][0] <= now:
            _, _, to, kind, data = heapq.heappop(heap)
            to.write(kind, data)
        if heap:
            self._timer = loop.call_at(heap[0][0], self._fire, loop)
