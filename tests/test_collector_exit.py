"""Leaving a collector's loop is prompt in every way, with an ``async def`` policy.

Envs that wait 2-10 ms a step and a policy that awaits 5-30 ms (a model
server), as an LLM agent has them: whenever the loop is left, some env calls
and some policy calls are in flight.  Each way of leaving (``break`` inside
``async with``, ``aclose()`` beside the iterator's own end, cancelling the
consuming task, an error or Ctrl-C inside the loop) is tried many times at
random moments, on the inline and process backends and both front ends; each
must return (a hang fails the test by its ``asyncio.timeout``), cancel every
policy call, and leave a vector env that a ``reset()`` makes usable.  Both
collectors are tried: ``aiovec.Collector`` and ``aiovec.EpisodeCollector``
(whose envs also start episodes while others are in flight).  ``aclose()``
from a task beside the consumer is tried 200 times per backend and collector,
landing in a policy call, a ``recv``, the loop's body or between two rounds.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest

import aiovec

TRIES = 12
HANG = 5.0  # seconds: far beyond any exit; only a hang reaches it


class WaitingEnv(aiovec.AsyncEnv[np.ndarray, int]):
    """Each step waits 2-10 ms, as an env behind a network service does.

    An episode ends at each step with probability ``options["ends"]`` (0.05).
    """

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        await super().reset(seed=seed)
        self.ends = (options or {}).get("ends", 0.05)  # an episode's end, per step
        return np.zeros(2, np.float32), {}

    async def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(self.np_random.uniform(0.002, 0.010))
        ended = bool(self.np_random.random() < self.ends)
        return np.zeros(2, np.float32), 1.0, ended, False, {}


class ServerPolicy:
    """An ``async def`` policy: each call awaits 5-30 ms; it counts calls left unfinished."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.running = 0

    async def __call__(self, obs: Any, env_ids: np.ndarray) -> np.ndarray:
        self.running += 1
        try:
            await asyncio.sleep(self.rng.uniform(0.005, 0.03))
        finally:
            self.running -= 1
        return np.zeros(len(env_ids), np.int64)


COLLECTORS: dict[str, Callable[[Any, ServerPolicy], Any]] = {
    "segments": lambda venv, policy: aiovec.Collector(
        venv, policy, segment_length=4, batch_size=2, seed=0
    ),
    "episodes": lambda venv, policy: aiovec.EpisodeCollector(
        venv, policy, batch_size=2, group_size=2, tasks=itertools.repeat({"ends": 0.3}), seed=0
    ),
}
KIND: list[str] = ["segments"]  # the collector the ways below build (set by each test)


def collector(venv: Any, policy: ServerPolicy) -> Any:
    return COLLECTORS[KIND[0]](venv, policy)


async def leave_by_break(venv: Any, policy: ServerPolicy, after: int) -> None:
    async with collector(venv, policy) as c:
        seen = 0
        async for _ in c:
            seen += 1
            if seen == after:
                break


async def leave_by_aclose(venv: Any, policy: ServerPolicy, after: int) -> None:
    """``aclose()`` while the loop finalizes the abandoned iterator (a task of its own)."""
    c = collector(venv, policy)
    batches = aiter(c)
    for _ in range(after):
        await anext(batches)
    # Both end the collection at once: the iterator's end and the collector's.
    await asyncio.gather(batches.aclose(), c.aclose())  # type: ignore[attr-defined]


async def leave_by_cancel(venv: Any, policy: ServerPolicy, after: int) -> None:
    async def consume() -> None:
        async with collector(venv, policy) as c:
            async for _ in c:
                pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(after * 0.01)  # a random moment into the collection
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Boom(Exception):
    pass


async def leave_by_error(venv: Any, policy: ServerPolicy, after: int) -> None:
    async def fail() -> None:
        async with collector(venv, policy) as c:
            seen = 0
            async for _ in c:
                seen += 1
                if seen == after:
                    raise Boom

    with pytest.raises(Boom):
        await fail()


WAYS: dict[str, Callable[[Any, ServerPolicy, int], Any]] = {
    "break": leave_by_break,
    "aclose": leave_by_aclose,
    "cancel": leave_by_cancel,
    "error": leave_by_error,
}


@pytest.fixture(params=list(COLLECTORS))
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    KIND[0] = request.param
    yield request.param
    KIND[0] = "segments"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["inline", "process"])
@pytest.mark.parametrize("way", list(WAYS))
def test_leaving_the_loop_with_an_async_policy_returns(way: str, backend: str, kind: str) -> None:
    rng = random.Random(f"{way}-{backend}" + ("" if kind == "segments" else "-episodes"))

    async def main() -> None:
        venv = aiovec.AsyncioVectorEnv([WaitingEnv] * 8, backend=backend, num_workers=2)
        async with venv:
            for t in range(TRIES):
                policy = ServerPolicy(t)
                async with asyncio.timeout(HANG):
                    await WAYS[way](venv, policy, rng.randint(1, 6))
                await asyncio.sleep(0)  # let the cancelled policy calls unwind
                assert policy.running == 0, "a policy call was left running"
                assert venv.state in {aiovec.State.BROKEN, aiovec.State.READY}
                async with asyncio.timeout(HANG):
                    await venv.reset(seed=t)  # usable again

    asyncio.run(main())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["inline", "process"])
