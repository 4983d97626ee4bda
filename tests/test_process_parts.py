"""The process transport's parts driven directly: `LeanSteps` and `Reactor`.

No worker process: each "worker" is a `PipeLink`, what the parts use of a
`Link` over plain pipes (its reply pipe, and a sentinel pipe whose write end is
closed when it "dies").  The vector env's behaviour over real workers is
tested in ``test_process.py`` and ``tests/faults``; these tests pin each part's
own rules.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from gymnasium.vector import AutoresetMode

from aiovec._core.ops import StepOp
from aiovec.backends._messages import LeanReply, LeanStep
from aiovec.backends._process.lean import LeanSteps
from aiovec.backends._process.reactor import Reactor, loop_parked
from aiovec.backends._table import WorkTable

pytestmark = pytest.mark.skipif(not hasattr(select, "poll"), reason="poll: POSIX only")

GROUPS = [range(0, 2), range(2, 4)]


class PipeLink:
    """What `LeanSteps` and `Reactor` use of a `Link`, over pipes and without a process."""

    def __init__(self, group: range) -> None:
        self.group = group
        self.alive = True
        self.outbox = bytearray()
        self.frames = SimpleNamespace(partial=False)
        self.reply_fd, self._reply_w = os.pipe()
        self.sentinel, self._sentinel_w = os.pipe()  # readable (end of file) once "dead"
        self._request_r, self.request_fd = os.pipe()
        os.set_blocking(self.reply_fd, False)

    def read(self) -> bytes | None:
        try:
            return os.read(self.reply_fd, 1 << 16)
        except BlockingIOError:
            return None

    def reply(self, data: bytes) -> None:
        os.write(self._reply_w, data)

    def die(self) -> None:
        os.close(self._sentinel_w)
        self._sentinel_w = -1

    def close(self) -> None:
        fds = (self.reply_fd, self._reply_w, self.sentinel, self._sentinel_w)
        for fd in (*fds, self._request_r, self.request_fd):
            if fd >= 0:
                os.close(fd)


@pytest.fixture
def links() -> Iterator[list[PipeLink]]:
    made = [PipeLink(group) for group in GROUPS]
    yield made
    for link in made:
        link.close()


def reactor_of(links: list[Any]) -> tuple[Reactor, list[tuple[str, Any, Any]]]:
    """A reactor over ``links`` that records what it hands over, in order."""
    seen: list[tuple[str, Any, Any]] = []
    reactor = Reactor(
        links,
        lambda link, data: seen.append(("data", link, data)),
        lambda link: seen.append(("exit", link, None)),
    )
    return reactor, seen


def lean_step(links: list[Any], table: WorkTable) -> tuple[LeanSteps, list[Any]]:
    """A lean step in flight on every link (requests tracked in ``table``, numbered 1, 2)."""
    lean = LeanSteps()
    op = StepOp(AutoresetMode.NEXT_STEP, [0] * 4, [False] * 4)
    out = LeanSteps.frames(links, 0, op.mode.value, False)
    requests = []
    for link, seq, _, clean in out:
        request = table.track(link, link.group, 1.5 * seq, op)
        table.requests[seq] = request
        lean.inflight.append((link, seq, clean))
        requests.append(request)
    return lean, requests


# -- LeanSteps -----------------------------------------------------------------------------


def test_frames_number_the_requests_after_the_last_and_expect_their_clean_replies(links):
    out = LeanSteps.frames(links, 7, "NextStep", True)
    assert [(link, seq) for link, seq, _, _ in out] == [(links[0], 8), (links[1], 9)]
    assert [frame for _, _, frame, _ in out] == [
        LeanStep.frame(8, "NextStep", timed=True),
        LeanStep.frame(9, "NextStep", timed=True),
    ]
    assert [clean for _, _, _, clean in out] == [LeanReply.frame(8), LeanReply.frame(9)]


def test_wait_takes_every_clean_reply_the_newest_first(links):
    table = WorkTable(list(GROUPS), True, lambda: None)
    lean, requests = lean_step(links, table)
    links[0].reply(LeanReply.frame(1))
    links[1].reply(LeanReply.frame(2))
    reactor, seen = reactor_of(links)
    done: list[Any] = []
    assert lean.wait(table.requests, reactor, None, done) is None
    assert done == [(2, requests[1]), (1, requests[0])]
    assert seen == []  # nothing for the general reading
    assert table.waiting_on == [None] * 4  # no env's state was written


def test_wait_hands_a_reply_with_news_to_the_general_reading(links):
    table = WorkTable(list(GROUPS), True, lambda: None)
    lean, requests = lean_step(links, table)
    links[1].reply(LeanReply.frame(2))
    links[0].reply(b"news")
    done: list[Any] = []
    news = lean.wait(table.requests, reactor_of(links)[0], None, done)
    assert news == (links[0], b"news")
    assert done == [(2, requests[1])]


def test_wait_stops_at_a_request_no_longer_whole_or_a_dead_worker(links):
    table = WorkTable(list(GROUPS), True, lambda: None)
    lean, requests = lean_step(links, table)
    requests[1].partial = True  # e.g. cancelled
    done: list[Any] = []
    assert lean.wait(table.requests, reactor_of(links)[0], None, done) is None
    assert done == []
    requests[1].partial = False
    links[1].alive = False
    assert lean.wait(table.requests, reactor_of(links)[0], None, done) is None
    assert done == []


def test_wait_stops_at_the_deadline_or_a_death_without_reading_them(links):
    table = WorkTable(list(GROUPS), True, lambda: None)
    lean, _ = lean_step(links, table)
    reactor, seen = reactor_of(links)
    done: list[Any] = []
    start = time.monotonic()
    assert lean.wait(table.requests, reactor, start + 0.05, done) is None
    assert time.monotonic() - start >= 0.05
    links[0].die()  # an older worker's death wakes the wait for the newest's reply
    assert lean.wait(table.requests, reactor, None, done) is None
    assert done == []
    assert seen == []  # a death is the general wait's to report


def test_settle_writes_each_env_s_state_once_a_lean_step_goes_the_general_way(links):
    table = WorkTable(list(GROUPS), True, lambda: None)
    lean, requests = lean_step(links, table)
    started = [0.0] * 4
    lean.settle(table, started)
    assert not lean
    assert table.waiting_on == [requests[0]] * 2 + [requests[1]] * 2
    assert started == [1.5, 1.5, 3.0, 3.0]
    lean.settle(table, started)  # nothing in flight any more: nothing written
    assert table.waiting_on == [requests[0]] * 2 + [requests[1]] * 2


# -- Reactor -------------------------------------------------------------------------------


def test_a_parked_wait_hands_over_replies_and_deaths_deaths_first(links):
    reactor, seen = reactor_of(links)
    links[0].reply(b"hello")
    links[1].die()
    reactor.wait(links, None)
    assert seen == [("exit", links[1], None), ("data", links[0], b"hello")]


def test_a_parked_wait_listens_to_the_replies_of_the_awaited_links_only(links):
    reactor, seen = reactor_of(links)
    links[0].reply(b"early")
    reactor.wait([links[1]], 0.02)  # link 0's reply is not listened to: time runs out
    assert seen == []
    links[1].die()  # but every sentinel is
    reactor.wait([links[1]], None)
    assert seen == [("exit", links[1], None)]


def test_wait_reply_says_whether_that_link_s_reply_came(links):
    reactor, seen = reactor_of(links)
    assert not reactor.wait_reply(links[0], time.monotonic() + 0.02)  # time up
    links[1].reply(b"other")  # another link's reply does not end it
    assert not reactor.wait_reply(links[0], time.monotonic() + 0.02)
    links[0].reply(b"mine")
    assert reactor.wait_reply(links[0], None)
    links[1].die()  # the reply and a death: left to the general wait
    assert not reactor.wait_reply(links[0], None)
    assert seen == []  # it reads nothing and reports nothing itself


def test_wait_reply_is_ended_by_a_death():
    link, other = PipeLink(GROUPS[0]), PipeLink(GROUPS[1])
    try:
        reactor, _ = reactor_of([link, other])
        other.die()
        assert not reactor.wait_reply(link, None)
    finally:
        link.close()
        other.close()


def test_a_reply_of_a_link_seen_dead_in_the_same_wait_is_not_handed_over(links):
    seen: list[tuple[str, Any]] = []

    def on_exit(link: Any) -> None:  # as the backend's: the link is dead from now on
        link.alive = False
        seen.append(("exit", link))

    reactor = Reactor(links, lambda link, data: seen.append(("data", link)), on_exit)
    reactor.wait(links, 0)  # the table is made while both are alive
    links[0].reply(b"late")
    links[0].die()
    reactor.wait(links, None)
    assert seen == [("exit", links[0])]


@pytest.mark.asyncio
async def test_on_the_loop_the_same_handlers_run_and_detach_removes_them(links):
    loop = asyncio.get_running_loop()
    came: asyncio.Future[tuple[Any, bytes]] = loop.create_future()
    reactor = Reactor(links, lambda link, data: came.set_result((link, data)), lambda link: None)
    assert not loop_parked()
    assert reactor.attach() is loop
    links[1].reply(b"over the loop")
    assert await asyncio.wait_for(came, 10) == (links[1], b"over the loop")
    reactor.detach()
    assert reactor.loop is None
    for link in links:  # nothing of the table is left on the loop
        assert not loop.remove_reader(link.reply_fd)
        assert not loop.remove_reader(link.sentinel)
