"""The step buffer shared by the parent and every worker process.

Actions, observations, rewards and both flags of every env live in one
buffer laid out by the batched spaces (``_core/layout.py``).  It is an
anonymous ``memfd`` (an unlinked temporary file where there is none), handed
to each worker as it starts and mapped once the first workers have reported
the spaces: nothing can be left in ``/dev/shm`` whatever dies, and no
resource-tracker process is needed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile

from aiovec._core.layout import Filler, StepArrays, StepLayout
from aiovec._core.ops import StepOp
from aiovec._errors import WorkerDiedError
from aiovec.backends._messages import Attach, AttachReply
from aiovec.backends._process.link import Link, framed

__all__ = ("SharedBuffer",)


class SharedBuffer:
    """The step buffer: an anonymous file, sized and mapped once the spaces are known."""

    def __init__(self) -> None:
        if hasattr(os, "memfd_create"):
            self.fd = os.memfd_create("aiovec-steps", os.MFD_CLOEXEC)
        else:  # an unlinked temporary file: just as nameless
            with tempfile.TemporaryFile() as file:
                self.fd = os.dup(file.fileno())
        self.layout: StepLayout | None = None
        self.map: mmap.mmap | None = None
        self.arrays: StepArrays | None = None
        self.fill: Filler | None = None  # actions into the buffer, if they can be laid out

    def size(self, layout: StepLayout) -> StepArrays:
        """Size the file for ``layout`` and map it here."""
        os.ftruncate(self.fd, layout.nbytes)
        self.map = mmap.mmap(self.fd, layout.nbytes)
        self.layout = layout
        self.arrays = layout.arrays(self.map)
        return self.arrays

    def share(self, layout: StepLayout, links: list[Link], last_seq: int) -> None:
        """Size the file for ``layout``, map it here and in every worker.

        Construction has no loop: each worker's answer is waited for here.  The
        `Attach` requests are numbered after ``last_seq``.
        """
        arrays = self.size(layout)
        for k, link in enumerate(links, start=last_seq + 1):
            try:
                attached = link.ask_blocking(framed(Attach(k, layout)))
            except (EOFError, OSError):
                link.process.join(1.0)
                died = link.death()
                raise WorkerDiedError(dict.fromkeys(link.group, died), "setup") from died
            assert isinstance(attached, AttachReply)
            if attached.error is not None:
                raise attached.error
        if layout.actions is not None:
            self.fill = layout.actions.filler(arrays.actions)

    def put_step(self, op: StepOp, rows: list[int] | None = None) -> bool:
        """Copy a step's batch of actions and reset flags into the rows (``None``: every row).

        Whether they fit: a batch the buffer cannot carry exactly (or none, as
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
        if self.map is not None:
            with contextlib.suppress(BufferError):  # views still alive: unmapped when collected
                self.map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
