"""What aiovec logs on the ``aiovec`` logger: timeouts, restarts, envs that hold the loop.

The loop-hog threshold is the running loop's ``slow_callback_duration``; the
tests lower it so that an env holding the loop for a few milliseconds (the
scenario itself, not synchronisation) is over it.  A hog that runs on the CPU
(`burn`) or blocks in a synchronous call (``time.sleep``) is named; a stretch
the OS took (the loop's thread preempted) names no env: the tests make one by
giving the vector env counters that say so (`preempted_counters`), not by
loading the machine.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import re
import time
import types
from collections.abc import AsyncIterator

import gymnasium
import numpy as np
import pytest
import pytest_asyncio

import aiovec
from aiovec import _log
from aiovec._log import Counters, LoopHogs, Verdict, judge, slow_slice_limit
from aiovec.backends import inline

SPACE = gymnasium.spaces.Discrete(3)
LIMIT = 0.02  # the loop's slow_callback_duration in these tests
BLOCK = 0.05  # how long a hogging env blocks the loop


class PoliteEnv(aiovec.AsyncEnv[int, int]):
    """Awaits between short stretches of work: never holds the loop."""

    observation_space = action_space = SPACE

    async def reset(self, *, seed=None, options=None):
        await asyncio.sleep(0)
        return 0, {}

    async def step(self, action):
        await asyncio.sleep(0)
        return 0, 0.0, False, False, {}


def burn(seconds: float) -> None:
    """Run on the CPU for ``seconds`` of this thread's CPU time (a CPU-bound env's work)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class EagerHog(PoliteEnv):
    """Holds the loop on the CPU before its first await (the part aiovec drives eagerly)."""

    async def step(self, action):
        burn(BLOCK)
        await asyncio.sleep(0)
        return 0, 0.0, False, False, {}


class LateHog(PoliteEnv):
    """Holds the loop on the CPU after an await (a slice its lane carries on)."""

    async def step(self, action):
        await asyncio.sleep(0)
        burn(BLOCK)
        return 0, 0.0, False, False, {}


class EagerSleeper(PoliteEnv):
    """The most common asyncio mistake: a synchronous sleep (or request) in ``async def step``.

    It blocks at its first step only: a hog that blocks once is named too.
    """

    def __init__(self):
        self.steps = 0

    async def step(self, action):
        self.steps += 1
        if self.steps == 1:
            time.sleep(BLOCK)  # noqa: ASYNC251  (the blocking call this test is about)
        await asyncio.sleep(0)
        return 0, 0.0, False, False, {}


class LateSleeper(PoliteEnv):
    """Blocks the loop after an await, in a synchronous call (a slice its lane carries on)."""

    async def step(self, action):
        await asyncio.sleep(0)
        time.sleep(BLOCK)  # noqa: ASYNC251  (the blocking call this test is about)
        return 0, 0.0, False, False, {}


class SyncHog(gymnasium.Env[int, int]):
    """A CPU-bound synchronous env on the inline backend."""

    observation_space = action_space = SPACE

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        burn(BLOCK)
        return 0, 0.0, False, False, {}


class SyncSleeper(SyncHog):
    """A blocking synchronous env (off the CPU while it holds the loop)."""

    def step(self, action):
        time.sleep(BLOCK)
        return 0, 0.0, False, False, {}


class SyncFine(SyncHog):
    def step(self, action):
        return 0, 0.0, False, False, {}


@pytest_asyncio.fixture
async def low_limit() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    before = loop.slow_callback_duration
    loop.slow_callback_duration = LIMIT
    yield
    loop.slow_callback_duration = before


def hog_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "held the event loop" in r.getMessage()]


def off_cpu_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "the event loop was held" in r.getMessage()]


def preempted_counters() -> Counters:
    """What the kernel says of a thread the OS keeps preempting: it never runs, never blocks."""
    preempted_counters.calls += 1  # type: ignore[attr-defined]
    return Counters(time.perf_counter(), 0.0, 0, preempted_counters.calls)  # type: ignore[attr-defined]


preempted_counters.calls = 0  # type: ignore[attr-defined]


