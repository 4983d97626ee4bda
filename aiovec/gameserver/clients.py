"""The client envs: `GameClientEnv` (async) and `BlockingGameClientEnv` (a gymnasium env).

Both build requests and read replies with the protocol's functions; only the
moving of bytes differs.  `GameClientEnv`'s connection is an
``asyncio.Protocol``: frames are cut as bytes arrive and the one reply awaited
resolves a future, with no stream reader or task in between.
`BlockingGameClientEnv` uses a blocking socket, one ``recv`` per reply most
often.  Every side sets ``TCP_NODELAY`` (asyncio does on its own), so that a
small frame is never held back by Nagle's algorithm.  Both connect on the
first ``reset``.  Any failure in a round trip (an error, a timeout, a
cancellation) drops the connection, because the stream may be out of step;
the next ``reset`` reconnects.  Bytes beyond the reply to the one request in
flight are a `ProtocolError`.  Clients refuse any host that is not a loopback
IP literal.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from typing import Any, Final, SupportsIndex, TypeVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded

from aiovec._env import AsyncEnv
from aiovec.gameserver.game import Obs, StepResult, game_spaces
from aiovec.gameserver.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    LOOPBACK,
    Framer,
    ProtocolError,
    closed_error,
    hello_request,
    hello_result,
    reset_request,
    reset_result,
    step_request,
    step_result,
)

__all__ = ("BlockingGameClientEnv", "GameClientEnv")

T = TypeVar("T")
_RECV_BYTES: Final = 4096  # the blocking client reads at most this much at once


def _connect_timeout(host: str, port: int, timeout: float) -> TimeoutError:
    return TimeoutError(
        f"game server at {host}:{port} did not answer within connect_timeout={timeout} s"
    )


def _loopback_address(host: str, port: int | None, owner: str) -> tuple[str, int]:
    """``(host, port)`` once checked: a loopback IP literal and a valid port."""
    if port is None:
        raise TypeError(f"{owner} needs the game server's port, e.g. {owner}(port=server.port)")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{owner} only connects to loopback IP addresses, got host={host!r}")
    if not 0 < port < 2**16:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return host, port


class _Client:
    """What both clients share: their arguments (a loopback address, limits) and spaces."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (as gymnasium.Env)
    observation_space: spaces.Space[Obs]
    action_space: spaces.Space[np.int64]

    def __init__(
        self,
        host: str = LOOPBACK,
        port: int | None = None,
        *,
        connect_timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self.host, self.port = _loopback_address(host, port, type(self).__name__)
        self._where = f"{host}:{port}"  # for messages
        self.connect_timeout = connect_timeout
        self.max_message_bytes = max_message_bytes
        self.observation_space, self.action_space = game_spaces()
        self.game: dict[str, Any] | None = None  # the server's game parameters, once greeted


class GameClientEnv(_Client, AsyncEnv[Obs, np.int64]):
    """An `aiovec.AsyncEnv` that plays `ChaseGame` on a `GameServer`.

    The spaces are known at construction, so a vector env can be built before
    any connection.  The first ``reset`` connects and greets the server; then
    each ``reset``/``step`` is one round trip.  A failed round trip closes the
    connection (a later ``reset`` reconnects).

    Args:
        host: The server's loopback IP address.
        port: The server's port (required).
        connect_timeout: Seconds allowed to connect and greet the server.
        max_message_bytes: Longest reply payload accepted.

    Raises:
        ProtocolError: (from ``reset``/``step``) the server broke the protocol
            or replied with an error.
        ConnectionError: (from ``reset``/``step``) the connection failed or closed.
        TimeoutError: (from the first ``reset``) no handshake within ``connect_timeout``.
    """

    _connection: _ClientConnection | None = None

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Start an episode on the server, connecting first if needed."""
        await super().reset(seed=seed)
        request = reset_request(seed, options)
        if self._connection is None:
            await self._connect()
        return await self._round_trip(request, reset_result)

    async def step(self, action: SupportsIndex) -> StepResult:
        """Play one move on the server."""
        request = step_request(action)
        connection = self._connection
        if connection is None:
            raise ResetNeeded("GameClientEnv is not connected: call reset() first")
        try:  # _round_trip, inlined on this hot path (one coroutine less per step)
            return step_result(await connection.request(request), self._where)
        except BaseException:
            self._drop()
            raise

    async def close(self) -> None:
        """Close the connection, if any, and wait until it is closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.transport.close()
            await connection.closed

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, self._connection = await loop.create_connection(
                    lambda: _ClientConnection(self.max_message_bytes, self._where),
                    self.host,
                    self.port,
                )
                self.game = await self._round_trip(hello_request(), hello_result)
        except TimeoutError:
            self._drop()
            raise _connect_timeout(self.host, self.port, self.connect_timeout) from None
        except BaseException:
            self._drop()  # e.g. a server of another version: never left half-connected
            raise

    async def _round_trip(self, request: bytes, read: Callable[[bytes, str], T]) -> T:
        """Send ``request`` and ``read`` its reply's payload (``read(payload, where)``)."""
        connection = self._connection
        if connection is None:
            raise ConnectionResetError(f"connection to {self._where} was dropped")
        try:
            return read(await connection.request(request), self._where)
        except BaseException:
            self._drop()  # out of step with the server (or gone): never reuse it
            raise

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.transport.abort()


class _ClientConnection(asyncio.Protocol):
    """A `GameClientEnv`'s connection: frames cut as bytes arrive, one reply awaited at a time.

    `request` writes a frame and returns a future for the next frame's payload.
    No write waits for the buffer to drain: only one request is ever in flight,
    and its reply cannot come before the request was delivered.  Bytes that
    arrive with no request in flight, or after the reply to it, are a protocol
    error; once failed, the connection fails every later request.

    Args:
        max_bytes: Longest reply payload accepted.
        where: ``host:port``, for messages.
    """

    transport: asyncio.Transport

    def __init__(self, max_bytes: int, where: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._where = where
        self._frames = Framer(max_bytes)
        self._waiter: asyncio.Future[bytes] | None = None
        self._failure: Exception | None = None

    def request(self, frame: bytes) -> asyncio.Future[bytes]:
        """Send ``frame``; the future gets the reply's payload (or the connection's failure)."""
        if self._failure is not None:
            raise self._failure
        waiter = self._loop.create_future()
        self._waiter = waiter
        self.transport.write(frame)
        return waiter

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        if self._failure is not None:
            return
        try:
            payloads = self._frames.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        waiter = self._waiter
        if not payloads:  # the reply is not complete yet
            if waiter is None:
                self._fail(_unexpected_data(self._where))
            return
        self._waiter = None
        if waiter is None or len(payloads) > 1 or self._frames.pending:
            self._fail(_unexpected_data(self._where))  # fails the next request, not this reply
        if waiter is not None and not waiter.done():
            waiter.set_result(payloads[0])

    def eof_received(self) -> bool:
        self._fail(closed_error(self._frames, self._where))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._failure is None:
            error = ConnectionResetError(f"connection to game server at {self._where} was lost")
            error.__cause__ = exc
            self._fail(error)
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, exc: Exception) -> None:
        """Fail the request in flight, if any, and every later one."""
        if self._failure is None:
            self._failure = exc
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class BlockingGameClientEnv(_Client, gymnasium.Env[Obs, np.int64]):
    """`GameClientEnv` over a blocking socket: a plain ``gymnasium.Env``.

    Same protocol and results; for thread pools and ``gymnasium`` vector envs.

    Args:
        host: The server's loopback IP address.
        port: The server's port (required).
        connect_timeout: Seconds allowed for each blocking operation of the
            connection and handshake.
        max_message_bytes: Longest reply payload accepted.
    """

    _sock: socket.socket | None = None
    _frames: Framer  # made on connecting

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Start an episode on the server, connecting first if needed."""
        super().reset(seed=seed)
        request = reset_request(seed, options)
        if self._sock is None:
            self._connect()
        return self._round_trip(request, reset_result)

    def step(self, action: SupportsIndex) -> StepResult:
        """Play one move on the server."""
        request = step_request(action)
        if self._sock is None:
            raise ResetNeeded("BlockingGameClientEnv is not connected: call reset() first")
        return self._round_trip(request, step_result)

    def close(self) -> None:
        """Close the connection, if any."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _connect(self) -> None:
        self._frames = Framer(self.max_message_bytes)
        try:
            self._sock = socket.create_connection((self.host, self.port), self.connect_timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.game = self._round_trip(hello_request(), hello_result)
            self._sock.settimeout(None)
        except TimeoutError:
            self.close()
            raise _connect_timeout(self.host, self.port, self.connect_timeout) from None
        except BaseException:
            self.close()
            raise

    def _round_trip(self, request: bytes, read: Callable[[bytes, str], T]) -> T:
        """Send ``request`` and ``read`` its reply's payload (``read(payload, where)``)."""
        sock = self._sock
        if sock is None:
            raise ConnectionResetError(f"connection to {self._where} was dropped")
        try:
            sock.sendall(request)
            return read(self._receive(sock), self._where)
        except BaseException:
            self.close()  # out of step with the server (or gone): never reuse it
            raise

    def _receive(self, sock: socket.socket) -> bytes:
        """The reply's payload; bytes that came with it beyond it are a protocol error."""
        frames = self._frames
        payloads: list[bytes] = []
        while not payloads:
            data = sock.recv(_RECV_BYTES)
            if not data:
                raise closed_error(frames, self._where)
            payloads = frames.feed(data)
        if len(payloads) > 1 or frames.pending:
            raise _unexpected_data(self._where)
        return payloads[0]


def _unexpected_data(where: str) -> ProtocolError:
    """The error for bytes a client got beyond the one reply it waited for."""
    return ProtocolError(f"game server at {where} sent data with no request in flight")
