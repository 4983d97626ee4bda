"""The completion table: how a worker process tells the parent that envs are done.

Theory of operation.  One small shared-memory block per vector env holds, per
env, a *request* number and a *done* number, and per worker two counters; the
step data itself (actions, observations, rewards, flags) lives beside it in the
step rows (``_core/layout.py``).  Who writes what:

- the parent writes ``req[i]`` (the number of the request env ``i`` waits on,
  0 when it waits on none) and ``wake_at`` (how many completions, counted over
  all workers, it sleeps until);
- worker ``w`` writes ``done[i]`` for its own envs (``seq``: env ``i`` finished
  request ``seq``, every result in the step rows; ``-seq``: it finished, and
  what the rows cannot hold, its info, its error, its reply to a call, is in a
  message the worker wrote to its reply pipe *before*), ``ready[w]`` (how many
  completions it has published, ever) and ``notes[w]`` (how many messages it
  has started to write, ever).

A worker publishes envs in this order: rows, then ``done``, then ``ready``, then
it reads the ``ready`` of every worker and ``wake_at``, and rings the parent's
one doorbell (`Doorbell`) only if the total has reached ``wake_at`` (and it has
not rung for that ``wake_at`` yet): the last worker to finish a whole step
rings, and the others, which finished before the total got there, do not (two
that finish at the same instant may both ring: the parent then wakes once or
twice, never zero times).  The parent arms the doorbell (`arm`) by writing
``wake_at`` and then reading the total itself: if that total is there already
it does not sleep.  Each side puts a full fence between its write and its
read (`fence`), so at least one of them sees the other's write: either the
parent sees the total and does not sleep, or the worker whose completion
brought the total there sees ``wake_at`` and rings.  The same fences keep the
order rows, marks, count as others see it (x86 keeps it anyway; ARM may not):
a worker fences before its marks, and the parent after reading them, before
it reads the rows they point to.  No lock is shared across processes: a worker
killed at any instant leaves at worst envs whose ``done`` was not written (they
fail with their worker) or a doorbell not rung (the parent watches every
worker's death as well).

The parent finds the envs that are done with one numpy comparison
(`finished`): ``done == req`` (clean) and ``done == -req`` (a message to read).
Any other value is *stale*: the late completion of a call the parent
abandoned; it is never taken for the current one, because each request has a
number of its own.  Sequence numbers only grow, so a late completion can also
tell the parent that an abandoned call has ended (`ended`).

A wake threshold counts completions, not envs: stale completions count too,
and so may wake the parent early; it then looks, finds fewer than it wants,
and arms again.  An early wake costs a look; a missed one would cost a hang,
and the rule above never misses: every completion counted in the total the
parent read before looking has its ``done`` visible when it looks.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ("BLANK", "FENCE", "NEVER", "CompletionTable", "fence")

_LINE = 64  # bytes: each worker's counters on a cache line of their own
_STRIDE = _LINE // 8  # int64s per line
NEVER = np.iinfo(np.int64).max
"""``wake_at`` when the parent does not sleep on the doorbell: no completion rings it."""
BLANK = np.iinfo(np.int64).min
"""``done`` of an env that never finished a request: neither a number nor its negation."""

FENCE = threading.Lock()
"""The lock `fence` releases and takes again (held, never contended): its hot paths inline it."""
FENCE.acquire()


def fence() -> None:
    """A full memory fence: the writes before it are seen by others before the reads after it.

    Releasing then acquiring a lock (a POSIX semaphore or an atomic word,
    whatever the interpreter uses) goes through atomic read-modify-write
    instructions, which fence on x86 and order release-then-acquire on ARM.
    This lock is this process's own, never shared and never contended.
    """
    FENCE.release()
    FENCE.acquire()


class CompletionTable:
    """The completion table of ``num_envs`` envs on ``num_workers`` workers, over ``buffer``.

    ``buffer`` is shared memory (a mapped ``memfd``) in the parent and every
    worker, or any writable buffer of `nbytes` bytes in a test.  A new table is
    *blank*: no env waits, none is done, nothing armed (`blank`).
    """

    __slots__ = ("counts", "done", "notes", "num_envs", "ready", "req", "rung", "wake", "words")

    def __init__(self, buffer: Any, num_envs: int, num_workers: int) -> None:
        lines = 1 + 2 * num_workers  # wake_at, then each worker's ready, then its notes
        words = np.ndarray((lines * _STRIDE + 2 * num_envs,), np.int64, buffer=buffer)
        self.num_envs = num_envs
        self.wake = words[0:1]  # wake_at, alone on its line
        end = _STRIDE + num_workers * _STRIDE
        self.ready = words[_STRIDE:end:_STRIDE]
        self.notes = words[end : end + num_workers * _STRIDE : _STRIDE]
        start = lines * _STRIDE
        self.req = words[start : start + num_envs]
        self.done = words[start + num_envs : start + 2 * num_envs]
        self.rung = -1  # (a worker's) the ``wake_at`` it rang for last
        # The same words, for the single ones: a memoryview item costs a tenth of numpy's.
        self.words = memoryview(words.data).cast("B").cast("q")  # words[0] is wake_at
        self.counts = self.words[_STRIDE:end:_STRIDE]  # each worker's ready

    @staticmethod
    def nbytes(num_envs: int, num_workers: int) -> int:
        """The size of a table of ``num_envs`` envs on ``num_workers`` workers."""
        return ((1 + 2 * num_workers) * _STRIDE + 2 * num_envs) * 8

    def blank(self) -> None:
        """No env waits (``req`` 0) and none is done (``done`` `BLANK`)."""
        self.req[:] = 0
        self.done[:] = BLANK
        self.ready[:] = 0
        self.notes[:] = 0
        self.wake[0] = NEVER

    # -- the parent's side -------------------------------------------------------------

    def total(self) -> int:
        """Completions published so far, by every worker (read before looking at ``done``)."""
        return sum(self.counts)

    def arm(self, seen: int, need: int) -> bool:
        """Ring once ``need`` completions come after the ``seen`` of the last look.

        Returns whether they have come already (then nothing will ring for
        them: look again instead of sleeping).
        """
        self.words[0] = seen + need
        FENCE.release()  # (`fence`)
        FENCE.acquire()
        return sum(self.counts) >= seen + need

    def disarm(self) -> None:
        """Nothing rings the doorbell until the next `arm`."""
        self.words[0] = NEVER

    def finished(self, rows: Any = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Which envs of ``rows`` are done with their request: clean, and with a message.

        Their rows may be read after this: the marks were read before them (`fence`).
        """
        req, done = self.req[rows], self.done[rows]
        clean, told = done == req, done == -req
        FENCE.release()  # (`fence`, ARM): the marks before the rows
        FENCE.acquire()
        return clean, told

    def ended(self, i: int, seq: int) -> bool:
        """Whether env ``i``'s worker is done with request ``seq`` (or a later one) of it."""
        return abs(int(self.done[i])) >= seq

    # -- a worker's side ---------------------------------------------------------------

    def publish(self, w: int, rows: Any, marks: Any, count: int) -> bool:
        """Worker ``w``: ``count`` envs ``rows`` are done (``marks``: each one's ``done``).

        Their step rows (and the message of those marked ``-seq``) were written
        before.  Returns whether this worker must ring the doorbell: the total
        has reached ``wake_at``, which it has not rung for yet.
        """
        FENCE.release()  # (`fence`, ARM): the rows before the marks
        FENCE.acquire()
        self.done[rows] = marks
        FENCE.release()  # (`fence`, ARM): the marks before the count
        FENCE.acquire()
        counts = self.counts
        counts[w] += count
        FENCE.release()  # (`fence`): the count before the reads (the parent arms, then reads)
        FENCE.acquire()
        total = sum(counts)
        wake = self.words[0]
        if total < wake or wake == self.rung:
            return False
        self.rung = wake
        return True

    def note(self, w: int) -> None:
        """Worker ``w`` wrote a message no env's ``done`` points to, or waits to write one.

        A reply to a control request (counted once it is in the pipe), or a
        message that waits for room in the pipe: the parent reads the pipe
        once it sees ``notes[w]`` move.
        """
        self.notes[w] += 1
