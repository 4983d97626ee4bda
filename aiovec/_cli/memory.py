"""Resident memory of this process and every process it started (Linux ``/proc``).

A backend's cost in memory is the sum over the processes it runs: worker
processes (and a forkserver, if one was started) are descendants of this
process, not part of its own RSS.  `tree_rss` walks ``/proc`` for the
descendants and adds their resident sets; `PeakMemory` keeps the largest
sum seen while it is sampled.  Where ``/proc`` does not exist the figures are
unknown (``None``), never guessed.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

__all__ = ("PeakMemory", "tree_rss")

_PROC = "/proc"


def _stat(pid: str) -> tuple[int, int]:
    """``(parent pid, resident pages)`` of one process, from ``/proc/PID/stat``."""
    with open(f"{_PROC}/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()  # the name may hold spaces and ')'
    return int(fields[1]), int(fields[21])  # fields 4 and 24 of proc(5)


def tree_rss(root: int | None = None) -> int | None:
    """Bytes resident in process ``root`` (default: this one) and all its descendants.

    Returns:
        The sum, or ``None`` where ``/proc`` is not available.
    """
    if not os.path.isdir(_PROC):
        return None
    children: defaultdict[int, list[int]] = defaultdict(list)
    pages: dict[int, int] = {}
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        try:
            parent, resident = _stat(entry)
        except (OSError, IndexError, ValueError):  # gone meanwhile, or unreadable
            continue
        children[parent].append(int(entry))
        pages[int(entry)] = resident
    todo, total = [os.getpid() if root is None else root], 0
    while todo:
        pid = todo.pop()
        total += pages.get(pid, 0)
        todo.extend(children[pid])
    return total * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The largest `tree_rss` seen, sampled at most every ``interval`` seconds.

    Args:
        interval: Seconds between samples taken by `maybe_sample`.
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak: int | None = None
        self._at = float("-inf")

    def sample(self) -> None:
        """Take a sample now."""
        self._at = time.monotonic()
        rss = tree_rss()
        if rss is not None:
            self.peak = rss if self.peak is None else max(self.peak, rss)

    def maybe_sample(self) -> None:
        """Take a sample if the last one is ``interval`` seconds old."""
        if time.monotonic() - self._at >= self.interval:
            self.sample()
