"""``backend="remote"``: envs that are sessions on an ``aiovec serve`` server.

Theory of operation.  ``aiovec.make("ws://host:port", num_envs)`` builds a
vector env whose factories are `Remote` (the URL and the factory's keyword
arguments); this backend opens them as one *group* of sessions on the server,
over one WebSocket (``aiovec/_serve/protocol.py`` says what travels).  The
vector env applies every rule here as everywhere (lifecycle, validation,
timeouts, restarts); the server runs each env's ``step_flow``, so autoreset
costs no extra round trip.

- **One request per call.**  ``launch`` turns an op into one message (a step's
  actions as one block of bytes) numbered by the group's request id, and every
  message of one loop turn leaves in one frame.  Each env remembers the request
  it waits on (``_waiting``); an answer is delivered only to the envs still
  waiting on it, so a late answer (its envs cancelled at a deadline) is
  dropped and never reaches a later call.
- **Answers as blocks.**  A step's answer holds its envs' rows as raw bytes;
  when it covers every env at once it is handed over as a `StepBlock` of views
  of the frame (no copy), otherwise its rows are copied into the backend's own
  arrays.  Transitions that do not fit the rows come one by one.
- **Resume.**  A connection that drops (an error, an end of file, three
  heartbeats without an answer) is dialled again (`_reconnect`, backing off up
  to a second between tries); the first frame takes the group back by its token
  and sends every request still unanswered again with its id, which the server
  answers from what it kept: no step is lost or run twice, and the caller sees
  nothing.  If that fails within the resume window, or the server has closed the
  sessions, every env in flight fails with a ``ConnectionError`` saying why, and
  the envs stay lost (any later call fails at once).
- **Construction blocks.**  A vector env's constructor cannot wait on its loop,
  so the handshake, the hello and the opening of the sessions are made on a
  blocking socket (within ``connect_timeout``); after that the socket is
  non-blocking and read through the loop (``add_reader``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio
import numpy as np

from aiovec._core import validate
from aiovec._core.calls import CallMethod, EnvCall, GetAttr, IsWrapped, Render, Reset, SetAttr
from aiovec._core.layout import StepArrays, StepLayout, copy_rows
from aiovec._core.ops import CallOp, Op, StepOp
from aiovec._core.rows import Rows, StepBlock
from aiovec._log import logger
from aiovec.backends._base import Backend, EnvTraits
from aiovec.backends._drive import CLOSE_TIMEOUT
from aiovec.backends._limit import Slots

try:
    from aiovec._serve import codec
    from aiovec._serve import wsclient as ws
    from aiovec._serve.protocol import (
        PROTOCOL,
        BusyMsg,
        CallMsg,
        CallReplyMsg,
        CancelMsg,
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
        StepPart,
        WelcomeMsg,
        decode_server,
        encode,
        envs_bytes,
    )
    from aiovec._serve.steps import pack_actions, pack_resets, rows_of
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is missing
    if exc.name != "msgspec":
        raise
    raise ModuleNotFoundError(
        'backend="remote" (aiovec.make("ws://...")) needs msgspec, which is not installed: '
        'pip install "aiovec[serve]"',
        name=exc.name,
    ) from exc

__all__ = ("Remote", "RemoteBackend")

GROUP = 1
"""The id of the one group of sessions a connection of this backend holds."""


class Remote:
    """A session on an ``aiovec serve`` server: the factory ``aiovec.make`` gives a ws:// URL.

    Its env lives on the server, built there by the server's factory with
    ``kwargs``; calling it here is a mistake, and says so.
    """

    __slots__ = ("kwargs", "url")

    def __init__(self, url: str, kwargs: Mapping[str, Any] | None = None) -> None:
        ws.parse_url(url)
        self.url = url
        self.kwargs = dict(kwargs or {})
        codec.pack(self.kwargs)  # plain data only: refused here, not on the server

    def __call__(self) -> Any:
        """Refuse: the env is built on the server."""
        raise TypeError(
            f"this env is a session on the aiovec server at {self.url}: only "
            'backend="remote" opens it (aiovec.make(url, num_envs) sets that up)'
        )

    def __repr__(self) -> str:
        return f"Remote({self.url!r}, {self.kwargs!r})"


@dataclass(eq=False)
class _Out:
    """A request in flight: its message (sent again after a reconnect) and its envs."""

    message: Any
    since: float
    done: asyncio.Future[Any] | None = None  # rebuild and close: their reply


class RemoteBackend(Backend):
    """Envs as sessions on an aiovec server, over one connection (see the module).

    Options (``backend_options``): ``url`` (else the factories' URL), ``token``,
    ``connect_timeout`` (seconds, default 10), ``deadline`` (seconds a server may
    take to answer a call; ``aiovec.make`` gives it ``step_timeout``).
    """

    OPTIONS: ClassVar[frozenset[str]] = frozenset({"url", "token", "connect_timeout", "deadline"})

    @staticmethod
    def session(url: str, kwargs: Mapping[str, Any]) -> Remote:
        """The factory of a session on the server at ``url`` (its factory gets ``kwargs``)."""
        return Remote(url, kwargs)

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(env_fns, num_workers, limiter)
        options = dict(options or {})
        self._slots = None if limiter is None else Slots(limiter, self._dispatch, self._queue)
        self._ops: dict[
            int, tuple[Op, int]
        ] = {}  # env -> its op and place, while it waits for a slot
        self.url, kwargs = _sessions(env_fns, options.get("url"))
        self.token = _optional_str("token", options.get("token"))
        self.connect_timeout = (
            validate.check_timeout("connect_timeout", options.get("connect_timeout", 10.0)) or 10.0
        )
        self.deadline = validate.check_timeout("deadline", options.get("deadline"))
        self._loop = asyncio.get_running_loop()
        self._rid = 0
        self._waiting = np.zeros(self.num_envs, dtype=np.int64)  # request each env waits on
        self._inflight: dict[int, _Out] = {}
        self._out: list[Any] = []  # messages of this loop turn
        self._flushing = False
        self._unsent = b""  # what the socket did not take yet
        self._sock: socket.socket | None = None
        self._reader = ws.FrameReader(1 << 30)
        self._gone: Exception | None = None  # the sessions are lost, and why
        self._closing = False
        self._reconnecting: asyncio.Task[None] | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._heard = time.monotonic()
        self._busy: list[int] = []  # requests the server asked to send again
        self.reconnects = 0
        self._ended_connection: asyncio.Future[None] | None = None  # set once closing
        self._open(kwargs)

    # -- opening -----------------------------------------------------------------------

    def _open(self, kwargs: list[dict[str, Any]]) -> None:
        """Connect, shake hands and open the sessions, blocking (see the module)."""
        try:
            sock, rest = ws.connect_blocking(self.url, self.token, self.connect_timeout)
        except ws.HandshakeError as exc:
            if exc.status == 401:
                raise PermissionError(f"the aiovec server at {self.url} refused: {exc}") from None
            raise
        self._rid = 1
        opening = [
            HelloMsg(PROTOCOL),
            OpenMsg(1, GROUP, self.num_envs, [codec.pack(k) for k in kwargs]),
        ]
        try:
            sock.setblocking(True)
            sock.sendall(ws.mask_frame(encode(opening)))
            welcome, opened = self._answers(sock, rest)
        except BaseException:
            sock.close()
            raise
        self.window = welcome.window
        self.heartbeat = welcome.heartbeat
        self.resume_window = welcome.resume_window  # how long the client keeps dialling
        self._session_token = opened.token
        self.traits = _traits(opened, self.num_envs)
        self._obs_layouts = Layouts(self.traits.observation_spaces[0])
        self._act_layouts = Layouts(self.traits.action_spaces[0])
        layout = StepLayout.of(
            self.traits.observation_spaces[0], self.traits.action_spaces[0], self.num_envs
        )
        self._arrays: StepArrays | None = (
            None if layout is None else layout.arrays(bytearray(layout.nbytes))
        )
        self._attach(sock, b"")
        self._beat = self._loop.call_later(self.heartbeat, self._heartbeat)

    def _answers(self, sock: socket.socket, rest: bytes) -> tuple[WelcomeMsg, OpenedMsg]:
        """Read the server's welcome and the opened group (blocking)."""
        until = time.monotonic() + self.connect_timeout
        welcome: WelcomeMsg | None = None
        data = rest
        while True:
            for opcode, payload in self._reader.feed(data):
                if opcode == ws.CLOSE:
                    raise ConnectionError(
                        f"the aiovec server at {self.url} closed the connection: "
                        f"{ws.describe_close(payload)}"
                    )
                if opcode != ws.BINARY:
                    continue
                for message in decode_server(payload):
                    if isinstance(message, WelcomeMsg):
                        welcome = message
                    elif isinstance(message, OpenedMsg) and welcome is not None:
                        return welcome, message
                    elif isinstance(message, FailedMsg):
                        error = codec.data_to_error(message.error)
                        raise error
            left = until - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"the aiovec server at {self.url} did not open the sessions within "
                    f"{self.connect_timeout} s"
                )
            sock.settimeout(left)
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionError(f"the aiovec server at {self.url} closed the connection")

    def _attach(self, sock: socket.socket, rest: bytes) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._unsent = b""
        self._heard = time.monotonic()
        self._loop.add_reader(sock.fileno(), self._readable)
        if rest:
            self._received(rest)

    # -- requests out ------------------------------------------------------------------

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Send ``op`` for ``indices`` as one request (it leaves with this loop turn's frame)."""
        since = time.perf_counter()
        pending, started = self.pending, self._started
        pending.update(indices)
        for i in indices:
            started[i] = since
        if self._gone is not None:
            for i in indices:
                self._finish(i, None, self._lost_error())
            return
        if self._slots is not None:  # max_concurrency: each env's call goes once it has a slot
            for k, i in enumerate(indices):
                self._ops[i] = (op, k)
            self._slots.request(indices)
            return
        self._request_now(indices, op, since)

    def _dispatch(self, envs: list[int]) -> None:
        """Send the calls of ``envs``, which got their slots together: a request per op."""
        since = time.perf_counter()
        by_op: dict[int, tuple[Op, list[tuple[int, int]]]] = {}
        for i in envs:
            op, k = self._ops.pop(i)
            by_op.setdefault(id(op), (op, []))[1].append((i, k))
        for op, pairs in by_op.values():
            pairs.sort()
            self._request_now([i for i, _ in pairs], op.subset([k for _, k in pairs]), since)

    def _request_now(self, indices: Sequence[int], op: Op, since: float) -> None:
        """Send ``op`` for ``indices`` as request number ``rid``."""
        self._rid += 1
        rid = self._rid
        self._waiting[
            list(indices) if not isinstance(indices, range) else slice(indices.start, indices.stop)
        ] = rid
        try:
            message = self._message(rid, indices, op)
        except (TypeError, ValueError) as exc:
            for i in indices:
                self._waiting[i] = 0
                self._finish(i, None, exc)
            return
        self._inflight[rid] = _Out(message, since)
        self._send(message)

    def _message(self, rid: int, indices: Sequence[int], op: Op) -> StepMsg | CallMsg:
        envs = envs_bytes(indices)
        deadline = self.deadline
        if type(op) is StepOp:
            actions, values = pack_actions(op, self._act_layouts)
            resets, autoresets = pack_resets(op)
            return StepMsg(
                rid,
                GROUP,
                envs,
                op.mode.value,
                resets,
                autoresets,
                actions,
                values,
                op.stream,
                op.timed,
                deadline,
            )
        assert isinstance(op, CallOp)
        return CallMsg(rid, GROUP, envs, op.name, [_call_data(c) for c in op.calls], deadline)

    def _send(self, message: Any) -> None:
        self._out.append(message)
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        out, self._out = self._out, []
        if not out or self._sock is None:
            return  # a reconnect sends what is in flight again
        self._write(ws.mask_frame(encode(out)))

    def _write(self, data: bytes) -> None:
        sock = self._sock
        assert sock is not None
        if self._unsent:
            self._unsent += data
            return
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._dropped(f"writing failed: {exc}")
            return
        if sent < len(data):
            self._unsent = data[sent:]
            self._loop.add_writer(sock.fileno(), self._writable)

    def _writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._dropped(f"writing failed: {exc}")
            return
        self._unsent = self._unsent[sent:]
        if not self._unsent:
            self._loop.remove_writer(sock.fileno())

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Report the envs in flight (of ``indices``, or all) cancelled; tell the server."""
        out = list(self.pending if indices is None else self.pending.intersection(indices))
        by_request: dict[int, list[int]] = {}
        if self._slots is not None:
            self._slots.forget(out)  # a queued env is not sent now only to be cancelled
            for i in out:
                self._ops.pop(i, None)
        for i in out:
            rid = int(self._waiting[i])
            self._waiting[i] = 0
            by_request.setdefault(rid, []).append(i)
            self._finish(i, None, asyncio.CancelledError())
        for rid, envs in by_request.items():
            self._settled(rid)
            if rid and self._gone is None:
                self._send(CancelMsg(GROUP, rid, envs_bytes(sorted(envs))))

    def _settled(self, rid: int) -> None:
        """Forget request ``rid`` once no env waits on it any more."""
        out = self._inflight.get(rid)
        if out is not None and out.done is None and not (self._waiting == rid).any():
            del self._inflight[rid]

    # -- answers in --------------------------------------------------------------------

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        chunks: list[bytes] = []
        try:
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    if chunks:
                        self._received(b"".join(chunks))
                    self._dropped("the server closed the connection")
                    return
                chunks.append(chunk)
                if len(chunk) < 1 << 20:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._dropped(f"reading failed: {exc}")
            return
        if chunks:
            self._received(b"".join(chunks))

    def _received(self, data: bytes) -> None:
        self._heard = time.monotonic()
        try:
            frames = self._reader.feed(data)
            for opcode, payload in frames:
                if opcode == ws.BINARY:
                    for message in decode_server(payload):
                        self._on_message(message)
                elif opcode == ws.CLOSE:
                    self._dropped(
                        f"the server closed the connection ({ws.describe_close(payload)})"
                    )
                    return
                elif opcode == ws.PING and self._sock is not None:
                    self._write(ws.mask_frame(payload, ws.PONG))
        except ValueError as exc:  # the server's bytes make no sense: give up on it
            self._lose(
                ConnectionError(f"the aiovec server at {self.url} sent a malformed frame: {exc}")
            )
        if self._busy:
            self._send_busy()

    def _on_message(self, message: Any) -> None:
        kind = type(message)
        if kind is StepPart:
            self._part(message)
        elif kind is CallReplyMsg:
            self._reply(message)
        elif kind is FailedMsg:
            self._failed(message)
        elif kind is BusyMsg:
            self._busy.append(message.rid)
        elif kind is WelcomeMsg:
            self._welcome(message)
        elif kind is GoneMsg:
            self._lose(ConnectionError(message.reason))
        elif kind is PongMsg:
            pass

    def _part(self, part: StepPart) -> None:
        rid = part.rid
        out = self._inflight.get(rid)
        if out is None:
            return  # a late answer: its envs were cancelled
        waiting = self._waiting
        rows = rows_of(part, self._obs_layouts)
        if rows is not None:
            envs = rows.envs
            wanted = waiting[envs] == rid
            n = self.num_envs
            if len(envs) == n and wanted.all() and (envs == np.arange(n)).all():
                arrays = StepArrays(
                    rows.observations,
                    None,
                    rows.rewards,
                    rows.terminations,
                    rows.truncations,
                    rows.terminations,  # (resets: not read from an answer's rows)
                )
                waiting[:] = 0
                self._finish_block(
                    StepBlock(range(n), arrays, _ints(part.infos), _ints(part.finals)), out.since
                )
            elif wanted.any():
                self._rows(part, rows, wanted, out.since)
        for i, value in part.singles.items():
            if 0 <= i < self.num_envs and waiting[i] == rid:
                waiting[i] = 0
                self._finish(i, tuple(value), None)
        for i, error in part.errors.items():
            if 0 <= i < self.num_envs and waiting[i] == rid:
                waiting[i] = 0
                self._finish(i, None, codec.data_to_error(error))
        if part.done:
            self._ended(rid)

    def _rows(self, part: StepPart, rows: Any, wanted: np.ndarray, since: float) -> None:
        """Copy the wanted rows of a part into the backend's arrays; deliver them as a block."""
        arrays = self._arrays
        assert arrays is not None
        positions = np.flatnonzero(wanted)
        envs: list[int] = rows.envs[positions].tolist()
        copy_rows(arrays.observations, rows.observations, envs, positions.tolist())
        arrays.rewards[envs] = rows.rewards[positions]
        arrays.terminations[envs] = rows.terminations[positions]
        arrays.truncations[envs] = rows.truncations[positions]
        self._waiting[envs] = 0
        keep = set(envs)
        infos = {int(i): v for i, v in part.infos.items() if i in keep}
        finals = {int(i): v for i, v in part.finals.items() if i in keep}
        self._finish_block(StepBlock(envs, arrays, infos, finals), since)

    def _finish(self, i: int, value: Any, error: BaseException | None) -> None:
        super()._finish(i, value, error)
        if self._slots is not None:
            self._slots.release(i)

    def _finish_block(self, block: StepBlock, since: float) -> None:
        super()._finish_block(block, since)
        slots = self._slots
        if slots is not None:
            with slots.deferred():
                for i in block.envs:
                    slots.release(i)

    def _new_results(self) -> Rows:
        return Rows()

    def _reply(self, reply: CallReplyMsg) -> None:
        out = self._inflight.get(reply.rid)
        if out is None:
            return
        if out.done is not None:
            del self._inflight[reply.rid]
            if not out.done.done():
                out.done.set_result(reply)
            return
        waiting = self._waiting
        for i, value in reply.values.items():
            if 0 <= i < self.num_envs and waiting[i] == reply.rid:
                waiting[i] = 0
                self._finish(i, value, None)
        for i, error in reply.errors.items():
            if 0 <= i < self.num_envs and waiting[i] == reply.rid:
                waiting[i] = 0
                self._finish(i, None, codec.data_to_error(error))
        self._ended(reply.rid)

    def _failed(self, failed: FailedMsg) -> None:
        error = codec.data_to_error(failed.error)
        out = self._inflight.get(failed.rid)
        if out is None:
            if failed.rid == 0:
                self._lose(ConnectionError(f"the aiovec server refused a frame: {error}"))
            return
        if out.done is not None:
            del self._inflight[failed.rid]
            if not out.done.done():
                out.done.set_exception(error)
            return
        for i in np.flatnonzero(self._waiting == failed.rid).tolist():
            self._waiting[i] = 0
            self._finish(i, None, error)
        self._inflight.pop(failed.rid, None)

    def _ended(self, rid: int) -> None:
        """Request ``rid`` is answered in full: any env it left out fails."""
        self._inflight.pop(rid, None)
        left = np.flatnonzero(self._waiting == rid).tolist()
        for i in left:
            self._waiting[i] = 0
            self._finish(
                i, None, RuntimeError(f"the server's answer to request {rid} left env {i} out")
            )

    def _send_busy(self) -> None:
        """Send again the requests the server was too busy to take (now it answered)."""
        busy, self._busy = self._busy, []
        for rid in sorted(busy):
            out = self._inflight.get(rid)
            if out is not None:
                self._send(out.message)

    # -- the connection: heartbeats, drops, resume --------------------------------------

    def _heartbeat(self) -> None:
        self._beat = None
        if self._closing or self._gone is not None:
            return
        if self._sock is not None:
            if time.monotonic() - self._heard > 3 * self.heartbeat:
                self._dropped(f"no answer to heartbeats for {3 * self.heartbeat:g} s")
            else:
                self._send(PingMsg(time.time()))
        self._beat = self._loop.call_later(self.heartbeat, self._heartbeat)

    def _detach(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(Exception):
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
        sock.close()
        self._unsent = b""
        self._reader = ws.FrameReader(1 << 30)

    def _dropped(self, reason: str) -> None:
        """The connection is gone: dial again and resume, unless closing."""
        self._detach()
        ended = self._ended_connection
        if ended is not None and not ended.done():
            ended.set_result(None)
        if self._closing or self._gone is not None or self._reconnecting is not None:
            return
        logger.warning("aiovec: lost the connection to %s (%s); resuming", self.url, reason)
        self._reconnecting = self._loop.create_task(self._reconnect(reason))

    def drop_connection(self) -> None:
        """Cut the connection now, as a network fault would (for tests and fault runs)."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            self._dropped("cut by drop_connection()")

    async def _reconnect(self, reason: str) -> None:
        until = time.monotonic() + self.resume_window
        delay = 0.005
        try:
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    self._lose(
                        ConnectionError(
                            f"lost the connection to the aiovec server at {self.url} ({reason}) "
                            f"and could not resume within {self.resume_window:g} s"
                        )
                    )
                    return
                try:
                    sock, rest = await ws.connect_async(
                        self.url, self.token, min(left, self.connect_timeout)
                    )
                except ws.HandshakeError as exc:
                    self._lose(
                        ConnectionError(f"the aiovec server at {self.url} refused to resume: {exc}")
                    )
                    return
                except OSError:
                    await asyncio.sleep(min(delay, max(0.0, left)))
                    delay = min(2 * delay, 1.0)
                    continue
                break
        finally:
            self._reconnecting = None
        if self._closing:
            sock.close()
            return
        self.reconnects += 1
        again = [out.message for rid, out in sorted(self._inflight.items())]
        self._out.clear()
        self._attach(sock, b"")
        self._write(
            ws.mask_frame(encode([HelloMsg(PROTOCOL, [(GROUP, self._session_token)]), *again]))
        )
        if rest:
            self._received(rest)

    def _welcome(self, welcome: WelcomeMsg) -> None:
        reason = welcome.resumed.get(GROUP)
        if reason:
            self._lose(ConnectionError(f"could not resume the sessions on {self.url}: {reason}"))
        else:
            logger.warning("aiovec: resumed the sessions on %s", self.url)

    def _lose(self, error: Exception) -> None:
        """The sessions are gone: fail every env in flight with ``error``; later calls too."""
        if self._gone is None:
            self._gone = error
            logger.warning("aiovec: %s", error)
        self._detach()
        for out in list(self._inflight.values()):
            if out.done is not None and not out.done.done():
                out.done.set_exception(self._lost_error())
        self._inflight.clear()
        for i in sorted(self.pending):
            self._waiting[i] = 0
            self._finish(i, None, self._lost_error())

    def _lost_error(self) -> Exception:
        gone = self._gone
        assert gone is not None
        error = ConnectionError(str(gone))
        error.__cause__ = gone.__cause__
        return error

    @property
    def lost(self) -> frozenset[int]:
        """Every env, once the sessions are gone (see `_lose`)."""
        return frozenset(range(self.num_envs)) if self._gone is not None else frozenset()

    # -- rebuild and close -------------------------------------------------------------

    async def _request(self, message: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Send a rebuild or close and wait for its reply (``TimeoutError`` after ``timeout``)."""
        done = self._loop.create_future()
        self._inflight[message.rid] = _Out(message, time.perf_counter(), done)
        self._send(message)
        if timeout is not None:
            await asyncio.wait([done], timeout=timeout)  # (a blocking caller drives this by hand)
            if not done.done():
                self._inflight.pop(message.rid, None)
                raise TimeoutError(f"no answer within {timeout} s")
        return await done

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Have the server close and rebuild the sessions ``indices``."""
        if self._gone is not None:
            return dict.fromkeys(indices, self._lost_error())
        self._rid += 1
        try:
            reply = await self._request(RebuildMsg(self._rid, GROUP, envs_bytes(indices)))
        except ConnectionError as exc:
            return dict.fromkeys(indices, exc)
        return {int(i): codec.data_to_error(e) for i, e in reply.errors.items()}

    async def aclose(self) -> dict[int, BaseException]:
        """Close the sessions on the server, then the connection (once the server ended it)."""
        errors: dict[int, BaseException] = {}
        try:
            await self.drain()
            if self._gone is None:
                self._rid += 1
                try:
                    reply = await self._request(CloseMsg(self._rid, GROUP), CLOSE_TIMEOUT)
                    errors = {int(i): codec.data_to_error(e) for i, e in reply.errors.items()}
                except (TimeoutError, ConnectionError) as exc:
                    logger.warning("aiovec: closing the sessions on %s failed: %r", self.url, exc)
            await self._goodbye()
        finally:
            self.close_now()
        return errors

    async def _goodbye(self) -> None:
        """Send a close frame and wait (briefly) for the server to end the connection."""
        if self._sock is None:
            return
        self._closing = True
        self._ended_connection = self._loop.create_future()
        self._write(ws.mask_frame(ws.close_payload(), ws.CLOSE))
        await asyncio.wait([self._ended_connection], timeout=1.0)

    def close_now(self) -> None:
        """Drop the connection and every timer, without a loop (construction failed)."""
        self._closing = True
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        task, self._reconnecting = self._reconnecting, None
        if task is not None:
            task.cancel()
        if not self._loop.is_closed():
            self._detach()
        elif self._sock is not None:
            self._sock.close()
            self._sock = None


def _sessions(fns: Sequence[Callable[[], Any]], url: object) -> tuple[str, list[dict[str, Any]]]:
    """The URL the factories name and each one's keyword arguments."""
    bad = [k for k, fn in enumerate(fns) if not isinstance(fn, Remote)]
    if bad:
        raise TypeError(
            f'backend="remote": env_fns[{bad[0]}] is {validate.describe(fns[bad[0]])}, not a '
            'session on a server; build the vector env with aiovec.make("ws://HOST:PORT", '
            "num_envs) (the server builds the envs)"
        )
    remotes: list[Remote] = list(fns)  # type: ignore[arg-type]
    urls = {url} if url is not None else {fn.url for fn in remotes}
    if len(urls) != 1:
        raise ValueError(
            f"backend='remote': every session must be on one server, got {sorted(map(str, urls))}"
        )
    return str(urls.pop()), [fn.kwargs for fn in remotes]


def _optional_str(name: str, value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{name} must be a str or None, got {validate.describe(value)}")


def _traits(opened: OpenedMsg, num_envs: int) -> EnvTraits:
    obs = codec.data_to_space(opened.observation_space)
    act = codec.data_to_space(opened.action_space)
    observation_spaces = [obs] * num_envs
    action_spaces = [act] * num_envs
    for k, data in opened.observation_spaces.items():
        observation_spaces[int(k)] = codec.data_to_space(data)
    for k, data in opened.action_spaces.items():
        action_spaces[int(k)] = codec.data_to_space(data)
    metadata = dict(opened.metadata) if isinstance(opened.metadata, dict) else {}
    return EnvTraits(observation_spaces, action_spaces, metadata, opened.render_mode)


def _ints(mapping: dict[int, Any]) -> dict[int, Any]:
    return mapping if not mapping else {int(i): v for i, v in mapping.items()}


def _call_data(call: EnvCall) -> list[Any]:
    """A call as the wire holds it (`aiovec._serve.server.call_of` reads it)."""
    kind = type(call)
    if kind is Reset:
        assert isinstance(call, Reset)
        return ["reset", call.seed, codec.pack(call.options)]
    if kind is Render:
        return ["render"]
    if kind is GetAttr:
        assert isinstance(call, GetAttr)
        return ["get_attr", call.name]
    if kind is SetAttr:
        assert isinstance(call, SetAttr)
        return ["set_attr", call.name, codec.pack(call.value)]
    if kind is CallMethod:
        assert isinstance(call, CallMethod)
        return ["call", call.name, codec.pack(list(call.args)), codec.pack(call.kwargs)]
    if kind is IsWrapped:
        assert isinstance(call, IsWrapped)
        return ["is_wrapped", f"{call.wrapper.__module__}:{call.wrapper.__qualname__}"]
    raise TypeError(f"a {kind.__name__} cannot be sent to a server")
