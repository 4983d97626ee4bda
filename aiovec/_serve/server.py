"""The ``aiovec serve`` server: session groups on aiovec's own backends, behind one WebSocket.

Theory of operation.  An aiohttp application takes WebSocket connections (a
token checked before the upgrade).  Each connection (`Connection`) reads
frames, each a list of messages (`aiovec._serve.protocol`); a frame that does
not decode closes that connection only.  A client vector env opens a *group*
of sessions (`Group`): its envs are built by the factory on one of aiovec's
own backends (``inline``, ``thread``, ``process``), so the server steps them
as a vector env of its own would, each env's ``step_flow`` (autoreset) run
here: ``SAME_STEP`` costs no second round trip.

- **Requests in order.**  A group runs its requests in the order they came; one
  that names an env still busy (a cancelled call not yet unwound) waits for it.
  Launched, a request's envs are owned by it (``owner``); each outcome the
  backend reports goes to its owner.  A whole step is answered once every env
  has an outcome (one `StepPart`); a streamed one (``send()``) as envs finish.
- **Answered once, whatever happens.**  Every answer is kept (`Request.parts`)
  until the client names all of the request's envs in later requests (it has
  the answer then).  A request id the group has seen is never run again: it
  gets what was answered so far, and the rest when it comes.  So a client that
  lost its connection sends its requests in flight again on the next one, and
  no step is lost or run twice.
- **Resume.**  A connection that ends leaves its groups *detached* for
  ``resume_window`` seconds: their envs go on with what they were doing, and a
  new connection's `Hello` takes them back by token.  After the window the
  group is closed and forgotten (a later resume is told why).
- **Deadlines.**  A request may carry the seconds it may take; envs still out
  then are cancelled and answered with ``TimeoutError``.
- **Backpressure.**  A connection may have ``window`` requests in the works;
  one more is answered `Busy` (not taken; the client sends it again later).
- **Coalescing.**  Everything a connection sends in one loop turn goes out as
  one frame (its writer task sends what was queued when it wakes).
- **Heartbeats** are `Ping` messages; a connection silent for three
  heartbeats is closed (its groups detached).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import WSCloseCode, WSMsgType, web

from aiovec._core import validate
from aiovec._core.calls import (
    CallMethod,
    EnvCall,
    GetAttr,
    IsWrapped,
    Render,
    Reset,
    SetAttr,
)
from aiovec._core.ops import CallOp, StepOp
from aiovec._log import logger
from aiovec._serve import codec
from aiovec._serve.protocol import (
    PROTOCOL,
    BusyMsg,
    CallMsg,
    CallReplyMsg,
    CancelMsg,
    ClientMessage,
    CloseMsg,
    FailedMsg,
    GoneMsg,
    HelloMsg,
    Layouts,
    OpenedMsg,
    OpenMsg,
    PingMsg,
    PongMsg,
    RebuildMsg,
    StepMsg,
    WelcomeMsg,
    decode_client,
    encode,
    envs_of,
)
from aiovec._serve.steps import ResultPacker, actions_of, mode_of, resets_of
from aiovec._serve.steps import validate_options as check_options
from aiovec._serve.steps import validate_seed as check_seed
from aiovec.backends import Backend, load_backend

__all__ = ("SERVER_BACKENDS", "TOKEN_ENV", "Server", "Serving")

SERVER_BACKENDS = ("inline", "thread", "process")
TOKEN_ENV = "AIOVEC_SERVE_TOKEN"
"""The environment variable a token is read from when none is given."""

MAX_FRAME = 64 * 1024 * 1024
MAX_SESSIONS = 65536
WINDOW = 4096
HEARTBEAT = 5.0
RESUME_WINDOW = 60.0


def _is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(eq=False)
class GroupRequest:
    """A request of a group: its envs, what is left of it, what was answered."""

    rid: int
    envs: list[int]
    kind: str  # "step", "call", "rebuild", "close"
    message: Any
    stream: bool = False
    deadline: float | None = None  # on the server's clock (time.monotonic)
    left: set[int] = field(default_factory=set)
    started: bool = False
    done: bool = False
    parts: list[Any] = field(default_factory=list)
    late: set[int] = field(default_factory=set)  # cancelled at the deadline
    unacked: int = 0  # envs not yet named by a later request
    values: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, Any] = field(default_factory=dict)


class Group:
    """The sessions of one client vector env, on a backend of the server's."""

    def __init__(self, server: Server, gid: int, backend: Backend, conn: Connection) -> None:
        self.server = server
        self.gid = gid
        self.token = secrets.token_urlsafe(24)
        self.backend = backend
        self.count = backend.num_envs
        traits = backend.traits
        self.action_layouts = Layouts(traits.action_spaces[0])
        self.packer = ResultPacker(traits.observation_spaces[0])
        self.conn: Connection | None = conn
        self.seen = 0
        self.requests: dict[int, GroupRequest] = {}
        self.queue: deque[GroupRequest] = deque()
        self.owner: list[GroupRequest | None] = [None] * self.count
        self.last: list[GroupRequest | None] = [None] * self.count
        self.busy = False  # an async request (rebuild, close) is running
        self.pump: asyncio.Task[None] | None = None
        self.expiry: asyncio.TimerHandle | None = None
        self.closed = False

    # -- requests in -------------------------------------------------------------------

    def take(self, request: GroupRequest) -> None:
        """A new request: remember it, let the answers it supersedes go, run it when it can."""
        self.seen = request.rid
        self.requests[request.rid] = request
        request.unacked = len(request.envs)
        for i in request.envs:
            before = self.last[i]
            self.last[i] = request
            if before is not None:
                before.unacked -= 1
                self._forget_if_acked(before)
        self.queue.append(request)
        self.run_queue()

    def _forget_if_acked(self, request: GroupRequest) -> None:
        if request.done and request.unacked <= 0:
            self.requests.pop(request.rid, None)

    def again(self, rid: int, conn: Connection) -> None:
        """Request ``rid`` came again (after a reconnect): what was answered, the rest later."""
        request = self.requests.get(rid)
        if request is None:
            conn.send(
                FailedMsg(
                    rid,
                    self.gid,
                    codec.error_to_data(
                        RuntimeError(f"request {rid} was answered and acknowledged already")
                    ),
                )
            )
            return
        for part in request.parts:
            conn.send(part)

    def run_queue(self) -> None:
        """Start the requests at the head of the queue whose envs are free."""
        backend = self.backend
        while self.queue and not self.busy and not self.closed:
            request = self.queue[0]
            if not backend.pending.isdisjoint(request.envs):
                return  # an env is still busy with a cancelled call: wait for it
            self.queue.popleft()
            request.started = True
            if request.kind in {"rebuild", "close"}:
                self.busy = True
                self.server.spawn(self._run_async(request))
                return
            self._launch(request)

    def _launch(self, request: GroupRequest) -> None:
        try:
            op = self._op(request)
        except (ValueError, TypeError) as exc:
            self._refuse(request, exc)
            return
        request.left = set(request.envs)
        for i in request.envs:
            self.owner[i] = request
        try:
            self.backend.launch(request.envs, op)
        except BaseException as exc:  # an env raised SystemExit or KeyboardInterrupt
            for i in request.envs:
                if i not in self.backend.pending:
                    self.backend._errors.setdefault(i, exc)
            if not isinstance(exc, Exception):
                logger.warning("an env of group %s raised %r; reported as its error", self.gid, exc)
        self.deliver(*self.backend.take())
        if self.backend.pending and self.pump is None:
            self.pump = self.server.spawn(self._collect())

    def _op(self, request: GroupRequest) -> StepOp | CallOp:
        message = request.message
        count = len(request.envs)
        if request.kind == "step":
            actions, batch = actions_of(message, count, self.action_layouts)
            resets = resets_of(message, count)
            return StepOp(
                mode_of(message.mode),
                actions,
                resets,
                "step",
                batch=batch if not message.autoresets else None,
                stream=message.stream,
                timed=message.timed,
            )
        if len(message.calls) != count:
            raise ValueError(f"calls: expected {count}, got {len(message.calls)}")
        return CallOp([call_of(c) for c in message.calls], message.name)

    def _refuse(self, request: GroupRequest, error: Exception) -> None:
        request.done = True
        failed = FailedMsg(request.rid, self.gid, codec.error_to_data(error))
        request.parts.append(failed)
        self.send(failed)
        self._forget_if_acked(request)
        self.run_queue()

    async def _run_async(self, request: GroupRequest) -> None:
        backend = self.backend
        try:
            if request.kind == "rebuild":
                errors = await backend.rebuild(request.envs)
            else:
                errors = await self.server.close_group(self, "closed by the client")
            reply = CallReplyMsg(
                request.rid, self.gid, {}, {i: codec.error_to_data(e) for i, e in errors.items()}
            )
        except Exception as exc:
            reply = CallReplyMsg(
                request.rid, self.gid, {}, {i: codec.error_to_data(exc) for i in request.envs}
            )
        request.done = True
        request.parts.append(reply)
        self.send(reply)
        self._forget_if_acked(request)
        self.busy = False
        self.run_queue()

    def cancel(self, rid: int, envs: Iterable[int]) -> None:
        """The client gave up on ``envs`` of request ``rid``."""
        request = self.requests.get(rid)
        if request is None or request.done or not request.started:
            return
        out = self.backend.pending.intersection(envs)
        if out:
            self.backend.cancel(out)
            self.deliver(*self.backend.take())

    # -- outcomes out ------------------------------------------------------------------

    async def _collect(self) -> None:
        backend = self.backend
        try:
            while backend.pending and not self.closed:
                wait = self._next_deadline()
                outcomes = await backend.collect(1, wait)
                self.deliver(*outcomes)
                self._expire_late()
        finally:
            self.pump = None
        if not self.closed:
            self.run_queue()

    def _next_deadline(self) -> float | None:
        now = time.monotonic()
        deadlines = [
            r.deadline for r in {self.owner[i] for i in self.backend.pending} if r and r.deadline
        ]
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _expire_late(self) -> None:
        now = time.monotonic()
        late: list[int] = []
        for i in list(self.backend.pending):
            request = self.owner[i]
            if request is not None and request.deadline is not None and request.deadline <= now:
                request.late.add(i)
                late.append(i)
        if late:
            self.backend.cancel(late)
            self.deliver(*self.backend.take())

    def deliver(self, results: Any, errors: dict[int, BaseException]) -> None:
        """Hand each env's outcome to its request; answer the requests that are due."""
        touched: dict[int, GroupRequest] = {}
        for i in results:
            request = self.owner[i]
            if request is not None and i in request.left:
                request.values[i] = results[i]
                request.left.discard(i)
                touched[request.rid] = request
        for i, error in errors.items():
            request = self.owner[i]
            if request is not None and i in request.left:
                late = i in request.late and isinstance(error, asyncio.CancelledError)
                request.errors[i] = (
                    TimeoutError(f"env {i} did not answer within the request's deadline")
                    if late
                    else error
                )
                request.left.discard(i)
                touched[request.rid] = request
        for request in touched.values():
            if request.stream or not request.left:
                self._answer(request)
        if any(request.done for request in touched.values()):
            self.run_queue()

    def _answer(self, request: GroupRequest) -> None:
        done = not request.left
        values, errors = request.values, request.errors
        request.values, request.errors = {}, {}
        if request.kind == "step":
            message: Any = self.packer.pack(request.rid, self.gid, done, values, errors)
        else:
            message = self._call_reply(request, values, errors)
        request.parts.append(message)
        if done:
            request.done = True
            for i in request.envs:
                if self.owner[i] is request:
                    self.owner[i] = None
            self._forget_if_acked(request)
        self.send(message)

    def _call_reply(
        self, request: GroupRequest, values: dict[int, Any], errors: dict[int, Any]
    ) -> CallReplyMsg:
        packed: dict[int, Any] = {}
        error_data = {i: codec.error_to_data(e) for i, e in errors.items()}
        for i, value in values.items():
            try:
                packed[i] = codec.pack(value)
            except TypeError as exc:
                error_data[i] = codec.error_to_data(exc)
        return CallReplyMsg(request.rid, self.gid, packed, error_data)

    def send(self, message: Any) -> None:
        """Send ``message`` on the group's connection, if it has one (else it waits in parts)."""
        conn = self.conn
        if conn is not None:
            conn.send(message)

    # -- attach, detach ----------------------------------------------------------------

    def detach(self) -> None:
        """The connection ended: keep the sessions for the resume window."""
        self.conn = None
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self.expiry = loop.call_later(self.server.resume_window, self._expire)
        logger.info(
            "aiovec serve: group %s (%d sessions) detached; kept %g s for a resume",
            self.gid,
            self.count,
            self.server.resume_window,
        )

    def attach(self, conn: Connection) -> None:
        """A new connection resumed the group."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        self.conn = conn
        logger.info("aiovec serve: group %s (%d sessions) resumed", self.gid, self.count)

    def _expire(self) -> None:
        self.expiry = None
        reason = f"not resumed within {self.server.resume_window:g} s"
        self.server.spawn(self.server.close_group(self, reason))


def call_of(data: Any) -> EnvCall:
    """A call (other than a step) from the wire: ``[kind, ...]``.

    ``["reset", seed, options]``, ``["render"]``, ``["get_attr", name]``,
    ``["set_attr", name, value]``, ``["call", name, args, kwargs]``,
    ``["is_wrapped", "module:qualname"]``.  Attribute names may not start with
    ``_``; a wrapper class is one this process has imported, a gymnasium wrapper.

    Raises:
        ValueError: A malformed or refused call.
    """
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ValueError(f"a malformed call: {data!r}")
    kind, args = data[0], data[1:]
    if kind == "reset" and len(args) == 2:
        return Reset(check_seed(args[0]), check_options(args[1]))
    if kind == "render" and not args:
        return Render()
    if kind == "get_attr" and len(args) == 1:
        return GetAttr(_name(args[0]))
    if kind == "set_attr" and len(args) == 2:
        return SetAttr(_name(args[0]), args[1])
    if kind == "call" and len(args) == 3 and isinstance(args[1], list):
        kwargs = check_options(args[2])
        return CallMethod(_name(args[0]), tuple(args[1]), kwargs)
    if kind == "is_wrapped" and len(args) == 1:
        return IsWrapped(_wrapper(args[0]))
    raise ValueError(f"a malformed call: {data!r}")


def _name(name: object) -> str:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"attribute names must be public identifiers, got {name!r}")
    return name


def _wrapper(name: object) -> type:
    import sys  # noqa: PLC0415

    module, _, qualname = str(name).partition(":")
    owner: Any = sys.modules.get(module)
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    if isinstance(owner, type):
        return owner
    raise ValueError(f"{name!r} is not a class the server has imported")


class Connection:
    """One client connection: its groups, its frames out, its window."""

    def __init__(
        self, server: Server, ws: web.WebSocketResponse, peer: str, transport: Any = None
    ) -> None:
        self.server = server
        self.ws = ws
        self.transport = transport  # the socket's (a test cuts the connection through it)
        self.peer = peer
        self.groups: dict[int, Group] = {}
        self.sessions = 0
        self.out: list[Any] = []
        self.wake = asyncio.Event()
        self.writer = server.spawn(self._write())

    def send(self, message: Any) -> None:
        """Queue ``message``: it goes out in the frame of this loop turn."""
        self.out.append(message)
        self.wake.set()

    async def _write(self) -> None:
        ws = self.ws
        with contextlib.suppress(ConnectionError, RuntimeError):
            while not ws.closed:
                await self.wake.wait()
                self.wake.clear()
                if self.out:
                    frame, self.out = encode(self.out), []
                    await ws.send_bytes(frame)

    def in_the_works(self) -> int:
        """Requests of this connection's groups not answered yet."""
        return sum(
            sum(1 for r in group.requests.values() if not r.done) for group in self.groups.values()
        )

    def handle(self, message: ClientMessage) -> None:
        """Act on one message of the client's."""
        if isinstance(message, PingMsg):
            self.send(PongMsg(message.at))
            return
        if isinstance(message, HelloMsg):
            raise ValueError("a second hello on one connection")
        if isinstance(message, OpenMsg):
            self._open(message)
            return
        group = self.groups.get(message.group)
        if group is None:
            rid = getattr(message, "rid", 0)
            error = ValueError(f"no group {message.group} on this connection")
            self.send(FailedMsg(rid, message.group, codec.error_to_data(error)))
            return
        if isinstance(message, CancelMsg):
            with contextlib.suppress(ValueError):  # a cancel of nothing known: nothing to do
                group.cancel(message.rid, envs_of(message.envs, group.count))
            return
        if message.rid <= group.seen:
            group.again(message.rid, self)
            return
        if message.rid != group.seen + 1 or self.in_the_works() >= self.server.window:
            # (a request before it was refused as busy: it comes again, and this one after it)
            self.send(BusyMsg(message.rid, group.gid))
            return
        try:
            group.take(self._request(message, group))
        except ValueError as exc:
            group.seen = message.rid
            failed = FailedMsg(message.rid, group.gid, codec.error_to_data(exc))
            self.send(failed)

    def _request(
        self, message: StepMsg | CallMsg | RebuildMsg | CloseMsg, group: Group
    ) -> GroupRequest:
        deadline = None
        if isinstance(message, CloseMsg):
            return GroupRequest(message.rid, list(range(group.count)), "close", message)
        envs = envs_of(message.envs, group.count)
        if isinstance(message, RebuildMsg):
            return GroupRequest(message.rid, envs, "rebuild", message)
        if message.deadline is not None:
            deadline = time.monotonic() + max(0.0, float(message.deadline))
        if isinstance(message, StepMsg):
            return GroupRequest(message.rid, envs, "step", message, message.stream, deadline)
        return GroupRequest(message.rid, envs, "call", message, False, deadline)

    def _open(self, message: OpenMsg) -> None:
        server = self.server
        if message.group in self.groups:
            error: Exception = ValueError(f"group {message.group} is open already")
        elif not message.count >= 1 or self.sessions + message.count > server.max_sessions:
            error = ValueError(
                f"{message.count} more sessions would be over this server's limit of "
                f"{server.max_sessions} per connection ({self.sessions} open)"
            )
        elif len(message.kwargs) != message.count or not all(
            isinstance(k, dict) and all(type(n) is str for n in k) for k in message.kwargs
        ):
            error = ValueError("kwargs: expected a dict of keyword arguments per session")
        else:
            self.sessions += message.count
            server.spawn(self._build(message))
            return
        self.send(FailedMsg(message.rid, message.group, codec.error_to_data(error)))

    async def _build(self, message: OpenMsg) -> None:
        server = self.server
        fns = [functools.partial(server.factory, **kwargs) for kwargs in message.kwargs]
        try:
            backend = await server.open_backend(fns)
        except Exception as exc:
            self.sessions -= message.count
            self.send(FailedMsg(message.rid, message.group, codec.error_to_data(exc)))
            return
        group = Group(server, message.group, backend, self)
        if self.ws.closed:  # the client went away meanwhile: the sessions wait for it
            group.detach()
        self.groups[message.group] = group
        server.groups[group.token] = group
        traits = backend.traits
        first_obs, first_act = traits.observation_spaces[0], traits.action_spaces[0]
        try:
            opened = OpenedMsg(
                message.rid,
                message.group,
                group.token,
                codec.pack(codec.space_to_data(first_obs)),
                codec.pack(codec.space_to_data(first_act)),
                _odd_spaces(traits.observation_spaces, first_obs),
                _odd_spaces(traits.action_spaces, first_act),
                _metadata(traits.metadata),
                traits.render_mode,
            )
        except TypeError as exc:
            await server.close_group(group, "its spaces cannot be described")
            self.send(FailedMsg(message.rid, message.group, codec.error_to_data(exc)))
            return
        group.seen = message.rid
        logger.info(
            "aiovec serve: opened group %s: %d sessions for %s",
            message.group,
            message.count,
            self.peer,
        )
        self.send(opened)

    def resume(self, gid: int, token: str) -> str:
        """Take group ``gid`` back by its token: ``""``, or why not."""
        group = self.server.groups.get(token)
        if group is None:
            return self.server.gone.get(token, "no such sessions on this server")
        if group.gid != gid:
            return "the token is another group's"
        if group.conn is not None and group.conn is not self:
            group.conn.groups.pop(gid, None)
        group.attach(self)
        self.groups[gid] = group
        self.sessions += group.count
        return ""

    def detach(self) -> None:
        """The connection ended: its groups wait for a resume."""
        for group in self.groups.values():
            if group.conn is self:
                group.detach()
        self.groups.clear()


