"""The process transport's parts driven directly: the completion table, and the watch.

No vector env.  The completion table (``backends/process/table.py``) is driven
event by event, as h11's tests drive its state machine: the parent's side
(a request numbered in ``req``, arming the doorbell, looking at what is done)
and a worker's side (publishing envs, ringing) on one table, checking after
each event what each side sees.  Then the doorbell rule is hammered by real
worker processes publishing at once.  The watch (``watch.py``) is driven over
plain pipes standing in for workers.  The vector env's behaviour over real
workers is tested in ``test_process.py`` and ``tests/faults``.
"""

from __future__ import annotations

import asyncio
import mmap
import multiprocessing
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aiovec.backends.process.child import TableSink
from aiovec.backends.process.shared import Doorbell
from aiovec.backends.process.table import BLANK, NEVER, CompletionTable
from aiovec.backends.process.watch import Watch, loop_parked

pytestmark = pytest.mark.skipif(not hasattr(select, "poll"), reason="poll: POSIX only")

GROUPS = [range(0, 3), range(3, 6)]  # two workers of three envs


def new_table(num_envs: int = 6, num_workers: int = 2) -> CompletionTable:
    table = CompletionTable(bytearray(CompletionTable.nbytes(num_envs, num_workers)), 6, 2)
    table.blank()
    return table


def worker_side(table: CompletionTable) -> CompletionTable:
    """The same table as a worker maps it (its own ``rung``, the same memory)."""
    twin = CompletionTable.__new__(CompletionTable)
    for name in CompletionTable.__slots__:
        setattr(twin, name, getattr(table, name))
    twin.rung = -1
    return twin


def done_envs(table: CompletionTable) -> tuple[list[int], list[int]]:
    """What the parent sees done: the clean envs, and those with a message to read."""
    clean, told = table.finished()
    return np.flatnonzero(clean).tolist(), np.flatnonzero(told).tolist()


# -- the completion table, event by event ----------------------------------------------


def test_a_blank_table_has_nothing_done_and_nothing_armed() -> None:
    table = new_table()
    assert done_envs(table) == ([], [])
    assert table.total() == 0
    assert int(table.wake[0]) == NEVER
    assert (table.done == BLANK).all()
    assert not worker_side(table).publish(0, slice(0, 3), 1, 3)  # nothing armed: no ring


def test_a_whole_step_rings_once_when_its_last_worker_publishes() -> None:
    table = new_table()
    w0, w1 = worker_side(table), worker_side(table)
    seen = table.total()
    table.req[:] = [7, 7, 7, 8, 8, 8]  # one request per worker
    assert not table.arm(seen, 6)
    assert not w1.publish(1, slice(3, 6), 8, 3)  # worker 1 first: 3 of 6, no ring
    assert done_envs(table) == ([3, 4, 5], [])
    assert w0.publish(0, slice(0, 3), 7, 3)  # the last one rings
    assert done_envs(table) == ([0, 1, 2, 3, 4, 5], [])


def test_out_of_order_completions_are_found_whatever_the_order() -> None:
    table = new_table()
    ws = worker_side(table), worker_side(table)
    table.req[:] = [3, 3, 3, 4, 4, 4]
    assert not table.arm(table.total(), 6)
    rings = []
    for i in (4, 0, 5, 2, 3, 1):  # envs publish one by one, in no order
        w = 0 if i < 3 else 1
        rings.append(ws[w].publish(w, [i], table.req[i], 1))
        clean, _ = done_envs(table)
        assert i in clean
    assert rings == [False] * 5 + [True]  # the sixth completion, whichever env it is