@pytest.mark.parametrize("leave", [StopIteration, Boom, KeyboardInterrupt])
def test_leaving_the_blocking_loop_returns(
    backend: str, leave: type[BaseException], kind: str
) -> None:
    rng = random.Random(f"{leave.__name__}-{backend}" + ("" if kind == "segments" else "-e"))
    with aiovec.BlockingVectorEnv([WaitingEnv] * 8, backend=backend, num_workers=2) as venv:
        for t in range(TRIES // 2):
            policy = ServerPolicy(t)
            after = rng.randint(1, 6)
            try:
                with collector(venv, policy) as c:
                    for seen, _ in enumerate(c, 1):
                        if seen == after:
                            if leave is StopIteration:
                                break
                            raise leave
            except (Boom, KeyboardInterrupt):
                pass  # the raise above, through the collector's exit
            assert policy.running == 0, "a policy call was left running"
            venv.reset(seed=t)  # usable again


def test_one_stop_at_a_time(kind: str) -> None:
    """Two stops at once (the hang's cause): both return, one cancelled waiter does no harm."""

    async def main() -> None:
        async with aiovec.AsyncioVectorEnv([WaitingEnv] * 4) as venv:
            policy = ServerPolicy(0)
            c = collector(venv, policy)
            batches = aiter(c)
            await anext(batches)
            first = asyncio.ensure_future(c.aclose())
            second = asyncio.ensure_future(c.aclose())
            await asyncio.sleep(0)
            second.cancel()  # a caller that gives up does not cut the stop short
            async with asyncio.timeout(HANG):
                await first
            assert policy.running == 0
            assert venv.state in {aiovec.State.BROKEN, aiovec.State.READY}  # nothing in flight
            await venv.reset(seed=1)
            await batches.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


# -- aclose() from another task -------------------------------------------------------

CLOSES = 200  # tries per backend and collector


class CountingPolicy:
    """A policy that sets ``called`` at its ``wake_at``-th call; ``async def`` or plain.

    The closing task waits for ``called`` and then a random number of loop
    turns: the close lands anywhere, inside a policy call or a ``recv``, in
    the loop's body, or between two rounds.
    """

    def __init__(self, rng: random.Random, *, awaits: bool) -> None:
        self.rng, self.awaits = rng, awaits
        self.calls = self.running = 0
        self.wake_at = rng.randint(1, 8)
        self.called = asyncio.Event()

    def _count(self) -> None:
        self.calls += 1
        if self.calls == self.wake_at:
            self.called.set()

    def __call__(self, obs: Any, env_ids: np.ndarray) -> Any:
        self._count()
        if not self.awaits:
            return np.zeros(len(env_ids), np.int64)
        return self._answer(len(env_ids))

    async def _answer(self, count: int) -> np.ndarray:
        self.running += 1
        try:
            await asyncio.sleep(self.rng.uniform(0, 0.003))
        finally:
            self.running -= 1
        return np.zeros(count, np.int64)


class QuickEnv(WaitingEnv):
    """`WaitingEnv` whose steps wait 0-3 ms."""

    async def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(self.np_random.uniform(0, 0.003))
        ended = bool(self.np_random.random() < self.ends)
        return np.zeros(2, np.float32), 1.0, ended, False, {}


def closing_collector(kind: str, venv: Any, policy: CountingPolicy, rng: random.Random) -> Any:
    calls = rng.choice([1, 2, None])
    if kind == "segments":
        return aiovec.Collector(
            venv, policy, segment_length=3, batch_size=2, max_policy_calls=calls, seed=0
        )
    tasks = itertools.repeat({"ends": 0.3})
    return aiovec.EpisodeCollector(
        venv, policy, batch_size=2, group_size=2, tasks=tasks, max_policy_calls=calls, seed=0
    )


async def close_from_another_task(
    kind: str, venv: Any, rng: random.Random, t: int
) -> tuple[CountingPolicy, int]:
    """One try: a consumer iterates, another task closes at a random moment.

    Returns the policy and how many batches the consumer saw.  The consumer
    must end on its own (no exception, not cancelled), once ``aclose()``
    returned.
    """
    policy = CountingPolicy(rng, awaits=t % 3 != 0)
    c = closing_collector(kind, venv, policy, rng)
    in_body = rng.randint(0, 2)  # loop turns the consumer spends in the loop's body
    seen = 0

    async def consume() -> None:
        nonlocal seen
        async for _ in c:
            seen += 1
            for _ in range(in_body):
                await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0  # no cancellation left behind

    consumer = asyncio.create_task(consume())
    async with asyncio.timeout(HANG):
        await policy.called.wait()
        for _ in range(rng.randint(0, 8)):
            await asyncio.sleep(0)
        await c.aclose()
        await consumer  # the loop ended as the iteration would: no error, no cancellation
    return policy, seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["inline", "process"])
