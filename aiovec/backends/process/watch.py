"""Where the parent waits on its workers: one doorbell and their deaths, two ways to wait.

The table of what is watched: the doorbell (readable: a worker rang), each
live worker's process sentinel (readable: it died), and the request pipe of a
worker whose request waits for room.  The event loop watches it (one
``loop.add_reader`` for the doorbell, whatever the number of workers, and one
per sentinel, which only a death wakes), and so does a blocking caller's
parked wait (`Watch.wait`: one ``poll`` on the same entries).  A ring and a
death are handled by the same handlers whichever waits.

Writing never reads: an outcome is only taken in by a wait (or a look).
"""

from __future__ import annotations

import asyncio
import math
import os
import select
from collections.abc import Callable
from typing import Any

from aiovec.backends.process.link import Link
from aiovec.backends.process.shared import Doorbell

__all__ = ("Watch", "loop_parked")


def loop_parked() -> bool:
    """Whether the running loop is marked as running but is not running.

    So it is while a caller drives a coroutine by hand (``coro.send``) with its
    loop only marked as this thread's running loop: nothing else can make
    progress until the coroutine suspends, so a wait that is all this
    backend's own (its doorbell and sentinels) may be a plain blocking ``poll``.
    """
    return not asyncio.get_running_loop().is_running()


class Watch:
    """Watches the doorbell and the workers of one backend; hands what comes to two handlers.

    Args:
        bell: The doorbell.
        links: The backend's links (the list itself: a replaced worker's new
            link is seen at once).
        on_ring: Called when the doorbell rang (from the loop; a parked wait
            clears the doorbell itself and looks).
        on_exit: Called with a link whose process ended.
    """

    def __init__(
        self,
        bell: Doorbell,
        links: list[Link],
        on_ring: Callable[[], None],
        on_exit: Callable[[Link], None],
    ) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._bell = bell
        self._links = links
        self._on_ring = on_ring
        self._on_exit = on_exit
        self._poller: tuple[Any, Any] | None = None  # (key, poll object) of the parked wait

    # -- the event loop ----------------------------------------------------------------

    def attach(self) -> asyncio.AbstractEventLoop:
        """Watch from the running loop (moving from another one)."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self.detach()
            self.loop = loop
            loop.add_reader(self._bell.fd, self._on_ring)
            for link in self._links:
                if link.alive:
                    self.watch(link)
        return loop

    def watch(self, link: Link) -> None:
        """Watch ``link``'s death (and its request waiting for room) from the loop."""
        self._poller = None
        loop = self.loop
        if loop is None:
            return
        loop.add_reader(link.sentinel, self._on_exit, link)
        if link.outbox:
            loop.add_writer(link.request_fd, self._flush, link)

    def unwatch(self, link: Link) -> None:
        """Stop watching ``link`` (it died, or the loop is left)."""
        self._poller = None
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(link.sentinel)
            loop.remove_writer(link.request_fd)

    def detach(self) -> None:
        """Stop watching from the loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._bell.fd)
            for link in self._links:
                if link.alive:
                    self.unwatch(link)
        self.loop = None

    # -- writing -----------------------------------------------------------------------

    def _flush(self, link: Link) -> None:
        if not link.flush():
            self._poller = None
            if self.loop is not None:
                self.loop.remove_writer(link.request_fd)

    def wait_to_write(self, link: Link) -> None:
        """A request waits in ``link``'s outbox: write it once the pipe has room.

        From the loop (a writer), by a parked wait, or here and now without a
        loop (construction).
        """
        self._poller = None
        if self.loop is not None:
            self.loop.add_writer(link.request_fd, self._flush, link)
        else:
            link.flush_blocking()

    # -- a parked wait -----------------------------------------------------------------

    def wait(self, seconds: float | None) -> bool:
        """Wait in ``poll`` (at most ``seconds``) for a ring, a death or room; handle them.

        A ring is cleared here (the caller looks at the table itself), a death is
        handed over.  Returns whether the doorbell alone rang.
        """
        poller, table = self._poller or self._table()
        events = poller.poll(None if seconds is None else math.ceil(seconds * 1000))
        if len(events) == 1 and events[0][0] == self._bell.fd:
            try:  # noqa: SIM105  (`Doorbell.clear`, inline: the hot path)
                os.read(self._bell.fd, 4096)
            except BlockingIOError:
                pass
            return True
        for fd, _ in events:
            what, link = table[fd]
            if what == "bell":
                self._bell.clear()
            elif link.alive:
                if what == "exit":
                    self._on_exit(link)
                else:
                    self._flush(link)
        return False

    def _table(self) -> tuple[Any, dict[int, tuple[str, Any]]]:
        """The ``poll`` object on every entry, kept while the entries stay the same."""
        found = self._poller
        if found is not None:
            return found
        poller = select.poll()
        table: dict[int, tuple[str, Any]] = {self._bell.fd: ("bell", None)}
        poller.register(self._bell.fd, select.POLLIN)
        for link in self._links:
            if link.alive:
                poller.register(link.sentinel, select.POLLIN)
                table[link.sentinel] = ("exit", link)
                if link.outbox:  # no loop runs its writer: this wait does
                    poller.register(link.request_fd, select.POLLOUT)
                    table[link.request_fd] = ("write", link)
        self._poller = (poller, table)
        return self._poller

    def changed(self) -> None:
        """A link died, was replaced, or has a request waiting: the parked wait's table anew."""
        self._poller = None
