"""`WorkTable`, the pool's state table, driven event by event.

No loop, no transport, no process: each test builds a table of two workers of
three envs each, makes requests, and feeds it the events the pool sees
(a reply, a cancel, a late reply, a death, a rebuild), checking after each what
the table says: who waits on what, what is stuck, which worker is blocked, which
envs are lost.  The backends' behaviour built on it is tested through the vector
env in ``tests/faults``; these tests pin the table's own rules.
"""

from __future__ import annotations

from typing import Any

import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from aiovec._core.ops import CallOp, StepOp
from aiovec._errors import LostWithWorkerError
from aiovec.backends._base import EnvTraits
from aiovec.backends.pool.messages import Ready, RebuildReply, StepReply
from aiovec.backends.pool.table import WorkTable

GROUPS = [range(0, 3), range(3, 6)]


class Worker:
    """What the table needs of a worker: its group, and a name for messages."""

    def __init__(self, group: range) -> None:
        self.group = group
        self.alive = True

    def describe(self) -> str:
        return f"worker of envs {self.group.start}-{self.group.stop - 1}"


def table(*, interrupts: bool = True, asyncs: tuple[bool, ...] = (False,) * 6) -> Any:
    """A table of two workers, ``asyncs`` saying which envs are async; its unblock calls."""
    unblocked: list[None] = []
    t = WorkTable(list(GROUPS), interrupts, lambda: unblocked.append(None))
    traits = EnvTraits([spaces.Discrete(2)] * 3, [spaces.Discrete(2)] * 3, {}, None)
    for w, group in enumerate(GROUPS):
        t.note_ready(w, Ready(traits, asyncs=asyncs[group.start : group.stop]))
    t.unblocked = unblocked
    return t, [Worker(g) for g in GROUPS]


def step(stream: bool = False) -> StepOp:
    return StepOp(AutoresetMode.NEXT_STEP, [0] * 6, [False] * 6, stream=stream)


def send(t: Any, worker: Worker, envs: Any, op: Any = None, since: float = 0.0) -> Any:
    """A request of ``op`` (a whole step) for ``envs`` on ``worker``, now waited on."""
    request = t.track(worker, envs, since, op or step())
    t.wait_on(request, envs)
    return request


# -- waiting and replies ---------------------------------------------------------------


def test_a_reply_reaches_every_env_waiting_on_its_request_once():
    t, workers = table()
    request = send(t, workers[0], workers[0].group)
    assert t.waiting_on[:3] == [request] * 3
    assert list(t.waiting(request)) == [0, 1, 2]
    assert t.waiting_on[:3] == [None] * 3
    partial = send(t, workers[1], [3, 5])
    assert t.waiting(partial, [5]) == [5]  # a streamed part: only its envs
    assert partial.partial
    assert t.waiting(partial) == [3]  # the last part: the rest
    assert t.waiting(partial) == []  # and never twice


def test_a_request_of_a_newer_call_is_not_answered_by_an_older_one():
    t, workers = table()
    old = send(t, workers[0], [0, 1])
    old.partial = True
    new = send(t, workers[0], [1])  # env 1 was sent again (e.g. restarted)
    assert t.waiting(old) == [0]
    assert t.waiting(new) == [1]


def test_a_whole_step_with_a_sync_env_holds_its_parts_until_the_last():
    t, workers = table(asyncs=(True, False, True, True, True, True))
    held = send(t, workers[0], workers[0].group)
    assert held.held == []  # env 1 is sync: it may block the worker
    free = send(t, workers[1], workers[1].group)
    assert free.held is None  # all async: parts go as they come
    streamed = t.track(workers[0], [0, 1], 0.0, step(stream=True))
    assert streamed.held is None  # send()'s steps are delivered as they end
    call = t.track(workers[0], [0, 1], 0.0, CallOp([None, None], "render"))
    assert call.held is None
    first = StepReply({}, {}, {}, {}, envs=[0])
    assert t.unhold(held, first) == []
    assert held.done == {0}
    last = StepReply({}, {}, {}, {})
    assert t.unhold(held, last) == [first, last]
    assert held.held is None
    assert held.done == set()
    assert t.unhold(free, last) is None  # not holding: deliver as it is


# -- cancel, block, unblock --------------------------------------------------------------


def test_cancelling_an_async_env_interrupts_it_and_keeps_it_stuck_until_its_late_reply():
    t, workers = table(asyncs=(True,) * 6)
    request = send(t, workers[0], workers[0].group)
    lost, interrupt = t.abandon([1], workers)
    assert lost == {}
    assert interrupt == {0: [1]}  # local index 1 of worker 0
    assert t.stuck == {1: request}
    assert request.partial
    assert t.blocked == {}  # an async env's call is cancelled: its worker goes on
    assert t.waiting_on[:3] == [request, None, request]
    assert t.waiting(request) == [0, 2]  # the late reply: only the envs still waiting
    assert t.stuck == {}  # and the cancelled env's late outcome is dropped
    assert t.unblocked == []


def test_without_interrupts_an_async_env_blocks_its_worker_as_a_sync_one_does():
    t, workers = table(interrupts=False, asyncs=(True,) * 6)
    request = send(t, workers[0], workers[0].group)
    lost, interrupt = t.abandon([0], workers)
    assert set(lost) == {1, 2}
    assert interrupt == {}
    assert t.blocked == {0: "the step() call of env 0"}
    assert t.stuck == {0: request, 1: request, 2: request}
    assert not t.healthy(0, True)  # it cannot rebuild while a call of it may still run
    t.waiting(request)
    assert t.healthy(0, True)