def _odd_spaces(spaces_: Sequence[Any], first: Any) -> dict[int, Any]:
    return {
        k: codec.pack(codec.space_to_data(s)) for k, s in enumerate(spaces_) if k and s != first
    }


def _metadata(metadata: dict[str, Any]) -> Any:
    """The metadata entries that can be sent (others are left out)."""
    kept = {}
    for key, value in metadata.items():
        with contextlib.suppress(TypeError):
            kept[str(key)] = codec.pack(value)
    return kept


class Server:
    """An ``aiovec serve`` server on the running loop: `start`, then `aclose`.

    ``aiovec.serve`` runs one on a thread of its own (`Serving`); the ``serve``
    command on the main thread.
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

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
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

    async def close_group(self, group: Group, reason: str) -> dict[int, BaseException]:
        """Close a group's sessions and forget it; a resume is told ``reason``."""
        if group.closed:
            return {}
        group.closed = True
        if group.expiry is not None:
            group.expiry.cancel()
        self.groups.pop(group.token, None)
        self.gone[group.token] = f"the server closed these sessions: {reason}"
        if len(self.gone) > 4096:
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
            await conn.ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutting down")
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
        ws = web.WebSocketResponse(max_msg_size=self.max_frame, autoping=True, timeout=1.0)
        await ws.prepare(request)
        conn = Connection(self, ws, str(request.remote), request.transport)
        self.connections.add(conn)
        try:
            await self._serve(conn, ws)
        finally:
            self.connections.discard(conn)
            conn.detach()
            conn.wake.set()
            if not ws.closed:
                await ws.close()
            conn.writer.cancel()
        return ws

    async def _serve(self, conn: Connection, ws: web.WebSocketResponse) -> None:
        idle = 3 * self.heartbeat
        hello = True
        while True:
            try:
                msg = await ws.receive(timeout=idle)
            except TimeoutError:
                await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"no heartbeat")
                return
            if msg.type in {WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED}:
                return
            if msg.type is WSMsgType.ERROR:
                logger.warning("aiovec serve: closed %s: %s", conn.peer, ws.exception())
                return
            try:
                if msg.type is not WSMsgType.BINARY:
                    raise ValueError("frames are binary")
                messages = decode_client(msg.data)
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