def test_aclose_from_another_task_ends_the_loop(backend: str, kind: str) -> None:
    """``aclose()`` from a task beside the consumer: it returns, and the loop ends cleanly.

    Before the fix, the stop ran beside the consumer inside its wait: the
    consumer read a policy call the stop had cancelled (``CancelledError`` in
    a task nobody cancelled), took rows into a book the stop had dropped (an
    assertion), or spun without awaiting (nothing left out to wait on) so
    that no other task, ``aclose()`` included, ever ran again.
    """
    rng = random.Random(f"aclose-{backend}-{kind}")

    async def main() -> None:
        venv = aiovec.AsyncioVectorEnv([QuickEnv] * 8, backend=backend, num_workers=2)
        async with venv:
            batches = 0
            for t in range(CLOSES):
                policy, seen = await close_from_another_task(kind, venv, rng, t)
                batches += seen
                await asyncio.sleep(0)  # let the cancelled policy calls unwind
                assert policy.running == 0, "a policy call was left running"
                assert venv.state in {aiovec.State.BROKEN, aiovec.State.READY}
                async with asyncio.timeout(HANG):
                    await venv.reset(seed=t)  # usable again
            assert batches > 0  # some closes came after a batch, in the loop's body too

    asyncio.run(main())


def test_aclose_ends_an_iteration_in_its_body(kind: str) -> None:
    """A close while the consumer is in the loop's body ends the loop at its next turn."""

    async def main() -> None:
        async with aiovec.AsyncioVectorEnv([QuickEnv] * 4) as venv:
            policy = CountingPolicy(random.Random(0), awaits=True)
            c = closing_collector(kind, venv, policy, random.Random(0))
            seen = 0
            async for _ in c:
                seen += 1
                await asyncio.wait_for(asyncio.create_task(c.aclose()), HANG)
            assert seen == 1
            async for _ in c:  # iterating again starts a new collection
                break
            await c.aclose()

    asyncio.run(main())


def test_aclose_beside_a_cancellation_keeps_it(kind: str) -> None:
    """A consumer cancelled by its owner as another task closes the collector is cancelled."""

    async def main() -> None:
        async with aiovec.AsyncioVectorEnv([QuickEnv] * 4) as venv:
            for t in range(20):
                policy = CountingPolicy(random.Random(t), awaits=True)
                c = closing_collector(kind, venv, policy, random.Random(t))

                async def consume(c: Any = c) -> None:
                    async for _ in c:
                        pass

                consumer = asyncio.create_task(consume())
                await policy.called.wait()
                closing = asyncio.create_task(c.aclose())
                await asyncio.sleep(0)  # the close has cancelled the consumer (its own way)
                consumer.cancel()
                async with asyncio.timeout(HANG):
                    await closing
                    with pytest.raises(asyncio.CancelledError):
                        await consumer
                await venv.reset(seed=t)

    asyncio.run(main())


def lanes_of(venv: aiovec.AsyncioVectorEnv[Any, Any]) -> set[asyncio.Task[Any]]:
    """The inline backend's lanes: a task per env that waited, living with the vector env.

    (`aiovec.backends._lanes`: an env's lane carries its calls that suspend from
    one to the next, and ends with the vector env, or when its call is cancelled.)
    """
    lanes = getattr(venv._backend, "_lanes", None)
    return set() if lanes is None else {t for t in lanes._tasks if t is not None}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["inline", "process"])
def test_no_task_of_a_collector_outlives_its_loop(backend: str, kind: str) -> None:
    """Whichever way the loop is left, the tasks left are the vector env's own lanes."""
    rng = random.Random(f"tasks-{backend}-{kind}")

    async def main() -> None:
        venv = aiovec.AsyncioVectorEnv([QuickEnv] * 16, backend=backend, num_workers=2)
        async with venv:
            before = asyncio.all_tasks()
            ways = [*WAYS.values(), *WAYS.values()]
            for t, way in enumerate(ways):
                policy = ServerPolicy(t)
                async with asyncio.timeout(HANG):
                    await way(venv, policy, rng.randint(1, 3))
                await asyncio.sleep(0)  # the cancelled ones unwind
                left = asyncio.all_tasks() - before
                assert left <= lanes_of(venv), f"{left - lanes_of(venv)} outlived the loop"
                await venv.reset(seed=t)
            for t in range(4):
                await close_from_another_task(kind, venv, rng, t)
                await asyncio.sleep(0)
                left = asyncio.all_tasks() - before
                assert left <= lanes_of(venv), f"{left - lanes_of(venv)} outlived the loop"
                await venv.reset(seed=t)
        assert asyncio.all_tasks() == before  # closed: the lanes are gone too

    asyncio.run(main())