def test_a_partial_recv_wakes_at_k_envs_and_arms_again_for_the_rest() -> None:
    table = new_table()
    w0, w1 = worker_side(table), worker_side(table)
    table.req[:] = [5, 5, 5, 6, 6, 6]
    seen = table.total()
    assert not table.arm(seen, 2)  # recv(min_envs=2)
    assert not w1.publish(1, [4], 6, 1)
    assert w0.publish(0, [1], 5, 1)  # the second completion rings, on either worker
    # The parent looks: the total first, then what is done; it takes those envs.
    seen = table.total()
    clean, told = done_envs(table)
    assert (clean, told) == ([1, 4], [])
    table.req[clean] = 0  # taken: they wait no more
    table.disarm()
    assert done_envs(table) == ([], [])
    assert not w0.publish(0, [0], 5, 1)  # disarmed: nothing rings
    assert table.arm(seen, 1)  # one came meanwhile: the parent must not sleep
    seen = table.total()
    assert done_envs(table) == ([0], [])
    table.req[0] = 0
    assert not table.arm(seen, 3)  # the last three
    assert not w1.publish(1, [3, 5], 6, 2)
    assert w0.publish(0, [2], 5, 1)


def test_an_env_with_more_to_say_is_marked_minus_its_number() -> None:
    table = new_table()
    w0 = worker_side(table)
    table.req[:3] = 9
    assert not table.arm(table.total(), 3)
    assert w0.publish(0, [0, 1, 2], [9, -9, 9], 3)  # env 1's info is on the pipe
    assert done_envs(table) == ([0, 2], [1])


def test_a_stale_number_is_never_taken_for_the_current_request() -> None:
    table = new_table()
    w0 = worker_side(table)
    table.req[0] = 4  # env 0's call, request 4: abandoned (a timeout) ...
    table.req[0] = 11  # ... and env 0 sent again, as request 11
    assert not table.arm(table.total(), 1)
    w0.publish(0, [0], -4, 1)  # request 4's late outcome, with its message
    assert done_envs(table) == ([], [])  # neither clean nor told: stale
    assert table.ended(0, 4)  # but the worker is done with request 4
    assert not table.ended(0, 11)
    w0.publish(0, [0], 11, 1)
    assert done_envs(table) == ([0], [])
    assert table.ended(0, 4)
    assert table.ended(0, 11)


def test_a_stale_completion_may_wake_the_parent_early_never_late() -> None:
    table = new_table()
    w0 = worker_side(table)
    table.req[:3] = 20
    seen = table.total()
    assert not table.arm(seen, 3)
    w0.publish(0, [1], 17, 1)  # a late completion of an abandoned request counts
    w0.publish(0, [0], 20, 1)
    assert w0.publish(0, [2], 20, 1)  # the count reaches wake_at: a ring, one env short
    seen = table.total()
    clean, _ = done_envs(table)
    assert clean == [0, 2]  # the parent looks, takes two, and arms again for the third
    table.req[clean] = 0
    assert not table.arm(seen, 1)
    assert w0.publish(0, [1], 20, 1)
    assert done_envs(table) == ([1], [])


def test_a_worker_rings_at_most_once_for_one_wake_at() -> None:
    table = new_table()
    w0, w1 = worker_side(table), worker_side(table)
    table.req[:] = 2
    assert not table.arm(table.total(), 1)
    assert w0.publish(0, [0], 2, 1)
    assert not w0.publish(0, [1], 2, 1)  # rang for this wake_at already
    assert w1.publish(1, [3], 2, 1)  # the other worker saw the total there too: it may ring
    assert not table.arm(table.total(), 1)
    assert w0.publish(0, [2], 2, 1)  # a new wake_at


def test_a_worker_rings_though_another_worker_s_count_came_first() -> None:
    # Two workers that publish at the same instant may each see the other's count:
    # neither carried the total across wake_at alone, yet the parent must be rung.
    table = new_table()
    w0, w1 = worker_side(table), worker_side(table)
    table.req[:] = 2
    assert not table.arm(table.total(), 1)
    w1.done[3:5] = 2
    w1.ready[1] += 2  # worker 1's count lands; it has not read the total yet
    assert w0.publish(0, [0, 1], 2, 2)  # worker 0 sees the total past wake_at: it rings