class Serving:
    """A `Server` on a thread of its own, with its own loop: what ``aiovec.serve`` returns.

    ``async with`` or ``with`` starts it (``url`` is then its ``ws://HOST:PORT``)
    and, at the end, closes every session and connection and ends the thread.
    The server's loop is its own: a client on the caller's loop (even one built
    by a blocking constructor) is served while that loop is busy, and the envs'
    calls never hold the caller's loop.
    """

    def __init__(self, factory: Callable[..., Any], **options: Any) -> None:
        self._server = Server(factory, **options)  # the arguments are checked here, now
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.url = ""

    @property
    def server(self) -> Server:
        """The server (its state lives on its own thread: look, do not touch)."""
        return self._server

    def start(self) -> None:
        """Start the thread and wait until the server listens.

        Raises:
            OSError: It could not listen (the port is taken, ...).
        """
        if self._thread is not None:
            raise RuntimeError("this server was started already")
        self._thread = threading.Thread(target=self._run, name="aiovec-serve", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

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

    def close(self) -> None:
        """Close every session and connection, and end the thread (blocking)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop ended already
                loop.call_soon_threadsafe(stop.set)
        thread.join()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        await _off_loop(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await _off_loop(self.close)


async def _off_loop(fn: Callable[[], None]) -> None:
    """Run ``fn`` (it blocks briefly) on a thread of its own; the caller's loop runs meanwhile."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the caller's loop
            loop.call_soon_threadsafe(_settle, done, exc)
        else:
            loop.call_soon_threadsafe(_settle, done, None)

    thread = threading.Thread(target=run, name="aiovec-serve-control", daemon=True)
    thread.start()
    try:
        await asyncio.shield(done)
    finally:
        thread.join()


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
