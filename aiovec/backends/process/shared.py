"""What the parent shares with its workers: two nameless files and one doorbell.

- The completion table (``table.py``) lives in a file of its own, sized when
  the backend starts (its size depends only on the numbers of envs and
  workers), so that every worker maps it as it starts.
- The step rows (`StepRows`: actions, observations, rewards and both flags of
  every env, laid out by the batched spaces, ``_core/layout.py``) live in
  another, sized and mapped once the first workers have reported the spaces.
- The doorbell (`Doorbell`) is an ``eventfd`` (a pipe where there is none):
  every worker rings it, the parent alone waits on it.

Each file is an anonymous ``memfd`` (an unlinked temporary file where there is
none), handed to each worker as it starts: nothing can be left in
``/dev/shm`` whatever dies, and no resource-tracker process is needed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from typing import Any

from aiovec._core.layout import Filler, StepArrays, StepLayout
from aiovec._core.ops import StepOp

__all__ = ("Doorbell", "StepRows", "nameless")


def nameless(name: str) -> int:
    """A new anonymous file's descriptor (a ``memfd``, or an unlinked temporary file)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name, os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as file:
        return os.dup(file.fileno())


def mapped(fd: int, size: int) -> mmap.mmap:
    """File ``fd`` sized to ``size`` bytes and mapped here."""
    os.ftruncate(fd, size)
    return mmap.mmap(fd, size)


class Doorbell:
    """One descriptor that every worker writes to (`ring_fd`) and the parent waits on (`fd`).

    An ``eventfd`` counts the rings, and one read takes them all; where there is
    none, a pipe (each ring a byte; a full pipe is rung already).  Both ends
    never block.
    """

    __slots__ = ("_pipe", "fd", "ring_fd")

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self.fd = self.ring_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._pipe = False
        else:
            self.fd, self.ring_fd = os.pipe()
            os.set_blocking(self.fd, False)
            os.set_blocking(self.ring_fd, False)
            self._pipe = True

    def clear(self) -> None:
        """Take the rings that came (the doorbell is silent again)."""
        try:
            while len(os.read(self.fd, 4096)) == 4096 and self._pipe:
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Close its descriptors."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if self._pipe:
            with contextlib.suppress(OSError):
                os.close(self.ring_fd)


class StepRows:
    """The step rows: an anonymous file, sized and mapped once the spaces are known."""

    def __init__(self) -> None:
        self.fd = nameless("aiovec-steps")
        self.layout: StepLayout | None = None
        self.map: mmap.mmap | None = None
        self.arrays: StepArrays | None = None
        self.fill: Filler | None = None  # actions into the rows, if they can be laid out

    def size(self, layout: StepLayout) -> StepArrays:
        """Size the file for ``layout`` and map it here."""
        self.map = mapped(self.fd, layout.nbytes)
        self.layout = layout
        self.arrays = arrays = layout.arrays(self.map)
        if layout.actions is not None:
            self.fill = layout.actions.filler(arrays.actions)
        return arrays

    def put_step(self, op: StepOp, rows: list[int] | None = None) -> bool:
        """Copy a step's batch of actions and reset flags into the rows (``None``: every row).

        Whether they fit: a batch the rows cannot carry exactly (or none, as
        where an autoreset has options) travels in the request instead.
        """
        fill, arrays = self.fill, self.arrays
        if fill is None or arrays is None or op.batch is None:
            return False
        if rows is None:
            if not fill(op.batch):
                return False
            arrays.resets[:] = op.reset_first
        else:
            if not fill(op.batch, rows):
                return False
            arrays.resets[rows] = op.reset_first
        return True

    def close(self) -> None:
        """Drop this process's mapping and descriptor (workers drop theirs on exit)."""
        self.arrays = None
        self.fill = None  # it writes through views of the map
        if self.map is not None:
            with contextlib.suppress(BufferError):  # views still alive: unmapped when collected
                self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def close_map(buffer: Any, fd: int) -> None:
    """Drop a mapping (if no view of it is alive) and its descriptor."""
    if buffer is not None:
        with contextlib.suppress(BufferError):
            buffer.close()
    with contextlib.suppress(OSError):
        os.close(fd)
