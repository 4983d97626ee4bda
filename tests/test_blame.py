"""A timed-out whole step blames the env that did not answer (issue 25).

Envs grouped on workers: a worker that runs sync envs one after another
publishes those it finished before a deadline can pass them by, so the env
that hung is the one that times out.  Envs its worker can no longer answer for
(it stays blocked in the hung env's call until replaced) are lost with it and
say so; the step's error names the hung env first.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
from typing import Any

import anyio
import numpy as np
import pytest
from conftest import HAVE_RAY, RAY_ACTORS

import aiovec
from aiovec._errors import LostWithWorkerError
from aiovec.backends._limit import Slots
from aiovec.testing import Gate, HangingEnv, SpaceEnv


def test_an_env_error_names_the_env_that_failed_of_its_own_first():
    lost = LostWithWorkerError("env 0 was lost with its worker, blocked by env 1", 1)
    error = aiovec.EnvTimeoutError({0: lost, 2: lost, 1: TimeoutError("late")})
    assert error.env_index == 1
    assert list(error.errors) == [1, 0, 2]
    assert error.__cause__ is error.errors[1]
    assert str(error).startswith("env 1 failed in step(): TimeoutError: late")
    copy = pickle.loads(pickle.dumps(error))
    assert list(copy.errors) == [1, 0, 2]
    assert isinstance(copy.errors[0], LostWithWorkerError)
    assert copy.errors[0].blocked_by == 1
    assert str(copy.errors[0]) == str(lost)


def _env(gate: Gate, index: int) -> Any:
    env = SpaceEnv(min_len=1000, max_len=1000)
    return HangingEnv(env, gate, at=1, give_up_after=30.0) if index == 1 else env


@pytest.mark.parametrize("backend", ["process", pytest.param("ray", marks=pytest.mark.ray)])
@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_the_envs_behind_a_hung_sync_env_are_lost_with_its_worker(tmp_path, backend):
    """3 sync envs on a worker: env 0 answers, env 1 hangs, env 2 never starts."""
    if backend == "ray" and not HAVE_RAY:
        pytest.skip('needs the "ray" extra: pip install "aiovec[ray]"')
    gate = Gate(tmp_path)
    options = {"actor_pool": RAY_ACTORS[0]} if backend == "ray" and RAY_ACTORS else None
    venv = aiovec.AsyncioVectorEnv(
        [functools.partial(_env, gate, i) for i in range(6)],
        backend=backend,
        num_workers=2,
        step_timeout=0.5,
        reset_timeout=10.0,
        backend_options=options,
    )
    try:
        await venv.reset(seed=0)
        with pytest.raises(aiovec.EnvTimeoutError) as info:
            await venv.step(np.zeros(6, np.int64))
        error = info.value
        assert error.env_index == 1
        assert list(error.errors) == [1, 0, 2]
        assert isinstance(error.errors[1], TimeoutError)
        assert "did not answer step()" in str(error.errors[1])
        for i in (0, 2):  # env 0 finished, env 2 waited behind env 1: lost, not late
            assert isinstance(error.errors[i], LostWithWorkerError)
            assert "lost with its worker, blocked by env 1" in str(error.errors[i])
            assert "did not answer" not in str(error.errors[i])
        gate.release()
        await venv.reset(seed=1)
        await venv.step(np.zeros(6, np.int64))
    finally:
        gate.release()
        await venv.close()


# -- Slots: the parent's side of max_concurrency on process and Ray (tokens need a loop) ----


class Book:
    """What `Slots` told: which envs started together, which were queued and when not."""

    def __init__(self) -> None:
        self.started: list[list[int]] = []
        self.queue: list[tuple[int, bool]] = []


def _slots(limit: int, book: Book, start: Any = None) -> Slots:
    return Slots(
        anyio.CapacityLimiter(limit),
        start or book.started.append,
        lambda i, waiting: book.queue.append((i, waiting)),
    )


@pytest.mark.asyncio
async def test_slots_go_in_order_and_come_back_with_outcomes():
    book = Book()
    slots = _slots(2, book)
    slots.request([4, 0, 5, 1])
    assert book.started == [[4, 0]]
    assert book.queue == [(5, True), (1, True)]
    slots.release(0)
    assert book.started[-1] == [5]
    assert book.queue[-1] == (5, False)
    with slots.deferred():  # slots come back; the calls start together at the end
        slots.release(4)
        slots.release(5)
        assert book.started[-1] == [5]
    assert book.started[-1] == [1]
    slots.forget([1])  # not waiting: nothing to forget
    slots.release(1)
    slots.request([7, 8])
    assert book.started[-1] == [7, 8]


@pytest.mark.asyncio
async def test_a_waiting_env_that_is_abandoned_never_starts():
    book = Book()
    slots = _slots(1, book)
    slots.request([0, 1, 2])
    slots.forget([1])
    assert (1, False) in book.queue
    slots.release(0)
    assert book.started == [[0], [2]]


@pytest.mark.asyncio
async def test_a_call_that_ends_as_it_starts_hands_its_slot_on():
    """A worker found lost fails its env at once: the slot goes to the next env, no recursion."""
    book = Book()
    slots: Slots

    def start(envs: list[int]) -> None:
        book.started.append(envs)
        for i in envs:
            if i % 2:  # odd envs are lost: their outcome comes at once
                slots.release(i)

    slots = _slots(1, book, start)
    slots.request([1, 3, 5, 2])
    assert book.started == [[1], [3], [5], [2]]


@pytest.mark.asyncio
async def test_slots_need_no_task():
    book = Book()
    slots = _slots(1, book)
    tasks = len(asyncio.all_tasks())
    slots.request([0, 1])
    assert len(asyncio.all_tasks()) == tasks
    slots.release(0)
    assert book.started == [[0], [1]]