def test_a_worker_killed_before_marking_its_rows_leaves_them_not_done() -> None:
    table = new_table()
    arrays = np.zeros(6)  # stands for its step rows
    table.req[:] = [30, 30, 30, 31, 31, 31]
    assert not table.arm(table.total(), 6)
    worker_side(table).publish(1, slice(3, 6), 31, 3)
    arrays[0:3] = 1.0  # worker 0 writes its rows ... and is killed here
    # The doorbell never rings: the parent wakes on worker 0's sentinel and looks.
    assert done_envs(table) == ([3, 4, 5], [])  # its envs are not done: they fail with it


def test_a_worker_killed_between_marking_its_rows_and_ringing() -> None:
    table = new_table()
    table.req[:] = [30, 30, 30, 31, 31, 31]
    seen = table.total()
    assert not table.arm(seen, 6)
    worker_side(table).publish(1, slice(3, 6), 31, 3)
    table.done[0:3] = 30  # worker 0 marks its envs done ... and is killed before its count
    assert table.total() == seen + 3  # its completions are not counted: nothing rang
    # The parent wakes on the sentinel, looks, and takes what the worker published.
    assert done_envs(table) == ([0, 1, 2, 3, 4, 5], [])


def test_a_reply_to_a_control_request_is_counted_in_notes() -> None:
    table = new_table()
    w1 = worker_side(table)
    before = table.notes.copy()
    w1.note(1)
    assert (table.notes - before).tolist() == [0, 1]
    assert done_envs(table) == ([], [])


@pytest.mark.timeout(10)
def test_a_control_reply_is_in_the_pipe_before_its_note_moves() -> None:
    """The parent reads a worker's pipe once it sees ``notes`` move, and only then.

    A reply counted before it is written is read as nothing; its count taken,
    it is never looked for again and the call waiting on it hangs (a rebuild
    under a restart policy did, now and then).
    """
    table = new_table()
    read_fd, write_fd = os.pipe()
    bell_read, bell_write = os.pipe()
    in_pipe_at_note: list[bool] = []

    class Watched(CompletionTable):
        def note(self, w: int) -> None:
            in_pipe_at_note.append(bool(select.select([read_fd], [], [], 0)[0]))
            super().note(w)

    try:
        watched = Watched.__new__(Watched)
        for name in CompletionTable.__slots__:
            setattr(watched, name, getattr(table, name))
        before = table.notes.copy()
        TableSink(write_fd, watched, 1, 3, bell_write).reply(7, "rebuilt")
        assert in_pipe_at_note == [True]
        assert (table.notes - before).tolist() == [0, 1]
        assert select.select([bell_read], [], [], 0)[0]  # and the doorbell rang
    finally:
        for fd in (read_fd, write_fd, bell_read, bell_write):
            os.close(fd)


# -- the doorbell rule across processes --------------------------------------------------


def _publisher(buffer: Any, bell: int, w: int) -> None:
    """A worker: for each request of the parent, publishes its three envs one by one."""
    table = CompletionTable(buffer, 6, 2)
    table.rung = -1
    seq = 0
    while True:
        while int(table.req[3 * w]) == seq:  # the parent's next request (spin: a test only)
            pass
        seq = int(table.req[3 * w])
        if seq < 0:
            return
        for i in range(3 * w, 3 * w + 3):  # one by one, to meet the other worker anywhere
            if table.publish(w, [i], seq, 1):
                os.write(bell, (1).to_bytes(8, sys.byteorder))


@pytest.mark.timeout(60)
def test_workers_publishing_at_once_never_leave_the_parent_asleep() -> None:
    """Two worker processes publish each round at once; the parent arms then sleeps on
    the doorbell.  Every round must wake it (a missed ring would sleep out the poll's
    10 s and fail), whatever the interleaving of the two sides' writes and reads."""
    rounds = 300
    buffer = mmap.mmap(-1, CompletionTable.nbytes(6, 2))
    table = CompletionTable(buffer, 6, 2)
    table.blank()
    bell = Doorbell()
    ctx = multiprocessing.get_context("fork")
    workers = [
        ctx.Process(target=_publisher, args=(buffer, bell.ring_fd, w), daemon=True)
        for w in range(2)
    ]
    for process in workers:
        process.start()
    poller = select.poll()
    poller.register(bell.fd, select.POLLIN)
    try:
        for seq in range(1, rounds + 1):
            seen = table.total()
            table.req[:] = seq
            while not table.arm(seen, 6):  # every completion of the round counted: done
                assert poller.poll(10_000), f"round {seq}: no ring"
                bell.clear()
            table.disarm()
            clean, _ = table.finished()
            assert clean.all()  # each completion counted is visible
    finally:
        table.req[:] = -1
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.kill()
        bell.close()


