"""The client's side of a WebSocket (RFC 6455) over a plain socket: handshake and framing.

Pure parts (`handshake_request`, `parse_response`, `mask_frame`, `FrameReader`)
and two drivers of the handshake: `connect_blocking` (a vector env's
constructor, which cannot wait on its loop) and `connect_async` (a reconnect,
on the loop).  After the handshake the socket is non-blocking and the remote
backend reads and writes it through the event loop (``add_reader``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import struct
import time
from typing import Any
from urllib.parse import urlsplit

from aiohttp._websocket.helpers import websocket_mask

__all__ = (
    "BINARY",
    "CLOSE",
    "PING",
    "PONG",
    "FrameReader",
    "HandshakeError",
    "connect_async",
    "connect_blocking",
    "mask_frame",
    "parse_url",
)

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_HEADER = 16384


class HandshakeError(ConnectionError):
    """The server did not accept the WebSocket; ``status`` is its HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def parse_url(url: str) -> tuple[str, int, str]:
    """``(host, port, path)`` of a ``ws://host:port[/path]`` URL.

    Raises:
        ValueError: Not such a URL.
    """
    parts = urlsplit(url)
    if parts.scheme != "ws" or not parts.hostname:
        raise ValueError(f"expected a ws://HOST:PORT URL, got {url!r}")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ValueError(f"expected a ws://HOST:PORT URL, got {url!r}") from exc
    return parts.hostname, port, parts.path or "/"


def handshake_request(host: str, port: int, path: str, token: str | None) -> tuple[bytes, str]:
    """The HTTP upgrade request, and the ``Sec-WebSocket-Accept`` its answer must hold."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), accept


def parse_response(data: bytes, accept: str) -> bytes | None:
    """The bytes after a complete ``101`` answer in ``data``; ``None`` while incomplete.

    Raises:
        HandshakeError: The server refused (its status and body say why).
    """
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > _MAX_HEADER:
            raise HandshakeError("the server's answer to the WebSocket handshake is too long")
        return None
    head = data[:end].decode("latin-1").split("\r\n")
    try:
        status = int(head[0].split()[1])
    except (IndexError, ValueError):
        raise HandshakeError(f"not an HTTP answer: {head[0]!r}") from None
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    rest = data[end + 4 :]
    if status != 101:
        length = int(headers.get("content-length", "0") or 0)
        if len(rest) < length:
            return None
        body = rest[:length].decode("utf-8", "replace").strip()
        raise HandshakeError(f"the server refused the connection ({status}): {body}", status)
    if headers.get("sec-websocket-accept") != accept:
        raise HandshakeError("the server's WebSocket handshake is not valid (a wrong accept key)")
    return rest


class _Answer:
    """The server's answer to the handshake, read chunk by chunk (`parse_response`)."""

    __slots__ = ("_accept", "_data")

    def __init__(self, accept: str) -> None:
        self._accept, self._data = accept, b""

    def feed(self, chunk: bytes) -> bytes | None:
        """The bytes after the complete answer, once it is (``None`` until then).

        Raises:
            HandshakeError: The server refused, or closed the connection (``chunk`` empty).
        """
        if not chunk:
            raise HandshakeError("the server closed the connection during the handshake")
        self._data += chunk
        return parse_response(self._data, self._accept)


def connect_blocking(url: str, token: str | None, timeout: float) -> tuple[socket.socket, bytes]:
    """Connect and shake hands, blocking (at most ``timeout`` s); the socket and bytes read ahead.

    Raises:
        OSError: The connection failed (`HandshakeError`: the server refused it).
    """
    host, port, path = parse_url(url)
    until = time.monotonic() + timeout
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        _tune(sock)
        request, accept = handshake_request(host, port, path, token)
        sock.sendall(request)
        answer, rest = _Answer(accept), None
        while rest is None:
            sock.settimeout(max(0.001, until - time.monotonic()))
            rest = answer.feed(sock.recv(65536))
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock, rest


