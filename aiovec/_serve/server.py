"""The ``aiovec serve`` server: connections in, session groups on aiovec's own backends.

An aiohttp application takes WebSocket connections (the token checked before
the upgrade).  One reader task per connection decodes each frame (a frame that
does not decode closes that connection only), hands its messages to the
`Connection`, and writes what they caused as one frame before reading on.
The groups of sessions (`aiovec._serve.group`) belong to the server, not to a
connection: one that ends leaves its groups waiting for a resume.

Liveness is the kernel's: accepted sockets keep TCP keep-alive probes going
every ``heartbeat`` seconds, so a peer that vanished is noticed (three probes
unanswered) while a client that merely sits idle between calls (a blocking
script training its policy) keeps its connection and its sessions.  A client's
``ping`` messages are answered, and are how the client watches the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import os
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from aiovec._core import validate
from aiovec._log import logger
from aiovec._serve.connection import Connection
from aiovec._serve.group import Group
from aiovec._serve.protocol import PROTOCOL, ClientMessage, GoneMsg, HelloMsg, WelcomeMsg
from aiovec._serve.protocol import decode_client as decode
from aiovec.backends import Backend, load_backend

__all__ = ("SERVER_BACKENDS", "TOKEN_ENV", "Server")

SERVER_BACKENDS = ("inline", "thread", "process")
TOKEN_ENV = "AIOVEC_SERVE_TOKEN"
"""The environment variable a token is read from when none is given."""

MAX_FRAME = 64 * 1024 * 1024
MAX_SESSIONS = 65536
WINDOW = 4096
HEARTBEAT = 5.0
RESUME_WINDOW = 60.0
_GONE_KEPT = 4096  # tokens of closed groups remembered, to say why a resume fails


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server:
    """An ``aiovec serve`` server on the running loop: `start`, then `aclose`.

    Args and options: as `aiovec.serve`'s.

    Raises:
        TypeError: ``factory`` is not callable, or an option is of the wrong type.
        ValueError: ``host`` is not a loopback address and there is no token, or
            ``backend`` is not one of `SERVER_BACKENDS`.
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backend: str = "inline",
        token: str | None = None,
        num_workers: int | None = None,
        resume_window: float = RESUME_WINDOW,
        heartbeat: float = HEARTBEAT,
        max_sessions: int = MAX_SESSIONS,
        max_frame: int = MAX_FRAME,
        window: int = WINDOW,
    ) -> None:
        if not callable(factory):
            raise TypeError(
                f"factory must be a callable that builds an env, got {validate.describe(factory)}"
            )
        validate.check_choice("backend", backend, SERVER_BACKENDS)
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if not _is_local(host) and not token:
            raise ValueError(
                f"refusing to serve on {host}, which is not a loopback address, without a token: "
                f"anyone who can reach it could run envs. Give --token TOKEN (or set {TOKEN_ENV}); "
                "clients then pass token=TOKEN"
            )
        for name, value in (("resume_window", resume_window), ("heartbeat", heartbeat)):
            if validate.check_timeout(name, value) is None:
                raise TypeError(f"{name} must be a number of seconds, got None")
        self.factory = factory
        self.host, self.port = host, port
        self.backend = backend
        self.token = token
        self.num_workers = num_workers
        self.resume_window = float(resume_window)
        self.heartbeat = float(heartbeat)
        self.max_sessions = max_sessions
        self.max_frame = max_frame
        self.window = window
        self.groups: dict[str, Group] = {}  # by token
        self.gone: dict[str, str] = {}  # tokens of groups closed, and why
        self.connections: set[Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- tasks, backends, groups -----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task of the server's, cancelled when it stops."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("aiovec serve: a task failed", exc_info=task.exception())

    async def open_backend(self, fns: Sequence[Callable[[], Any]]) -> Backend:
        """The backend hosting a new group's envs (each env object once, as a vector env's)."""
        backend = await load_backend(self.backend).open(fns, self.num_workers, None, None)
        envs = backend.envs
        if envs is not None:
            try:
                validate.check_distinct_envs(envs)
            except ValueError:
                await backend.aclose()
                raise
        return backend

    def log_open(self, group: Group, peer: str) -> None:
        """Say that a group was opened (INFO)."""
        logger.info(
            "aiovec serve: opened group %s: %d sessions for %s", group.gid, group.count, peer
        )

    async def close_group(self, group: Group, reason: str) -> dict[int, BaseException]:
        """Close a group's sessions and forget it; a resume is told ``reason``."""
        if group.closed:
            return {}
        group.closed = True
        if group.expiry is not None:
            group.expiry.cancel()
        self.groups.pop(group.token, None)
        self.gone[group.token] = f"the server closed these sessions: {reason}"
        if len(self.gone) > _GONE_KEPT:
            self.gone.pop(next(iter(self.gone)))
        if group.conn is not None:
            group.conn.groups.pop(group.gid, None)
            group.conn.sessions -= group.count
            if reason != "closed by the client":
                group.conn.send(GoneMsg(group.gid, self.gone[group.token]))
        pump = group.pump
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        try:
            errors = await group.backend.aclose()
        except Exception as exc:
            errors = dict.fromkeys(range(group.count), exc)
        logger.info(
            "aiovec serve: closed group %s (%d sessions): %s", group.gid, group.count, reason
        )
        return errors

    # -- listening -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (on the running loop); ``url`` is then the server's ``ws://HOST:PORT``."""
        app = web.Application()
        app.router.add_get("/", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"ws://{host}:{port}"

    async def aclose(self) -> None:
        """Close every group and connection, then stop listening."""
        for group in list(self.groups.values()):
            await self.close_group(group, "the server is shutting down")
        for conn in list(self.connections):
            conn.flush()
            await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- connections -----------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> str:
        """``""`` if the request holds the right token (or none is needed), else why not."""
        if not self.token:
            return ""
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not value:
            return "this server needs a token (aiovec.make(url, ..., token=TOKEN))"
        if not hmac.compare_digest(value.encode(), self.token.encode()):
            return "wrong token"
        return ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        refusal = self._authorized(request)
        if refusal:
            logger.warning("aiovec serve: refused %s: %s", request.remote, refusal)
            return web.Response(status=401, text=refusal)
        # timeout: how long a close waits for the client's close frame (a bad client sends none)
        ws = web.WebSocketResponse(
            max_msg_size=self.max_frame, autoping=True, timeout=1.0, compress=False
        )
        await ws.prepare(request)
        transport = request.transport
        _keep_alive(transport, self.heartbeat)
        conn = Connection(self, ws, str(request.remote), transport)
        self.connections.add(conn)
        try:
            await self._serve(conn, ws)
        finally:
            self.connections.discard(conn)
            conn.detach()
            if not ws.closed:
                await ws.close()
        return ws

    async def _serve(self, conn: Connection, ws: web.WebSocketResponse) -> None:
        hello = True
        while True:
            msg = await ws.receive()
            if msg.type in {WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED}:
                return
            if msg.type is WSMsgType.ERROR:
                logger.warning("aiovec serve: closed %s: %s", conn.peer, ws.exception())
                return
            conn.reading = True
            try:
                if msg.type is not WSMsgType.BINARY:
                    raise ValueError("frames are binary")
                messages = decode(msg.data)
                if hello:
                    self._hello(conn, messages)
                    hello = False
                    messages = messages[1:]
                for message in messages:
                    conn.handle(message)
            except ValueError as exc:
                logger.warning("aiovec serve: closed %s: %s", conn.peer, exc)
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=str(exc)[:120].encode())
                return
            finally:
                conn.reading = False
            conn.flush()

    def _hello(self, conn: Connection, messages: list[ClientMessage]) -> None:
        if not messages or not isinstance(messages[0], HelloMsg):
            raise ValueError("the first message must be a hello")
        hello = messages[0]
        if hello.version != PROTOCOL:
            raise ValueError(f"protocol {hello.version} (this server speaks {PROTOCOL})")
        resumed = {gid: conn.resume(gid, token) for gid, token in hello.resume}
        conn.send(
            WelcomeMsg(
                PROTOCOL,
                self.window,
                self.max_frame,
                self.max_sessions,
                self.heartbeat,
                self.resume_window,
                resumed,
            )
        )


def _keep_alive(transport: Any, every: float) -> None:
    """Have the kernel probe an idle peer every ``every`` s, and give up after three misses."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family not in {socket.AF_INET, socket.AF_INET6}:
        return
    seconds = max(1, round(every))
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", seconds),
            ("TCP_KEEPINTVL", seconds),
            ("TCP_KEEPCNT", 3),
        ):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