def uncounted() -> Counters:
    """A platform that counts no context switches per thread (and a thread that never ran)."""
    return Counters(time.perf_counter(), 0.0, -1, -1)


async def run(fns, steps: int = 3) -> None:
    async with aiovec.AsyncioVectorEnv(fns) as venv:
        await venv.reset()
        for _ in range(steps):
            await venv.step(np.zeros(len(fns), np.int64))


@pytest.mark.parametrize("hog", [EagerHog, LateHog])
@pytest.mark.asyncio
async def test_async_envs_that_hold_the_loop_are_named_in_one_line(hog, low_limit, caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([PoliteEnv, hog, PoliteEnv, hog], steps=1)  # named from the first step
    # one line per vector env and call, not one per env (on a loaded machine a line
    # about a stretch the OS took may come too: it names no env)
    (warning,) = [r for r in caplog.records if "held the event loop" in r.getMessage()]
    message = warning.getMessage()
    assert re.match(r"envs 1, 3 held the event loop on the CPU for up to [0-9.]+ s ", message)
    assert "in step()" in message
    assert "slow_callback_duration, 0.02 s" in message
    assert "backend='thread'" in message
    assert "python -m aiovec bench" in message
    assert warning.name == "aiovec"
    assert warning.levelno == logging.WARNING


@pytest.mark.asyncio
async def test_a_cpu_bound_sync_env_on_inline_is_named(low_limit, caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([SyncFine, SyncFine, SyncHog])  # sync steps: named from the 2nd step on
    (warning,) = hog_warnings(caplog)
    assert warning.startswith("env 2 held the event loop on the CPU")


class OnceHog(SyncFine):
    """Holds the loop on its first step only (one stall, as a preempted step looks)."""

    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 1:
            burn(BLOCK)
        return super().step(action)


@pytest.mark.asyncio
async def test_after_a_stall_sync_steps_are_timed_env_by_env_only_for_a_while(
    low_limit, monkeypatch
):
    """Timing each env costs a clock read per env: a one-off stall must not cost it forever."""
    monkeypatch.setattr(inline, "TIMED_BATCHES", 3)
    async with aiovec.AsyncioVectorEnv([SyncFine, OnceHog]) as venv:
        await venv.reset()
        backend = venv._backend
        await venv.step(np.zeros(2, np.int64))  # the stall: find which env, from now on
        assert backend._time_each_step == 3
        for left in (2, 1, 0):
            await venv.step(np.zeros(2, np.int64))
            assert backend._time_each_step == left  # no env held the loop
    async with aiovec.AsyncioVectorEnv([SyncFine, SyncHog]) as venv:
        await venv.reset()
        for _ in range(5):
            await venv.step(np.zeros(2, np.int64))
        assert venv._backend._time_each_step == 3  # a hog keeps it timed


@pytest.mark.asyncio
async def test_a_cpu_bound_reset_is_named_at_once(low_limit, caplog):
    class SlowReset(SyncFine):
        def reset(self, *, seed=None, options=None):
            burn(BLOCK)
            return super().reset(seed=seed)

    caplog.set_level(logging.WARNING, logger="aiovec")
    async with aiovec.AsyncioVectorEnv([SyncFine, SlowReset]) as venv:
        await venv.reset()
        (warning,) = hog_warnings(caplog)
        assert warning.startswith("env 1 held the event loop")
        assert "in reset()" in warning
        await venv.step(np.zeros(2, np.int64))
        await venv.reset()  # said once per kind of call
    assert len(hog_warnings(caplog)) == 1


@pytest.mark.parametrize("sleeper", [EagerSleeper, LateSleeper])
@pytest.mark.asyncio
async def test_a_blocking_call_in_an_async_step_is_named_from_the_first_step(
    sleeper, low_limit, caplog
):
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([PoliteEnv, sleeper], steps=1)
    (message,) = hog_warnings(caplog)
    assert re.match(r"env 1 held the event loop in a blocking call for up to [0-9.]+ s ", message)
    assert "in step()" in message
    assert "time.sleep" in message
    assert "asyncio.to_thread" in message
    assert off_cpu_warnings(caplog) == []


@pytest.mark.asyncio
async def test_a_blocking_sync_env_on_inline_is_named(low_limit, caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([SyncFine, SyncSleeper], steps=2)  # sync steps: named from the 2nd step on
    (message,) = hog_warnings(caplog)
    assert message.startswith("env 1 held the event loop in a blocking call")
    assert "backend='thread'" in message


@pytest.mark.parametrize("sleeper", [EagerSleeper, LateSleeper, EagerHog, SyncSleeper])
@pytest.mark.asyncio
async def test_a_stretch_the_os_took_names_no_env(sleeper, low_limit, caplog, monkeypatch):
    """The thread was preempted and ran little (as the counters given say): no env is to blame."""
    monkeypatch.setattr(_log, "thread_counters", preempted_counters)
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([SyncFine if sleeper is SyncSleeper else PoliteEnv, sleeper], steps=3)
    assert hog_warnings(caplog) == []
    (message,) = off_cpu_warnings(caplog)
    assert re.match(r"the event loop was held for [0-9.]+ s in step\(\)", message)
    assert "but its thread ran on a CPU for only 0.000 s of it" in message
    assert re.search(r"the OS preempted it \d+ time\(s\) to run other work", message)
    assert "no env is named" in message
    assert "env 1" not in message


@pytest.mark.asyncio
async def test_without_switch_counters_a_stretch_off_the_cpu_names_no_env(
    low_limit, caplog, monkeypatch
):
    monkeypatch.setattr(_log, "thread_counters", uncounted)
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([PoliteEnv, LateSleeper], steps=2)
    assert hog_warnings(caplog) == []
    (message,) = off_cpu_warnings(caplog)
    assert "or a call blocked without awaiting" in message
    assert "this platform does not count which" in message


@pytest.mark.parametrize(
    ("held", "ran", "voluntary", "involuntary", "verdict"),
    [
        (0.5, 0.5, 0, 0, Verdict.CPU),  # ran the whole stretch
        (0.5, 0.05, 0, 9, Verdict.CPU),  # preempted, but ran a tenth of it: a CPU-bound env
        (0.5, 0.0, 1, 0, Verdict.BLOCKED),  # a sleep: off the CPU, never preempted
        (0.5, 0.0, 40, 0, Verdict.BLOCKED),  # a request: many waits
        (0.5, 0.01, 0, 0, Verdict.CPU),  # never off the CPU (an old reference ran little)
        (0.5, 0.0, 0, 1, Verdict.PREEMPTED),  # the OS took it
        (0.5, 0.0, 1, 1, Verdict.BLOCKED),  # blocked in the env's call, and preempted too
        (0.5, 0.04, 3, 2, Verdict.BLOCKED),
        (0.5, 0.0, -1, -1, Verdict.UNKNOWN),  # no counters on this platform
        (0.5, 0.05, -1, -1, Verdict.CPU),  # ...where the CPU time still names a CPU hog
    ],
)
def test_who_held_the_loop(held, ran, voluntary, involuntary, verdict):
    assert judge(held, ran, voluntary, involuntary) is verdict


def test_a_stretch_is_judged_from_the_counters_read_around_it(caplog):
    """CPU time before the stretch is never counted in it (the reference may be older)."""
    caplog.set_level(logging.WARNING, logger="aiovec")
    t = time.perf_counter() + 1_000.0  # (no collector pause is that late)
    readings = iter(
        [
            Counters(t, 1.0, 5, 5),  # the reference, 0.3 s before the stretch
            Counters(t + 0.8, 1.79, 5, 6),  # after it: 0.79 s of CPU since the reference
        ]
    )
    hogs = LoopHogs(lambda: next(readings))
    hogs.call = "step"
    hogs.slow(2, t + 0.3, t + 0.8)  # so at least 0.49 s within the 0.5 s stretch: on the CPU
    hogs.say()
    (message,) = hog_warnings(caplog)
    assert message.startswith("env 2 held the event loop on the CPU for up to 0.500 s")
    assert hogs.mark.at == t + 0.8  # the reading after a stretch is the next one's reference


@pytest.mark.asyncio
async def test_many_hogs_are_a_range_or_a_count_and_each_vector_env_says_its_own(low_limit, caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    async with (
        aiovec.AsyncioVectorEnv([EagerHog] * 7) as first,
        aiovec.AsyncioVectorEnv([EagerHog, PoliteEnv] * 6) as second,
    ):
        await first.reset()
        await second.reset()
        for _ in range(3):
            await first.step(np.zeros(7, np.int64))
            await second.step(np.zeros(12, np.int64))
    assert [m.split(" held")[0] for m in hog_warnings(caplog)] == ["envs 0-6", "6 envs"]


@pytest.mark.asyncio
async def test_envs_that_await_are_never_warned_about_and_nothing_is_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="aiovec")
    await run([PoliteEnv] * 4, steps=10)
    await run([SyncFine] * 4, steps=10)
    assert caplog.records == []


@pytest.mark.asyncio
async def test_the_limit_is_the_loops_slow_callback_duration():
    loop = asyncio.get_running_loop()
    assert slow_slice_limit() == loop.slow_callback_duration == 0.1  # asyncio's default
    loop.slow_callback_duration = 0.5
    assert slow_slice_limit() == 0.5
    loop.slow_callback_duration = 0.1


def test_without_a_loop_the_limit_is_asyncios_default():
    assert slow_slice_limit() == 0.1


class Hanging(PoliteEnv):
    async def step(self, action):
        await asyncio.Event().wait()


@pytest.mark.asyncio
async def test_a_timeout_is_logged_naming_the_env(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    async with aiovec.AsyncioVectorEnv([PoliteEnv, Hanging], step_timeout=0.05) as venv:
        await venv.reset()
        with pytest.raises(aiovec.EnvTimeoutError):
            await venv.step(np.zeros(2, np.int64))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "env 1 did not answer step() within 0.05 s; cancelled"


class Failing(PoliteEnv):
    async def step(self, action):
        raise TypeError("bad thing")


@pytest.mark.asyncio
async def test_a_restart_and_giving_up_are_logged(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    policy = aiovec.RestartPolicy(max_restarts=1, backoff=0.0)
    async with aiovec.AsyncioVectorEnv([PoliteEnv, Failing], on_error=policy) as venv:
        await venv.reset()
        await venv.step(np.zeros(2, np.int64))  # restarted
        assert [r.getMessage() for r in caplog.records] == [
            "env 1 failed in step(): TypeError: bad thing; restarting (an outage: more "
            "failures are counted, and said when every env answers its steps again)"
        ]
        await venv.step(np.zeros(2, np.int64))  # the autoreset after the restart
        with pytest.raises(aiovec.EnvError, match="restart limit reached"):
            await venv.step(np.zeros(2, np.int64))
    assert caplog.records[-1].getMessage() == (
        "env 1: giving up: restart limit reached: env 1 failed 2 times in a row, never 5 "
        "clean steps between, RestartPolicy(max_restarts=1): a crash loop "
        "(1 restarts; 1 failures: TypeError x1)"
    )
    assert len(caplog.records) == 2


class Flaky(PoliteEnv):
    """Fails its steps while ``Flaky.down`` holds its index, as envs of a flaky server."""

    down: frozenset[int] = frozenset()

    def __init__(self, index):
        self.index = index

    async def step(self, action):
        await asyncio.sleep(0)
        if self.index in Flaky.down:
            raise ConnectionResetError(f"env {self.index} lost its server")
        return 0, 0.0, False, False, {}


def flaky(indices):
    return [functools.partial(Flaky, i) for i in indices]


@pytest.mark.asyncio
async def test_restarts_are_said_per_outage_with_counts_not_per_env_and_step(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    policy = aiovec.RestartPolicy(max_restarts=100, backoff=0.0)
    schedule = [set(), {1, 4}, {2}, {1, 2, 3}, {5}, {0}, set(), set(), set(), {3}, set(), set()]
    async with aiovec.AsyncioVectorEnv(flaky(range(6)), on_error=policy) as venv:
        await venv.reset()
        for down in schedule:
            Flaky.down = frozenset(down)
            await venv.step(np.zeros(6, np.int64))
    messages = [r.getMessage() for r in caplog.records]
    # two outages (steps 1-5, step 9), each said as it starts and as it ends
    assert len(messages) == 4, messages
    assert messages[0].startswith(
        "envs 1, 4 failed in step(): ConnectionResetError: env 1 lost its server; restarting"
    )
    assert re.fullmatch(
        r"envs 0-5 back after [0-9.e-]+ s \(7 restarts; 7 failures: ConnectionResetError x7\)",
        messages[1],
    )  # (env 1's and 2's autoreset steps after their restarts were not steps of theirs)
    assert messages[2].startswith("env 3 failed in step()")
    assert re.fullmatch(r"env 3 back after .* \(1 restarts; 1 failures: .*\)", messages[3])


@pytest.mark.asyncio
async def test_frequent_outages_are_summed_up_not_said_one_by_one(caplog, monkeypatch):
    """A fault rate (an outage every 3 s here) is not two lines per fault.

    The outages' clock is the restarter's; the test moves it on by hand.
    """
    from aiovec import _restarter
    from aiovec._core.restart import FREQUENT, SUMMARY_EVERY

    clock = [0.0]
    monkeypatch.setattr(_restarter, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    caplog.set_level(logging.WARNING, logger="aiovec")
    policy = aiovec.RestartPolicy(backoff=0.0)
    outages = 30
    async with aiovec.AsyncioVectorEnv(flaky(range(6)), on_error=policy) as venv:
        await venv.reset()
        for k in range(outages + 1):
            if k == outages:
                clock[0] += SUMMARY_EVERY * 2  # quiet for a while: outages are rare again
            Flaky.down = frozenset({k % 6})
            await venv.step(np.zeros(6, np.int64))
            Flaky.down = frozenset()
            for _ in range(3):  # the outage ends
                await venv.step(np.zeros(6, np.int64))
            clock[0] += 3.0
    messages = [r.getMessage() for r in caplog.records]
    own = 2 * FREQUENT  # the first outages say their start and end
    assert [m.endswith(" sums them up)") for m in messages[own : own + 1]] == [True]
    summaries = [m for m in messages if " outages in " in m]
    # one line a minute while outages are frequent, and a last one when they are rare again
    assert len(summaries) == 2, messages
    assert re.fullmatch(
        r"envs 0-5: \d+ outages in [0-9.]+ s, each ended \(\d+ restarts; \d+ failures: "
        r"ConnectionResetError x\d+\); one line every 60 s sums them up",
        summaries[0],
    )
    assert summaries[1].endswith("; outages are rare again: each is said")
    assert sum(int(m.split(": ")[1].split()[0]) for m in summaries) == outages - FREQUENT
    assert messages[-2].startswith("env 0 failed in step()")  # said on its own again
    assert messages[-1].startswith("env 0 back after")
    assert len(messages) == own + 1 + 2 + 2


@pytest.mark.asyncio
async def test_two_vector_envs_say_their_outages_apart(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    policy = aiovec.RestartPolicy(backoff=0.0)
    async with (
        aiovec.AsyncioVectorEnv(flaky(range(3)), on_error=policy) as first,
        aiovec.AsyncioVectorEnv(flaky(range(3, 6)), on_error=policy) as second,
    ):
        await first.reset()
        await second.reset()
        Flaky.down = frozenset({4})  # env 1 of the second
        await first.step(np.zeros(3, np.int64))
        await second.step(np.zeros(3, np.int64))
        Flaky.down = frozenset()
        for _ in range(2):
            await first.step(np.zeros(3, np.int64))  # no outage of its own to end
        assert len(caplog.records) == 1
        for _ in range(2):
            await second.step(np.zeros(3, np.int64))
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("env 1 failed in step()")
    assert messages[1].startswith("env 1 back after")
    assert len(messages) == 2


@pytest.mark.asyncio
async def test_a_timeout_under_restart_is_counted_in_the_outage_not_said_alone(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    policy = aiovec.RestartPolicy(backoff=0.0)
    async with aiovec.AsyncioVectorEnv(
        [PoliteEnv, Hanging], step_timeout=0.05, on_error=policy
    ) as venv:
        await venv.reset()
        await venv.step(np.zeros(2, np.int64))
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "env 1 failed in step(): TimeoutError: env 1 did not answer step() within 0.05 s; "
        "restarting"
    )


def test_aiovec_adds_no_handler_of_its_own():
    """The logging HOWTO: a library leaves handlers to the application."""
    assert logging.getLogger("aiovec").handlers == []


class Collecting(PoliteEnv):
    """Its step runs a full collection, as an allocation in any env may: a long pause
    that is the collector's, not the env's (``garbage`` makes it long)."""

    pauses: list[float] = []  # noqa: RUF012  (what the test reads back)

    async def step(self, action):
        start = time.perf_counter()
        gc.collect()
        self.pauses.append(time.perf_counter() - start)
        await asyncio.sleep(0)
        return 0, 0.0, False, False, {}


@pytest.mark.asyncio
async def test_a_garbage_collection_inside_an_envs_stretch_is_not_the_envs(low_limit, caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    garbage = [[] for _ in range(1_500_000)]  # many tracked objects: a long collection
    Collecting.pauses.clear()
    await run([PoliteEnv, Collecting, PoliteEnv], steps=3)
    assert max(Collecting.pauses) > LIMIT  # each pause was over the limit...
    assert hog_warnings(caplog) == []  # ...and nobody was blamed for it
    del garbage


class Waiting(PoliteEnv):
    async def step(self, action):
        await asyncio.sleep(0.005)
        return 0, 0.0, False, False, {}


class CpuHog(PoliteEnv):
    async def step(self, action):
        burn(0.25)
        await asyncio.sleep(0)
        return 0, 0.0, False, False, {}


@pytest.mark.timeout(180)
@pytest.mark.asyncio
async def test_twenty_thousand_waiting_envs_are_never_called_hogs(caplog):
    # the default limit and the default collector settings: the generation-2
    # collections over 20,000 envs' objects used to be blamed on some env
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([Waiting] * 20_000, steps=10)
    assert hog_warnings(caplog) == []


@pytest.mark.asyncio
async def test_a_real_hog_among_many_waiting_envs_is_named_at_the_default_limit(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    await run([Waiting] * 500 + [CpuHog] + [Waiting] * 499, steps=2)
    (warning,) = hog_warnings(caplog)
    assert re.match(r"env 500 held the event loop on the CPU for up to [0-9.]+ s ", warning)


def test_a_block_with_a_preemption_is_named_saying_the_os_may_share_it(caplog):
    caplog.set_level(logging.WARNING, logger="aiovec")
    t = time.perf_counter() + 1_000.0
    readings = iter([Counters(t, 1.0, 5, 5), Counters(t + 0.5, 1.0, 6, 6)])
    hogs = LoopHogs(lambda: next(readings))
    hogs.call = "reset"
    hogs.slow(0, t, t + 0.5)
    hogs.say()
    (message,) = hog_warnings(caplog)
    assert message.startswith("env 0 held the event loop in a blocking call for up to 0.500 s")
    assert "in reset()" in message
    assert "the OS also preempted it 1 time(s), so some of that time may be the OS's" in message


def test_a_reference_read_on_another_thread_judges_nothing(caplog):
    """A vector env used from another thread than the last reading's: no verdict at all."""
    caplog.set_level(logging.WARNING, logger="aiovec")
    t = time.perf_counter() + 1_000.0
    readings = iter([Counters(t, 1.0, 5, 5, thread=1), Counters(t + 0.5, 1.0, 6, 5, thread=2)])
    hogs = LoopHogs(lambda: next(readings))
    hogs.slow(0, t, t + 0.5)  # it blocked, say the counters: of two threads
    assert not hogs.noted
    assert hogs.mark.thread == 2  # the next stretch compares with this thread's reading