async def connect_async(
    url: str,
    token: str | None,
    timeout: float,  # noqa: ASYNC109  (a connect and handshake: the bound of both)
) -> tuple[socket.socket, bytes]:
    """`connect_blocking` on the running loop (a reconnect)."""
    host, port, path = parse_url(url)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            _tune(sock)
            request, accept = handshake_request(host, port, path, token)
            await loop.sock_sendall(sock, request)
            answer, rest = _Answer(accept), None
            while rest is None:
                rest = answer.feed(await loop.sock_recv(sock, 65536))
        except BaseException:
            sock.close()
            raise
    return sock, rest


def _tune(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def mask_frame(payload: bytes, opcode: int = BINARY) -> bytes:
    """One client frame (FIN set), masked with a random key as RFC 6455 requires."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    key = _KEYS.take()
    data = bytearray(payload)
    websocket_mask(key, data)  # aiohttp's (in C), in place
    return head + key + data


class _Keys:
    """Masking keys: 4 bytes each, from the OS's random source, fetched 4 KiB at a time."""

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool, self._at = b"", 0

    def take(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(4096), 0
        self._at = at + 4
        return self._pool[at : at + 4]


_KEYS = _Keys()


class FrameReader:
    """Server frames (never masked) out of a byte stream: ``(opcode, payload)`` messages.

    Fragmented messages are joined; a control frame may come between fragments.
    """

    __slots__ = ("_buffer", "_fragments", "_kind", "max_size")

    def __init__(self, max_size: int) -> None:
        self._buffer = bytearray()
        self._fragments: list[bytes] = []
        self._kind = 0
        self.max_size = max_size

    def feed(self, data: bytes | memoryview) -> list[tuple[int, bytes]]:
        """The complete messages once ``data`` is added.

        Raises:
            ValueError: A frame is malformed or over ``max_size``.
        """
        buffer = self._buffer
        buffer += data
        out: list[tuple[int, bytes]] = []
        start = 0
        while True:
            frame = self._frame(buffer, start)
            if frame is None:
                break
            fin, opcode, payload, start = frame
            message = self._message(fin, opcode, payload)
            if message is not None:
                out.append(message)
        if start:
            del buffer[:start]
        return out

    def _frame(self, buffer: bytearray, start: int) -> tuple[bool, int, bytes, int] | None:
        if len(buffer) - start < 2:
            return None
        first, second = buffer[start], buffer[start + 1]
        if second & 0x80:
            raise ValueError("a masked frame from the server")
        length, at = second & 0x7F, start + 2
        if length == 126:
            if len(buffer) - at < 2:
                return None
            (length,) = struct.unpack_from("!H", buffer, at)
            at += 2
        elif length == 127:
            if len(buffer) - at < 8:
                return None
            (length,) = struct.unpack_from("!Q", buffer, at)
            at += 8
        if length > self.max_size:
            raise ValueError(f"a frame of {length} bytes (the limit is {self.max_size})")
        if len(buffer) - at < length:
            return None
        return bool(first & 0x80), first & 0x0F, bytes(buffer[at : at + length]), at + length

    def _message(self, fin: bool, opcode: int, payload: bytes) -> tuple[int, bytes] | None:
        if opcode >= CLOSE:  # control frames are never fragmented
            return opcode, payload
        if opcode != CONTINUATION:
            self._kind, self._fragments = opcode, []
        self._fragments.append(payload)
        if not fin:
            if sum(map(len, self._fragments)) > self.max_size:
                raise ValueError(f"a message over {self.max_size} bytes")
            return None
        whole = self._fragments[0] if len(self._fragments) == 1 else b"".join(self._fragments)
        self._fragments = []
        return self._kind, whole


def close_payload(code: int = 1000, reason: str = "") -> bytes:
    """The payload of a close frame."""
    return struct.pack("!H", code) + reason.encode()[:120]


def describe_close(payload: Any) -> str:
    """What a close frame's payload says (its code and reason)."""
    if len(payload) < 2:
        return "no reason given"
    (code,) = struct.unpack_from("!H", payload)
    reason = bytes(payload[2:]).decode("utf-8", "replace")
    return f"code {code}" + (f": {reason}" if reason else "")
