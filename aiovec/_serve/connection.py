"""One client connection on the server: its frames in, its groups, its frames out.

The server's reader task decodes each frame and hands its messages here
(`Connection.handle`), one by one: a request goes to its group (or is refused:
unknown group, over the window, an id out of order), an ``open`` builds a new
group.  Replies are queued (`send`) and leave together: right after the frame
that caused them is handled (`flush`, called by the reader), or, for replies
that come later (envs that waited), at the end of that loop turn.  A frame is
written straight to the transport; only a transport that asks to wait (its
buffer full) makes the write a task, and frames queue behind it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from aiovec._resume import Resume
from aiovec._serve import codec
from aiovec._serve.group import Group, GroupRequest
from aiovec._serve.protocol import (
    BusyMsg,
    CallMsg,
    CancelMsg,
    ClientMessage,
    CloseMsg,
    FailedMsg,
    OpenedMsg,
    OpenMsg,
    PingMsg,
    PongMsg,
    RebuildMsg,
    StepMsg,
    encode,
    envs_of,
)

if TYPE_CHECKING:
    from aiovec._serve.server import Server

__all__ = ("Connection",)


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
        self._soon: asyncio.Handle | None = None
        self._writing: asyncio.Task[None] | None = None
        self.reading = False  # the reader is handling a frame: it flushes when done

    # -- frames out ----------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queue ``message``: it leaves in one frame with the others of this loop turn."""
        self.out.append(message)
        if self._soon is None and not self.reading:
            self._soon = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued as one frame, now (or after the write that waits)."""
        soon, self._soon = self._soon, None
        if soon is not None:
            soon.cancel()
        if not self.out or self._writing is not None or self.ws.closed:
            return
        frame, self.out = encode(self.out), []
        sending = self.ws.send_bytes(frame)
        try:
            waiting = sending.send(None)  # written at once unless the transport is full
        except StopIteration:
            return
        except (ConnectionError, RuntimeError):  # closing: the reader sees the end
            return
        self._writing = self.server.spawn(Resume(sending, waiting))
        self._writing.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writing = None
        if not task.cancelled() and task.exception() is None and self.out:
            self.flush()

    # -- messages in ---------------------------------------------------------------------

    def in_the_works(self) -> int:
        """Requests of this connection's groups not answered yet."""
        return sum(group.in_the_works() for group in self.groups.values())

    def handle(self, message: ClientMessage) -> None:
        """Act on one message of the client's.

        Raises:
            ValueError: The message breaks the protocol (the connection is closed).
        """
        kind = type(message)
        if kind is StepMsg or kind is CallMsg or kind is RebuildMsg or kind is CloseMsg:
            self._request(message)  # type: ignore[arg-type]
        elif kind is PingMsg:
            self.send(PongMsg(message.at))  # type: ignore[union-attr]
        elif kind is CancelMsg:
            group = self._group(message)  # type: ignore[arg-type]
            if group is not None:
                with contextlib.suppress(ValueError):  # a cancel of nothing known: nothing to do
                    group.cancel(message.rid, envs_of(message.envs, group.count))  # type: ignore[union-attr]
        elif kind is OpenMsg:
            self._open(message)  # type: ignore[arg-type]
        else:
            raise ValueError("a second hello on one connection")

    def _group(
        self, message: StepMsg | CallMsg | RebuildMsg | CloseMsg | CancelMsg
    ) -> Group | None:
        """The group a message names; ``None`` (and the client told) if it has none of that id."""
        group = self.groups.get(message.group)
        if group is None:
            rid = getattr(message, "rid", 0)
            error = ValueError(f"no group {message.group} on this connection")
            self.send(FailedMsg(rid, message.group, codec.error_to_data(error)))
        return group

    def _request(self, message: StepMsg | CallMsg | RebuildMsg | CloseMsg) -> None:
        group = self._group(message)
        if group is None:
            return
        rid = message.rid
        if rid <= group.seen:
            group.again(rid, self)
            return
        works = group.in_the_works() if len(self.groups) == 1 else self.in_the_works()
        if rid != group.seen + 1 or works >= self.server.window:
            # (a request before it was refused as busy: it comes again, and this one after it)
            self.send(BusyMsg(rid, group.gid))
            return
        try:
            request = _request(message, group.count)
        except ValueError as exc:
            group.seen = rid
            self.send(FailedMsg(rid, group.gid, codec.error_to_data(exc)))
            return
        group.take(request)

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
        try:
            opened = _opened(message, group)
        except TypeError as exc:
            await server.close_group(group, "its spaces cannot be described")
            self.send(FailedMsg(message.rid, message.group, codec.error_to_data(exc)))
            return
        group.seen = message.rid
        server.log_open(group, self.peer)
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


def _request(message: StepMsg | CallMsg | RebuildMsg | CloseMsg, count: int) -> GroupRequest:
    """The request a message makes of a group of ``count`` sessions.

    Raises:
        ValueError: Its envs are malformed.
    """
    if isinstance(message, CloseMsg):
        return GroupRequest(message.rid, range(count), "close", message)
    envs = envs_of(message.envs, count)
    if isinstance(message, RebuildMsg):
        return GroupRequest(message.rid, envs, "rebuild", message)
    deadline = None
    if message.deadline is not None:
        deadline = time.monotonic() + max(0.0, float(message.deadline))
    if isinstance(message, StepMsg):
        # a step under a timeout is answered as envs finish too: those done are not late
        streamed = message.stream or message.timed
        return GroupRequest(message.rid, envs, "step", message, streamed, deadline)
    return GroupRequest(message.rid, envs, "call", message, False, deadline)


def _opened(message: OpenMsg, group: Group) -> OpenedMsg:
    """The answer to an ``open``: the group's token and its envs' traits.

    Raises:
        TypeError: A space or the render mode cannot be described.
    """
    traits = group.backend.traits
    first_obs, first_act = traits.observation_spaces[0], traits.action_spaces[0]
    return OpenedMsg(
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


def _odd_spaces(spaces_: Sequence[Any], first: Any) -> dict[int, Any]:
    """The spaces that are not the first one, by index (compared as their wire data).

    Envs built apart have equal spaces that are distinct objects, and gymnasium's
    ``Box.__eq__`` (``allclose``) costs ~0.3 ms: 16,384 sessions took 5 s to open.
    """
    want = codec.packb(codec.space_to_data(first))
    odd = {}
    for k, space in enumerate(spaces_):
        if space is first:
            continue
        data = codec.space_to_data(space)
        if codec.packb(data) != want:
            odd[k] = codec.pack(data)
    return odd


def _metadata(metadata: dict[str, Any]) -> Any:
    """The metadata entries that can be sent (others are left out)."""
    kept = {}
    for key, value in metadata.items():
        with contextlib.suppress(TypeError):
            kept[str(key)] = codec.pack(value)
    return kept
