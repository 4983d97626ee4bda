"""The client's connection to an ``aiovec serve`` server: one socket, its waits, its resume.

Theory of operation.  A `ServerLink` owns one non-blocking socket that speaks
WebSocket (`aiovec._serve.wsclient` frames it).  Messages to send are queued
(`send`) and leave together, one frame per loop turn; every message that
arrives goes to the backend (``on_message``).  Two ways of waiting read the
same socket through the same handler:

- **through the loop**: the socket is registered with ``loop.add_reader``,
  and a vector env awaiting its backend's outcomes is woken by them;
- **parked**: while a blocking caller drives its coroutine by hand with its
  loop only marked as running (`parked`), nothing else can run on that
  loop, so a frame is written at once and the answer is waited for in a plain
  ``poll`` of this socket (`wait`): no task, no loop iteration per step.

Liveness: while requests are in flight, a silence of ``heartbeat`` seconds
sends a ``ping`` and one of three heartbeats drops the connection.  An idle
link (nothing in flight) sends nothing and is never dropped for its silence;
the server's kernel watches the socket meanwhile (keep-alive probes).

Resume: a connection that drops is dialled again (`_reconnect`, a task on the
loop, backing off up to a second between tries); its first frame takes the
group back by its token and carries every request still unanswered
(``again()``), which the server answers from what it kept.  Failing that
within the resume window, or told by the server that the sessions are gone,
the link is lost (``on_lost``) for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from aiovec._log import logger
from aiovec._serve import wsclient as ws
from aiovec._serve.protocol import PROTOCOL, HelloMsg, PingMsg, decode_server, encode

__all__ = ("ServerLink",)

_CHUNK = 1 << 20
_MAX_MESSAGE = 1 << 30


class ServerLink:
    """One connection to a server, resumed after a drop (see the module).

    Args:
        url: The server's ``ws://HOST:PORT``.
        token: The token it needs, if any.
        connect_timeout: Seconds a connection (and its handshake) may take.
        on_message: Called with each message that arrives.
        again: The messages to send again after a reconnect (the requests in flight).
        busy: Whether requests are in flight (silence then counts against the server).
        on_lost: Called once the connection cannot be resumed, with why.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        connect_timeout: float,
        *,
        on_message: Callable[[Any], None],
        again: Callable[[], list[Any]],
        busy: Callable[[], bool],
        on_lost: Callable[[Exception], None],
    ) -> None:
        ws.parse_url(url)
        self.url, self.token, self.connect_timeout = url, token, connect_timeout
        self._on_message, self._again, self._busy, self._on_lost = on_message, again, busy, on_lost
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._poll: Any = None
        self._buffer = bytearray(_CHUNK)  # what a read receives into
        self._view = memoryview(self._buffer)
        self._reader = ws.FrameReader(_MAX_MESSAGE)
        self._unsent = b""  # what the socket did not take yet
        self._out: list[Any] = []  # messages of this loop turn
        self._soon = False
        self._heard = self._pinged = time.monotonic()  # heard from the server; pinged it
        self._sent = 0.0  # a frame was written (a silence counts from then, or from _heard)
        self._beat: asyncio.TimerHandle | None = None
        self.heartbeat = 5.0
        self.resume_window = 60.0
        self.token_of_group: tuple[int, str] | None = None  # what a resume asks back
        self._reconnecting: asyncio.Task[None] | None = None
        self._ended: asyncio.Future[None] | None = None  # set once the server ended it
        self.closing = False
        self.lost = False
        self.reconnects = 0

    @property
    def parked(self) -> bool:
        """Whether the loop is parked: marked as running by a caller driving a call by hand.

        Nothing else can run on it then, so a wait that is all this link's own
        may be a plain ``poll`` (`wait`).  (The loop is this thread's running
        loop whenever the link is used: the backend belongs to it.)
        """
        return not self._loop.is_running()

    @property
    def up(self) -> bool:
        """Whether the connection is there (not dropped, not lost, not closed)."""
        return self._sock is not None

    # -- connecting ------------------------------------------------------------------------

    def connect_now(self) -> None:
        """Connect and shake hands, blocking (a constructor cannot wait on its loop)."""
        try:
            sock, rest = ws.connect_blocking(self.url, self.token, self.connect_timeout)
        except ws.HandshakeError as exc:
            raise _refused(self.url, exc) from None
        self._attach(sock, rest)

    async def connect(self) -> None:
        """Connect and shake hands through the loop."""
        try:
            sock, rest = await ws.connect_async(self.url, self.token, self.connect_timeout)
        except ws.HandshakeError as exc:
            raise _refused(self.url, exc) from None
        self._attach(sock, rest)

    def _attach(self, sock: socket.socket, rest: bytes) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._unsent = b""
        self._heard = time.monotonic()
        self._loop.add_reader(sock.fileno(), self._readable)
        if rest:
            self._received(memoryview(rest))

    # -- frames out ------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queue ``message``: it leaves with this loop turn's frame (at once, parked)."""
        self._out.append(message)
        if self.parked:  # nothing else could send it: at once
            self.flush()
        elif not self._soon:
            self._soon = True
            self._loop.call_soon(self.flush)
        if self._beat is None and self._sock is not None:
            self._beat = self._loop.call_later(self.heartbeat, self._heartbeat)

    def flush(self) -> None:
        """Write what is queued as one frame now (nothing while the connection is down)."""
        self._soon = False
        out, self._out = self._out, []
        if out and self._sock is not None:  # (else a reconnect sends what is in flight again)
            self._sent = time.monotonic()
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
            self.drop(f"writing failed: {exc}")
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
            self.drop(f"writing failed: {exc}")
            return
        self._unsent = self._unsent[sent:]
        if not self._unsent:
            self._loop.remove_writer(sock.fileno())

    # -- frames in -------------------------------------------------------------------------

    def wait(self, deadline: float | None) -> bool:
        """Wait in ``poll`` for the server (until ``deadline``, ``time.monotonic()``) and read.

        Only for a parked loop.  Returns ``False`` when it cannot wait here (the
        connection is down, or a write waits for room): the caller waits
        through the loop instead.  Heartbeats are kept up meanwhile.
        """
        if self._sock is None or self._unsent:
            return False
        due = self._due()
        until = due if deadline is None else min(deadline, due)
        events = self._poll.poll(max(0, math.ceil((until - time.monotonic()) * 1000)))
        if events:
            self._readable()
        elif time.monotonic() >= due:
            self._check_heard()
        return True

    def _due(self) -> float:
        """When the silence is next looked at: a heartbeat after the last news or ping."""
        return max(self._heard, self._sent, self._pinged) + self.heartbeat

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        buffer, view = self._buffer, self._view
        got = 0
        try:
            while True:  # into one buffer kept for the purpose: no allocation per read
                size = sock.recv_into(view[got:])
                if not size:
                    if got:
                        self._received(view[:got])
                    self.drop("the server closed the connection")
                    return
                got += size
                if got < len(buffer):
                    break
                self._received(view[:got])
                got = 0
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self.drop(f"reading failed: {exc}")
            return
        if got:
            self._received(view[:got])

    def _received(self, data: memoryview) -> None:
        self._heard = time.monotonic()
        try:
            for opcode, payload in self._reader.feed(data):
                if opcode == ws.BINARY:
                    for message in decode_server(payload):
                        self._on_message(message)
                elif opcode == ws.CLOSE:
                    self.drop(f"the server closed the connection ({ws.describe_close(payload)})")
                    return
                elif opcode == ws.PING and self._sock is not None:
                    self._write(ws.mask_frame(payload, ws.PONG))
        except ValueError as exc:  # the server's bytes make no sense: give up on it
            self.lose(
                ConnectionError(f"the aiovec server at {self.url} sent a malformed frame: {exc}")
            )

    # -- liveness ----------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        self._beat = None
        if self._sock is None or not self._busy():
            return  # idle: nothing to watch (the next request starts the beat again)
        if time.monotonic() >= self._due():
            self._check_heard()
        if self._sock is not None:
            later = max(0.0, self._due() - time.monotonic())
            self._beat = self._loop.call_later(later, self._heartbeat)

    def _check_heard(self) -> None:
        """A silence of three heartbeats drops the connection; of one, sends a ping."""
        now = time.monotonic()
        silent = now - max(self._heard, self._sent)
        if silent > 3 * self.heartbeat:
            self.drop(f"no answer to heartbeats for {3 * self.heartbeat:g} s")
        elif silent > self.heartbeat:
            self._pinged = now
            self._write(ws.mask_frame(encode([PingMsg(time.time())])))

    # -- drops, resume, loss -----------------------------------------------------------------

    def _detach(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(Exception):
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
        sock.close()
        self._poll = None
        self._unsent = b""
        self._reader = ws.FrameReader(_MAX_MESSAGE)

    def drop(self, reason: str) -> None:
        """The connection is gone: dial again and resume, unless closing or lost."""
        self._detach()
        ended = self._ended
        if ended is not None and not ended.done():
            ended.set_result(None)
        if self.closing or self.lost or self._reconnecting is not None:
            return
        if self.token_of_group is None:  # not open yet: nothing to resume
            self.lose(ConnectionError(f"the aiovec server at {self.url}: {reason}"))
            return
        logger.warning("aiovec: lost the connection to %s (%s); resuming", self.url, reason)
        self._reconnecting = self._loop.create_task(self._reconnect(reason))

    async def _reconnect(self, reason: str) -> None:
        until = time.monotonic() + self.resume_window
        delay = 0.005
        try:
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    self.lose(
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
                    self.lose(
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
        if self.closing:
            sock.close()
            return
        self.reconnects += 1
        self._out.clear()
        assert self.token_of_group is not None
        self._attach(sock, b"")
        self._write(
            ws.mask_frame(encode([HelloMsg(PROTOCOL, [self.token_of_group]), *self._again()]))
        )
        if rest:
            self._received(memoryview(rest))

    def lose(self, error: Exception) -> None:
        """The sessions are gone for good: tell the backend, once."""
        self._detach()
        if not self.lost:
            self.lost = True
            self._on_lost(error)

    @property
    def reconnecting(self) -> asyncio.Task[None] | None:
        """The reconnect in progress, if any."""
        return self._reconnecting

    # -- closing -----------------------------------------------------------------------------

    async def goodbye(self) -> None:
        """Send a close frame and wait (briefly) for the server to end the connection."""
        self.closing = True
        if self._sock is None:
            return
        self._ended = self._loop.create_future()
        self._write(ws.mask_frame(ws.close_payload(), ws.CLOSE))
        await asyncio.wait([self._ended], timeout=1.0)

    def close(self) -> None:
        """Drop the connection and every timer, now (the loop may be closed)."""
        self.closing = True
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


def _refused(url: str, exc: ws.HandshakeError) -> OSError:
    if exc.status == 401:
        return PermissionError(f"the aiovec server at {url} refused: {exc}")
    return exc