def test_an_abandoned_sync_call_blocks_its_worker_and_loses_the_envs_waiting_behind_it():
    t, workers = table(asyncs=(False, False, True, False, False, False))
    request = send(t, workers[0], workers[0].group)
    other = send(t, workers[1], workers[1].group)
    lost, interrupt = t.abandon([1], workers)
    assert set(lost) == {0}  # sync env 0 waits behind the blocking env 1; async env 2 does not
    assert isinstance(lost[0], LostWithWorkerError)
    assert lost[0].blocked_by == 1
    assert "blocked by env 1" in str(lost[0])
    assert interrupt == {}
    assert t.blocked == {0: "the step() call of env 1"}
    assert t.stuck == {0: request, 1: request}
    assert t.waiting_on[2] is request  # the async env still gets its outcome
    assert t.lost_envs() == frozenset(workers[0].group)  # every env of a blocked worker
    assert not t.healthy(0, True)
    assert t.waiting_on[3:] == [other] * 3  # the other worker goes on
    sends, unreachable, gone = t.parts([0, 4])
    assert unreachable == {0: [0]}
    assert gone == []
    assert [(w, list(envs)) for w, envs, _ in sends] == [(1, [4])]
    assert "still runs the step() call of env 1" in str(t.blocked_error(0, workers[0]))


def test_the_first_sync_env_in_the_order_its_worker_runs_them_is_the_one_that_blocks():
    t, workers = table()
    send(t, workers[0], [2], since=1.0)
    send(t, workers[0], [0, 1], since=2.0)  # sent later: queued behind env 2's call
    lost, _ = t.abandon([0, 1, 2], workers)
    assert t.blocked == {0: "the step() call of env 2"}
    assert set(lost) == {0, 1}


def test_a_blocked_worker_is_unblocked_once_its_late_reply_comes():
    t, workers = table()
    request = send(t, workers[0], workers[0].group)
    t.abandon([1], workers)
    assert t.blocked
    assert t.waiting(request) == []  # every env was abandoned or lost: nothing to deliver
    assert t.stuck == {}
    assert t.blocked == {}
    assert t.unblocked == [None]  # the backend's waiter is told
    assert t.lost_envs() == frozenset()


def test_a_finished_env_held_back_is_lost_with_its_blocked_worker():
    t, workers = table()
    request = send(t, workers[0], workers[0].group)
    t.unhold(request, StepReply({}, {}, {}, {}, envs=[0]))  # env 0 finished: held back
    lost, _ = t.abandon([1], workers)
    assert set(lost) == {0, 2}
    assert 0 not in t.stuck  # its call is over: nothing of it to wait for
    assert t.stuck == {1: request, 2: request}


# -- deaths and rebuilds ---------------------------------------------------------------


def test_a_dead_worker_loses_its_group_and_ends_what_was_stuck():
    t, workers = table(asyncs=(False, False, True, False, False, False))
    request = send(t, workers[0], workers[0].group)
    send(t, workers[1], [3])
    t.abandon([1], workers)
    assert t.take_waiting(workers[0]) == [2]  # the envs its death fails
    t.lose(workers[0].group)
    assert t.lost == {0, 1, 2}
    assert t.stuck == {}
    assert t.blocked == {}
    assert t.unblocked == [None]
    assert not t.healthy(0, False)
    assert t.take_waiting(workers[1]) == [3]
    sends, unreachable, gone = t.parts([0, 1, 3])
    assert gone == [0, 1]
    assert unreachable == {}
    assert [(w, list(envs)) for w, envs, _ in sends] == [(1, [3])]
    assert "died" in str(t.lost_error(gone))
    assert request.worker is workers[0]


def test_a_new_worker_that_replaced_a_blocked_one_is_not_blocked():
    t, workers = table()
    send(t, workers[0], workers[0].group)
    t.abandon([0], workers)
    assert 0 in t.blocked
    traits = EnvTraits([spaces.Discrete(2)] * 3, [spaces.Discrete(2)] * 3, {}, None)
    t.note_ready(0, Ready(traits, asyncs=(True, False, False)))
    assert t.blocked == {}
    assert t.asyncs[:3] == [True, False, False]


def test_a_rebuild_says_which_envs_are_async_now():
    t, _ = table()
    errors = t.note_rebuilt(1, RebuildReply({1: ValueError("bad")}, {0: True, 2: False}))
    assert list(errors) == [1]
    assert t.asyncs == [False, False, False, True, False, False]
    assert t.cancellable(3)
    assert not t.cancellable(5)


# -- splitting calls -------------------------------------------------------------------


def test_a_call_is_split_by_worker_and_a_whole_group_is_named_by_its_range():
    t, _ = table()
    sends, unreachable, gone = t.parts([0, 1, 2, 4])
    assert unreachable == {}
    assert gone == []
    assert sends[0] == (0, range(0, 3), [0, 1, 2])
    assert sends[1] == (1, [4], [3])
    unordered, _, _ = t.parts([4, 0])
    assert [(w, list(envs), k) for w, envs, k in unordered] == [(1, [4], [0]), (0, [0], [1])]
    assert t.by_owner([5, 0, 3]) == {1: [5, 3], 0: [0]}
    assert t.turns([0, 1, 2, 3, 4]) == [0, 3, 1, 4, 2]


@pytest.mark.parametrize("interrupts", [True, False])
def test_cancellable_needs_both_an_async_env_and_a_worker_that_interrupts(interrupts):
    t, _ = table(interrupts=interrupts, asyncs=(True, False, True, False, True, False))
    assert [t.cancellable(i) for i in range(6)] == [interrupts, False] * 3
