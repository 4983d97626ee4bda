"""Framing of the messages between the parent and a worker process.

Each message is a payload preceded by its length (4 bytes, big-endian; a
length of ``-1`` announces an 8-byte length for messages of 2 GiB or more).
A payload is a pickle (a `pool.messages` value), or, for a whole group's
step, the fixed-size `WholeStep`: the only request of a lock-step step, which
names its number, its autoreset mode and two flags, and nothing else (the
actions and reset flags are in the step rows).  A pickle never starts with its
marker byte.  Pipes carry them in both directions: a pipe wakes a sleeping
reader faster than a socket, and the reader gets a whole small message in one
``read``.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any, NamedTuple

from gymnasium.vector import AutoresetMode

__all__ = (
    "READ_SIZE",
    "WHOLE",
    "Frames",
    "SharedFile",
    "WholeStep",
    "frame",
    "whole_frames",
    "write_all",
)

_HEADER = struct.Struct("!i")
_LONG_HEADER = struct.Struct("!Q")
READ_SIZE = 1 << 18


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front."""
    size = len(payload)
    if size >= 0x7FFFFFFF:
        return _HEADER.pack(-1) + _LONG_HEADER.pack(size) + payload
    return _HEADER.pack(size) + payload


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Frames:
    """Cuts the bytes read from a pipe into whole messages."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = bytearray()  # the start of a message not wholly read yet

    @property
    def partial(self) -> bool:
        """Whether the start of a message was read and its end was not."""
        return bool(self._partial)

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the messages that ``data`` completes."""
        if not self._partial and len(data) >= 4:  # usually: exactly one message
            (size,) = _HEADER.unpack_from(data)
            if len(data) == 4 + size:
                return [data[4:]]
        buffer = self._partial
        buffer += data
        out = []
        while len(buffer) >= 4:
            (size,) = _HEADER.unpack_from(buffer)
            start = 4
            if size == -1:
                if len(buffer) < 12:
                    break
                (size,) = _LONG_HEADER.unpack_from(buffer, 4)
                start = 12
            if len(buffer) < start + size:
                break
            out.append(bytes(buffer[start : start + size]))
            del buffer[: start + size]
        return out


class SharedFile:
    """A file descriptor handed to a worker process as it starts.

    Under ``fork`` the child inherits it; under ``spawn`` and ``forkserver``
    multiprocessing duplicates it into the child while starting it (the same
    mechanism that carries its ``multiprocessing.Array`` heaps).
    """

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_shared_file, (reduction.DupFd(self.fd),)


def _rebuild_shared_file(duplicate: Any) -> SharedFile:
    return SharedFile(duplicate.detach())


WHOLE = 0x53
"""The first byte of a `WholeStep` payload (b"S"); a pickle (protocol >= 2) starts with 0x80."""
MODES = tuple(mode.value for mode in AutoresetMode)  # by code
_MODE_CODES = {mode: code for code, mode in enumerate(MODES)}
_WHOLE_STEP = struct.Struct("!BqBB")  # WHOLE, seq, the autoreset mode's code, flags
_WHOLE_STEP_FRAMED = struct.Struct("!i" + _WHOLE_STEP.format[1:])
_STREAM, _TIMED = 1, 2  # the flags


class WholeStep(NamedTuple):
    """Step every env of the group, its actions and reset flags read from the step rows.

    ``stream`` and ``timed``: as `StepRequest`'s.
    """

    seq: int
    mode: str
    stream: bool = False
    timed: bool = False

    @staticmethod
    def frame(seq: int, mode: str, stream: bool = False, timed: bool = False) -> bytes:
        """The request ``WholeStep(seq, mode, stream, timed)``, framed (no tuple: a hot path)."""
        flags = (_STREAM if stream else 0) | (_TIMED if timed else 0)
        return _WHOLE_STEP_FRAMED.pack(_WHOLE_STEP.size, WHOLE, seq, _MODE_CODES[mode], flags)

    @classmethod
    def parse(cls, payload: bytes) -> WholeStep:
        """The request of a framed payload (its length header cut off)."""
        _, seq, mode, flags = _WHOLE_STEP.unpack(payload)
        return cls(seq, MODES[mode], bool(flags & _STREAM), bool(flags & _TIMED))


def whole_frames(mode: str, timed: bool) -> tuple[Callable[..., bytes], int, int]:
    """``(pack, code, flags)``: ``pack(seq, code, flags)`` frames the `WholeStep` ``seq``.

    Made once per mode; a step's hot path maps ``pack`` over its numbers (in C).
    """
    pack = functools.partial(_WHOLE_STEP_FRAMED.pack, _WHOLE_STEP.size, WHOLE)
    return pack, _MODE_CODES[mode], _TIMED if timed else 0
