"""Where the parent waits on its worker processes: one table of descriptors, two ways to wait.

Each live worker (`Link`) contributes two entries to one table: its reply
pipe (readable: replies came) and its process sentinel (readable: it died).
The event loop watches that table (``loop.add_reader``), and so does a
blocking caller's parked wait (``poll`` on the same entries): a reply is read
and handed over, and a death reported, by the same two handlers whichever
waits.  A request that does not fit its pipe waits for room with
``loop.add_writer`` (or, without a loop, in `Link.flush_blocking`).

Writing never reads: a reply is only taken in by a wait.
"""

from __future__ import annotations

import asyncio
import math
import select
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiovec.backends._process.link import Link

__all__ = ("Reactor", "loop_parked")

Handler = Callable[[Link], None]


def loop_parked() -> bool:
    """Whether the running loop is marked as running but is not running.

    So it is while a caller drives a coroutine by hand (``coro.send``) with its
    loop only marked as this thread's running loop: nothing else can make
    progress until the coroutine suspends, so a wait that is all this
    backend's own (its pipes and sentinels) may be a plain blocking ``poll``.
    """
    return not asyncio.get_running_loop().is_running()


class Reactor:
    """Waits on the worker links of one backend and hands what comes to two callbacks.

    Args:
        links: The backend's links (the list itself: a replaced worker's new
            link is seen at once).
        on_data: Called with a link and the bytes read from its reply pipe
            (``b""``: the pipe is closed).
        on_exit: Called with a link whose process ended.
    """

    def __init__(
        self,
        links: list[Link],
        on_data: Callable[[Link, bytes], None],
        on_exit: Handler,
    ) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._links = links
        self._on_data = on_data
        self._on_exit = on_exit
        self._pollers: dict[Any, tuple[Any, dict[int, tuple[Handler, Link]]]] = {}
        self._reply_pollers: dict[Link, Any] = {}  # `wait_reply`'s, by link

    # -- the table ---------------------------------------------------------------------

    def _readable(self, link: Link) -> None:
        data = link.read()
        if data is not None:
            self._on_data(link, data)

    def _entries(self, link: Link, replies: bool = True) -> list[tuple[int, Handler]]:
        """``link``'s readers in the table: its sentinel, and its reply pipe if listened to."""
        entries: list[tuple[int, Handler]] = [(link.sentinel, self._on_exit)]
        if replies:
            entries.append((link.reply_fd, self._readable))
        return entries

    def _flush(self, link: Link) -> None:
        """``link``'s writer in the table, while a request waits for room in its pipe."""
        if not link.flush() and self.loop is not None:
            self.loop.remove_writer(link.request_fd)

    def changed(self) -> None:
        """A link died or was replaced: the parked waits' tables are made anew."""
        self._pollers.clear()
        self._reply_pollers.clear()

    # -- the event loop ----------------------------------------------------------------

    def attach(self) -> asyncio.AbstractEventLoop:
        """Watch every live link from the running loop (moving from another one)."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self.detach()
            self.loop = loop
            for link in self._links:
                if link.alive:
                    self.watch(link)
        return loop

    def watch(self, link: Link) -> None:
        loop = self.loop
        assert loop is not None
        for fd, handler in self._entries(link):
            loop.add_reader(fd, handler, link)
        if link.outbox:
            loop.add_writer(link.request_fd, self._flush, link)

    def unwatch(self, link: Link) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            for fd, _ in self._entries(link):
                loop.remove_reader(fd)
            loop.remove_writer(link.request_fd)

    def detach(self) -> None:
        for link in self._links:
            if link.alive:
                self.unwatch(link)
        self.loop = None

    # -- writing -----------------------------------------------------------------------

    def wait_to_write(self, link: Link) -> None:
        """A request waits in ``link``'s outbox: write it once the pipe has room.

        From the loop (a writer), or here and now without one (construction).
        """
        if self.loop is not None:
            self.loop.add_writer(link.request_fd, self._flush, link)
        else:
            link.flush_blocking()

    # -- a parked wait -----------------------------------------------------------------

    def _poller(self, awaited: Sequence[Link]) -> tuple[Any, dict[int, tuple[Handler, Link]]]:
        """A ``poll`` object on the table's entries: every sentinel, ``awaited``'s replies."""
        links = [link for link in self._links if link.alive]
        key = tuple((id(link), link in awaited, bool(link.outbox)) for link in links)
        found = self._pollers.get(key)
        if found is None:
            if len(self._pollers) > 64:  # outboxes that come and go with many workers
                self._pollers.clear()
            poller = select.poll()
            table: dict[int, tuple[Handler, Link]] = {}
            for link in links:
                for fd, handler in self._entries(link, replies=link in awaited):
                    poller.register(fd, select.POLLIN)
                    table[fd] = (handler, link)
                if link.outbox:  # no loop runs its writer: this wait does
                    poller.register(link.request_fd, select.POLLOUT)
                    table[link.request_fd] = (self._flush, link)
            found = self._pollers[key] = (poller, table)
        return found

    def wait(self, awaited: Sequence[Link], seconds: float | None) -> None:
        """Wait in ``poll`` (at most ``seconds``) and handle what came, deaths first."""
        poller, table = self._poller(awaited)
        events = poller.poll(None if seconds is None else math.ceil(seconds * 1000))
        if len(events) > 1:  # deaths first
            events.sort(key=lambda event: table[event[0]][0] != self._on_exit)
        for fd, _ in events:
            handler, link = table[fd]
            if link.alive:  # else seen dead by its sentinel just before
                handler(link)

    def wait_reply(self, link: Link, deadline: float | None) -> bool:
        """Wait in ``poll`` for ``link``'s reply alone; ``False`` on anything else.

        Only while no request waits for room in a pipe (no writer entries).

        A death (any sentinel) or the ``deadline`` (``time.monotonic()``) is left
        to the general wait, which handles it.
        """
        wait_ms = None
        if deadline is not None:
            wait_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        poller = self._reply_pollers.get(link)
        if poller is None:  # the table's entries for one awaited link, none with an outbox
            poller = self._reply_pollers[link] = self._poller((link,))[0]
        events = poller.poll(wait_ms)
        return len(events) == 1 and events[0][0] == link.reply_fd
