"""Lean steps in flight, and a blocking caller's wait for their replies.

A lean step (`LeanStep`) is a whole step whose actions and reset flags are in
the shared buffer: one 11-byte request per worker, each expecting exactly the
clean `LeanReply` of its sequence number.  When the loop is parked (a
blocking caller), the parent waits for those replies by hand (`LeanSteps.wait`):
the newest request's worker first (it started last and usually ends last),
then the others' pipes are read before any wait.  One wake-up per step: a
parent woken early runs on some worker's core while that worker still steps
its envs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiovec.backends._messages import LeanReply, LeanStep
from aiovec.backends._process.link import Link
from aiovec.backends._process.reactor import Reactor
from aiovec.backends._table import WorkTable

__all__ = ("LeanSteps",)


class LeanSteps:
    """The lean requests in flight: ``(link, seq, the clean reply expected)``, oldest first."""

    __slots__ = ("inflight",)

    def __init__(self) -> None:
        self.inflight: list[tuple[Link, int, bytes]] = []

    def __bool__(self) -> bool:
        return bool(self.inflight)

    @staticmethod
    def frames(
        links: list[Link], last_seq: int, mode: str, timed: bool
    ) -> list[tuple[Link, int, bytes, bytes]]:
        """One lean request per link, numbered after ``last_seq``: ``(link, seq, frame, clean)``.

        Every request is made before any is written, so that the workers start
        together: a worker woken while the parent still works shares its core.
        """
        out = []
        for link in links:
            last_seq += 1
            frame = LeanStep.frame(last_seq, mode, timed=timed)
            out.append((link, last_seq, frame, LeanReply.frame(last_seq)))
        return out

    def take(self) -> list[tuple[Link, int, bytes]]:
        """The requests in flight, forgotten here (they go on in the general way)."""
        inflight, self.inflight = self.inflight, []
        return inflight

    def settle(self, table: WorkTable, started: list[float]) -> None:
        """Forget the requests in flight here: their envs wait on them in ``table`` now.

        Each env's state (its request, when it started) is written only when a
        lean step is not delivered whole by `wait`.
        """
        for link, seq, _ in self.take():
            request = table.requests.get(seq)
            if request is not None:
                group = link.group
                table.wait_on(request, group)
                started[group.start : group.stop] = [request.since] * len(group)

    def wait(
        self,
        requests: Mapping[int, Any],
        reactor: Reactor,
        deadline: float | None,
        done: list[tuple[int, Any]],
    ) -> tuple[Link, bytes] | None:
        """Wait for the clean replies, the newest request's first; each one taken into ``done``.

        Stops early at anything else: a request no longer whole (cancelled, or
        partly delivered), a death, the ``deadline``, or a reply with news,
        which is returned (``(link, data)``) for the general reading.
        """
        inflight = self.inflight
        if any(link.outbox for link, _, _ in inflight):  # a request still waits to be written
            return None
        for k, (link, seq, clean) in enumerate(reversed(inflight)):
            request = requests.get(seq)
            if request is None or request.partial or not link.alive or link.frames.partial:
                return None
            data = link.read() if k else None  # the newest first; the others have usually answered
            if data is None:
                if not reactor.wait_reply(link, deadline):  # a death, time up
                    return None
                data = link.read()
            if data != clean:
                return None if data is None else (link, data)
            done.append((seq, request))
        return None