# -- the watch ---------------------------------------------------------------------------


class PipeLink:
    """What the watch uses of a `Link`, over pipes and without a process."""

    def __init__(self, group: range) -> None:
        self.group = group
        self.alive = True
        self.outbox = bytearray()
        self.sentinel, self._sentinel_w = os.pipe()  # readable (end of file) once "dead"
        self._request_r, self.request_fd = os.pipe()

    def die(self) -> None:
        os.close(self._sentinel_w)
        self._sentinel_w = -1

    def flush(self) -> bool:
        return False

    def close(self) -> None:
        for fd in (self.sentinel, self._sentinel_w, self._request_r, self.request_fd):
            if fd >= 0:
                os.close(fd)


@pytest.fixture
def links() -> Iterator[list[PipeLink]]:
    made = [PipeLink(group) for group in GROUPS]
    yield made
    for link in made:
        link.close()


@pytest.fixture
def bell() -> Iterator[Doorbell]:
    made = Doorbell()
    yield made
    made.close()


def watch_of(bell: Doorbell, links: list[Any]) -> tuple[Watch, list[tuple[str, Any]]]:
    """A watch over ``links`` that records what it hands over, in order."""
    seen: list[tuple[str, Any]] = []

    def on_exit(link: Any) -> None:  # as the transport's: the link is dead from now on
        link.alive = False
        seen.append(("exit", link))

    return Watch(bell, links, lambda: seen.append(("ring", None)), on_exit), seen


def ring(bell: Doorbell) -> None:
    os.write(bell.ring_fd, (1).to_bytes(8, sys.byteorder))


def test_a_parked_wait_clears_a_ring_and_hands_over_a_death(links, bell):
    watch, seen = watch_of(bell, links)
    ring(bell)
    watch.wait(None)
    assert seen == []  # a ring is cleared here: the caller looks at the table itself
    assert not select.select([bell.fd], [], [], 0)[0]
    links[1].die()
    watch.wait(None)
    assert seen == [("exit", links[1])]


def test_a_parked_wait_runs_out_of_time_without_a_ring_or_a_death(links, bell):
    watch, seen = watch_of(bell, links)
    started = time.monotonic()
    watch.wait(0.02)
    assert time.monotonic() - started >= 0.015
    assert seen == []


def test_a_dead_link_is_no_longer_watched(links, bell):
    watch, seen = watch_of(bell, links)
    links[0].die()
    watch.wait(None)
    watch.changed()  # as the transport does when a link dies
    watch.wait(0.02)  # its sentinel stays readable: it must not be handed over again
    assert seen == [("exit", links[0])]


@pytest.mark.asyncio
async def test_on_the_loop_one_reader_on_the_doorbell_and_detach_removes_all(links, bell):
    loop = asyncio.get_running_loop()
    rang: asyncio.Future[None] = loop.create_future()
    died: asyncio.Future[Any] = loop.create_future()

    def on_ring() -> None:
        bell.clear()
        if not rang.done():
            rang.set_result(None)

    watch = Watch(bell, links, on_ring, died.set_result)
    assert not loop_parked()
    assert watch.attach() is loop
    ring(bell)
    await asyncio.wait_for(rang, 10)
    links[0].die()
    assert await asyncio.wait_for(died, 10) is links[0]
    watch.detach()
    assert watch.loop is None
    assert not loop.remove_reader(bell.fd)  # nothing of the watch is left on the loop
    for link in links:
        assert not loop.remove_reader(link.sentinel)
