"""What a test leaves behind: threads, child processes, fds, shared memory, tasks.

:class:`LeakCheck` takes a snapshot when a test starts and compares when it
ends.  Threads and child processes that are still winding down get a bounded
grace period (threads are joined, processes waited on through a pidfd: no
polling); anything still there after it (and after a garbage collection) is a
leak, described so that the test report says what leaked.

- **threads**: ``threading.enumerate()``;
- **child processes**: every process whose parent is this one (``/proc``),
  zombies included, since an unreaped child is a leak too.  The
  process-wide helpers of ``multiprocessing`` (the forkserver and the
  resource tracker, started once and kept by design) are not counted, nor
  are their fds;
- **fds**: ``/proc/self/fd`` with what each points to;
- **shared memory**: POSIX blocks this process created (``shm_open`` is
  watched while the check runs) that still exist in ``/dev/shm``, and any
  ``/dev/shm`` file newly mapped into this process and still mapped (blocks
  of other processes on the machine are not this test's business);
- **tasks** (:func:`pending_tasks`): tasks of an event loop other than the
  caller's.

Linux only (``/proc``); elsewhere the check reports nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import select
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

GRACE = 5.0  # seconds that threads and children get to end once the test is over
SHM_DIR = "/dev/shm"
SUPPORTED = sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd")


def _child_pids() -> set[int]:
    """Pids of this process's children: each thread's ``children`` file, else a /proc scan."""
    me = os.getpid()
    pids: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as listing:
                pids.update(int(pid) for pid in listing.read().split())
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: every process
        return {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}
    return pids


def children() -> dict[int, str]:
    """This process's children, zombies included: pid -> ``"(name) state S"``."""
    me = os.getpid()
    found: dict[int, str] = {}
    for pid in _child_pids():
        try:
            with open(f"/proc/{pid}/stat") as stat:
                text = stat.read()
        except OSError:  # it ended (and was reaped) meanwhile
            continue
        name, _, rest = text.partition(" (")[2].rpartition(") ")
        fields = rest.split()
        if len(fields) > 1 and int(fields[1]) == me:
            found[pid] = f"({name}) state {fields[0]}"
    return found


def open_fds() -> dict[int, str]:
    """This process's open fds: fd -> what it points to."""
    fds: dict[int, str] = {}
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone by now
            fds[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
    return fds


def mapped_shm() -> set[str]:
    """Names of ``/dev/shm`` files mapped into this process."""
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if path.startswith(SHM_DIR + "/"):
                names.add(path[len(SHM_DIR) + 1 :].removesuffix(" (deleted)"))
    return names


def _helpers() -> tuple[set[int], set[int]]:
    """Pids and fds of multiprocessing's process-wide helpers (kept by design)."""
    pids: set[int] = set()
    fds: set[int] = set()
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:
        server = forkserver._forkserver  # type: ignore[attr-defined]
        pids.add(getattr(server, "_forkserver_pid", None) or -1)
        fds.add(getattr(server, "_forkserver_alive_fd", None) or -1)
    tracker_module = sys.modules.get("multiprocessing.resource_tracker")
    if tracker_module is not None:
        tracker = tracker_module._resource_tracker  # type: ignore[attr-defined]
        pids.add(getattr(tracker, "_pid", None) or -1)
        fds.add(getattr(tracker, "_fd", None) or -1)
    return pids, fds


def _wait_for_exit(pid: int, until: float) -> None:
    """Wait (through a pidfd, no polling) until ``pid`` exits or ``until`` passes."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone already, or no pidfd here
        return
    try:
        select.select([pidfd], [], [], max(0.0, until - time.monotonic()))
    finally:
        os.close(pidfd)


@dataclass
class LeakCheck:
    """A snapshot of this process's resources, and the comparison with it later.

    Use :meth:`start` when the test begins and :meth:`finish` when it ends;
    :meth:`finish` returns a list of human-readable leaks (empty: none).
    """

    threads: set[threading.Thread] = field(default_factory=set)
    children: dict[int, str] = field(default_factory=dict)
    fds: dict[int, str] = field(default_factory=dict)
    shm_mapped: set[str] = field(default_factory=set)
    created_shm: set[str] = field(default_factory=set)
    grace: float = GRACE  # what finish() gives winding-down threads and processes
    _restore: list[tuple[Any, str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls) -> LeakCheck:
        """Take the snapshot (and start watching shared-memory creation)."""
        check = cls()
        if not SUPPORTED:
            return check
        check.threads = set(threading.enumerate())
        check.children = children()
        check.fds = open_fds()
        check.shm_mapped = mapped_shm()
        check._watch_shm_open()
        return check

    def _watch_shm_open(self) -> None:
        try:
            import _posixshmem
        except ImportError:
            return
        original = _posixshmem.shm_open
        created = self.created_shm

        def shm_open(path: str, flags: int, mode: int = 0o777) -> int:
            fd = original(path, flags, mode=mode)
            if flags & os.O_CREAT:
                created.add(path.lstrip("/"))
            return fd

        _posixshmem.shm_open = shm_open
        self._restore.append((_posixshmem, "shm_open", original))

    def finish(self, grace: float | None = None) -> list[str]:
        """Stop watching and describe everything left behind (after ``grace`` seconds at most)."""
        for owner, name, original in self._restore:
            setattr(owner, name, original)
        self._restore.clear()
        if not SUPPORTED:
            return []
        gc.collect()  # what nothing can reach is garbage, not a leak
        until = time.monotonic() + (self.grace if grace is None else grace)
        return [
            *self._left_threads(until),
            *self._left_children(until),
            *self._left_fds(),
            *self._left_shm(),
        ]

    def _left_threads(self, until: float) -> Iterator[str]:
        for thread in set(threading.enumerate()) - self.threads:
            thread.join(max(0.0, until - time.monotonic()))
            if thread.is_alive():
                yield f"thread {thread.name!r} (daemon={thread.daemon}) is still running"

    def _left_children(self, until: float) -> Iterator[str]:
        helpers, _ = _helpers()
        for pid in children().keys() - self.children.keys() - helpers:
            _wait_for_exit(pid, until)
        for pid, what in children().items():
            if pid not in self.children and pid not in helpers:
                yield f"child process {pid} {what} is still there"

    def _left_fds(self) -> Iterator[str]:
        _, helper_fds = _helpers()
        for fd, target in sorted(open_fds().items()):
            if fd not in helper_fds and self.fds.get(fd) != target:
                yield f"fd {fd} -> {target} is still open"

    def _left_shm(self) -> Iterator[str]:
        existing = set(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else set()
        for name in sorted(self.created_shm & existing):
            yield f"shared memory block /dev/shm/{name} was created and never unlinked"
        for name in sorted(mapped_shm() - self.shm_mapped):
            yield f"shared memory /dev/shm/{name} is still mapped"


def pending_tasks(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
    """Tasks of ``loop`` that have not finished, except the one running this call."""
    current = asyncio.current_task(loop) if loop.is_running() else None
    return [task for task in asyncio.all_tasks(loop) if task is not current]


@contextlib.contextmanager
def checking(grace: float = GRACE) -> Iterator[LeakCheck]:
    """``with checking(): ...`` raises ``AssertionError`` listing whatever the block leaked."""
    check = LeakCheck.start()
    check.grace = grace
    try:
        yield check
    finally:
        leaks = check.finish()
    assert not leaks, "leaked: " + "; ".join(leaks)
