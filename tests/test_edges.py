"""Edge sequences through both front ends: resets at odd times, close, failures, copies, order."""

from __future__ import annotations

import asyncio
import copy
import functools

import gymnasium
import numpy as np
import pytest
from conftest import (
    BACKENDS,
    LOCAL_BACKENDS,
    MODES,
    Lockstep,
    assert_same,
    counters,
    open_front_end,
    space_env_fns,
)
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.testing import AsyncTwin, FaultyEnv, SpaceEnv

IN_LOOP_BACKENDS = [b for b in BACKENDS if b in {"inline", "thread"}]


def step_until_an_env_ends(lock: Lockstep, limit: int = 30) -> np.ndarray:
    for _ in range(limit):
        lock.step()
        if lock.ended().any():
            return lock.ended()
    raise AssertionError(f"no env ended within {limit} steps")


# --------------------------------------------------------------------------- resets


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_reset_right_after_an_episode_ended(make_lockstep, mode):
    lock = make_lockstep(space_env_fns(4, min_len=2, max_len=5), autoreset_mode=mode)
    lock.reset(seed=10)
    for seed in (None, 99):
        step_until_an_env_ends(lock)
        lock.reset(seed=seed)
        # The next step is a real step for every env, never a pending autoreset.
        _, rewards, _, _, _ = lock.step()
        assert (rewards != 0).all()
        for _ in range(6):
            lock.step()
            if mode is AutoresetMode.DISABLED and lock.ended().any():
                lock.reset(options={"reset_mask": lock.ended()})


def test_reset_twice(make_lockstep):
    lock = make_lockstep(space_env_fns(3, "dict-tuple", min_len=1, max_len=4), action_seed=3)
    lock.reset(seed=1)
    lock.reset(seed=2)
    for _ in range(5):
        lock.step()
    lock.reset()
    lock.reset(seed=[4, 5, 6])
    for _ in range(5):
        lock.step()


@pytest.mark.parametrize(
    "mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=["NextStep", "SameStep"]
)
def test_reset_mask_after_an_env_ended(make_lockstep, mode):
    lock = make_lockstep(space_env_fns(4, min_len=1, max_len=4), autoreset_mode=mode)
    lock.reset(seed=5)
    for round_ in range(3):
        ended = step_until_an_env_ends(lock)
        # Reset the ended envs (their pending autoreset is dropped) ...
        lock.reset(options={"reset_mask": ended})
        lock.step()
        # ... and, another time, an env that had not ended together with one that had.
        ended = step_until_an_env_ends(lock)
        mask = ended.copy()
        mask[(int(np.argmax(ended)) + 1) % 4] = True
        lock.reset(seed=round_, options={"reset_mask": mask})
        lock.step()


def test_disabled_mode_refuses_to_step_an_env_that_ended(make_lockstep):
    """DISABLED: stepping an env that ended without resetting it is refused, untouched."""
    lock = make_lockstep(space_env_fns(3, min_len=1, max_len=3), autoreset_mode="Disabled")
    lock.reset(seed=0)
    ended = step_until_an_env_ends(lock)
    before = counters(lock.venv)
    with pytest.raises(ValueError, match="reset"):
        lock.venv.step(lock.sample())
    assert counters(lock.venv) == before, "no env may be touched"
    lock.reset(options={"reset_mask": ended})
    lock.step()


# --------------------------------------------------------------------------- lifecycle


def test_render_call_get_attr_set_attr_leave_the_env_ready(make_venv, make_oracle):
    """Inspecting calls, before and after the first reset, never block the next call."""
    fns = space_env_fns(2)
    lock = Lockstep(make_venv(fns), make_oracle(fns))
    lock.get_attr("tag")
    lock.render()
    lock.call("add", 1)
    lock.set_attr("tag", "x")
    lock.reset(seed=0)
    for inspect in (
        lambda: lock.get_attr("tag"),
        lock.render,
        lambda: lock.call("add", 2),
        lambda: lock.set_attr("tag", "y"),
    ):
        inspect()
        lock.step()


def test_close_twice(make_venv):
    venv = make_venv(space_env_fns(2))
    venv.reset(seed=0)
    assert venv.closed is False
    venv.close()
    assert venv.closed is True
    venv.close()  # idempotent
    assert venv.closed is True


def test_close_before_reset(make_venv):
    venv = make_venv(space_env_fns(2))
    venv.close()
    assert venv.closed is True


CALLS_AFTER_CLOSE = {
    "reset": lambda v: v.reset(seed=0),
    "step": lambda v: v.step(np.zeros(2, dtype=np.int64)),
    "render": lambda v: v.render(),
    "call": lambda v: v.call("add", 1),
    "get_attr": lambda v: v.get_attr("tag"),
    "set_attr": lambda v: v.set_attr("tag", "x"),
}


@pytest.mark.parametrize("operation", list(CALLS_AFTER_CLOSE))
def test_any_call_after_close_raises_closed_error(make_venv, operation):
    venv = make_venv(space_env_fns(2))
    venv.reset(seed=0)
    venv.step(np.zeros(2, dtype=np.int64))
    venv.close()
    with pytest.raises(aiovec.ClosedError) as info:
        CALLS_AFTER_CLOSE[operation](venv)
    assert isinstance(info.value, gymnasium.error.ClosedEnvironmentError)
    assert isinstance(info.value, aiovec.StateError)
    assert isinstance(info.value, ValueError)
    assert venv.closed is True


def test_step_before_reset_raises_state_error(make_venv, make_oracle):
    fns = space_env_fns(3)
    venv = make_venv(fns)
    before = counters(venv)
    with pytest.raises(aiovec.StateError, match="reset"):
        venv.step(np.zeros(3, dtype=np.int64))
    assert counters(venv) == before, "no env may be touched"
    lock = Lockstep(venv, make_oracle(fns))
    lock.reset(seed=1)
    lock.step()


# --------------------------------------------------------------------------- failures


def faulty_fns(num_envs: int, failing: dict[int, BaseException], **kwargs):
    """SpaceEnv factories; env ``i`` in ``failing`` raises its error on its 2nd step."""
    fns = space_env_fns(num_envs, **kwargs)
    return [
        functools.partial(_faulty, fn, failing[i]) if i in failing else fn
        for i, fn in enumerate(fns)
    ]


def _faulty(fn, error):
    return FaultyEnv(fn(), method="step", at=2, error=error)


def assert_cause(venv, actual: BaseException, expected: BaseException) -> None:
    if venv.backend in IN_LOOP_BACKENDS:
        assert actual is expected
    else:  # crossed a process boundary: an equal copy
        assert type(actual) is type(expected)
        assert actual.args == expected.args


def test_env_failure_is_named_then_reset_recovers(make_venv, make_oracle):
    error = RuntimeError("boom in env 1")
    fns = faulty_fns(4, {1: error}, min_len=3, max_len=6)
    venv = make_venv(fns)
    venv.reset(seed=3)
    venv.step(np.array([0, 1, 2, 0]))
    with pytest.raises(aiovec.EnvError) as info:
        venv.step(np.array([1, 1, 1, 1]))
    exc = info.value
    assert exc.env_index == 1
    assert set(exc.errors) == {1}
    assert_cause(venv, exc.errors[1], error)
    assert_cause(venv, exc.__cause__, error)
    assert "1" in str(exc)

    if venv.front_end == "await" and venv.backend in IN_LOOP_BACKENDS:
        # No env call of the failed step goes on in the background.
        settled = inner_steps(venv)
        venv.run(_spin())
        assert inner_steps(venv) == settled, "a failed step must leave no call in flight"

    # Broken: only reset() (or close()) now; the message says so.
    with pytest.raises(aiovec.StateError, match="reset"):
        venv.step(np.array([1, 1, 1, 1]))
    with pytest.raises(aiovec.StateError, match="reset"):
        venv.step(np.array([1, 1, 1, 1]))

    # Every env has been reset exactly once so far (no episode had ended): prime a
    # fresh oracle alike, then both must agree from the same seeds on.
    oracle = make_oracle(space_env_fns(4, min_len=3, max_len=6))
    oracle.reset(seed=0)
    lock = Lockstep(venv, oracle, action_seed=5)
    lock.reset(seed=77)
    for _ in range(8):
        lock.step()


async def _spin(times: int = 50) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


def inner_steps(venv) -> list[int]:
    """Each env's SpaceEnv step counter, read through ``venv.envs`` and any wrappers."""
    counts = []
    for outer in venv.envs:
        env = outer
        while hasattr(env, "env"):
            env = env.env
        counts.append(env.episode_steps)
    return counts


def test_two_envs_failing_in_one_step_are_both_reported(make_venv):
    errors = {3: ValueError("env 3 broke"), 1: KeyError("env 1 broke")}
    venv = make_venv(faulty_fns(5, errors, min_len=3, max_len=6))
    venv.reset(seed=0)
    venv.step(np.zeros(5, dtype=np.int64))
    with pytest.raises(aiovec.EnvError) as info:
        venv.step(np.zeros(5, dtype=np.int64))
    exc = info.value
    assert exc.env_index == 1
    assert sorted(exc.errors) == [1, 3]
    for i, error in errors.items():
        assert_cause(venv, exc.errors[i], error)
    assert_cause(venv, exc.__cause__, errors[1])
    with pytest.raises(aiovec.StateError, match="reset"):
        venv.step(np.zeros(5, dtype=np.int64))
    venv.reset(seed=1)
    venv.step(np.zeros(5, dtype=np.int64))


def test_failing_reset_is_named_then_reset_recovers(make_venv, make_oracle):
    error = OSError("connection refused")
    fns = space_env_fns(3, min_len=2, max_len=4)
    fns[2] = functools.partial(_faulty_reset, fns[2], error)
    venv = make_venv(fns)
    with pytest.raises(aiovec.EnvError) as info:
        venv.reset(seed=1)
    assert info.value.env_index == 2
    assert set(info.value.errors) == {2}
    assert_cause(venv, info.value.__cause__, error)
    with pytest.raises(aiovec.StateError, match="reset"):
        venv.step(np.zeros(3, dtype=np.int64))

    # How many episodes each env had started differs after the failed reset (the
    # others may have been cancelled or not): the info keys derived from that count
    # are left out, everything else must agree with a fresh oracle.
    ignore = frozenset({("nested", "episodes"), ("label",)})
    oracle = make_oracle(space_env_fns(3, min_len=2, max_len=4))
    lock = Lockstep(venv, oracle, action_seed=2, ignore=ignore)
    lock.reset(seed=50)
    for _ in range(8):
        lock.step()


def _faulty_reset(fn, error):
    return FaultyEnv(fn(), method="reset", at=1, error=error)


# --------------------------------------------------------------------------- copies


@pytest.mark.parametrize("space", ["box-discrete", "nested-dict-of-tuple"])
@pytest.mark.parametrize(
    "mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=["NextStep", "SameStep"]
)
def test_copy_true_results_are_never_mutated(make_lockstep, space, mode):
    lock = make_lockstep(space_env_fns(3, space, min_len=1, max_len=3), autoreset_mode=mode)
    kept = [lock.venv.reset(seed=4)]
    lock.oracle.reset(seed=4)
    for _ in range(6):
        kept.append(lock.step_pair()[0])
    snapshot = copy.deepcopy(kept)
    for _ in range(6):
        lock.step()
    lock.reset(seed=5)
    for result, saved in zip(kept, snapshot, strict=True):
        assert_same(result, saved)


@pytest.mark.parametrize("space", ["box-discrete", "nested-dict-of-tuple"])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
def test_copy_false_results_are_right_when_returned(make_lockstep, space, mode):
    fns = space_env_fns(3, space, min_len=1, max_len=3)
    lock = make_lockstep(fns, autoreset_mode=mode, copy=False, action_seed=9)
    lock.reset(seed=4)
    for _ in range(10):
        lock.step()
        if mode is AutoresetMode.DISABLED and lock.ended().any():
            lock.reset(options={"reset_mask": lock.ended()})


# --------------------------------------------------------------------------- order


class RecordingTwin(AsyncTwin):
    """An AsyncTwin that appends its index to ``log`` when its step or reset completes."""

    def __init__(self, env, index, log, **kwargs):
        super().__init__(env, **kwargs)
        self.index, self.log = index, log

    async def step(self, action):
        result = await super().step(action)
        self.log.append(self.index)
        return result

    async def reset(self, *, seed=None, options=None):
        result = await super().reset(seed=seed, options=options)
        self.log.append(self.index)
        return result


def _recording(fn, index, log):
    return RecordingTwin(fn(), index, log, max_yields=12, seed=index * 31 + 1)


@pytest.mark.async_envs
def test_results_ordered_by_env_index_whatever_the_finish_order(backend, front_end, make_oracle):
    fns = space_env_fns(8, "dict-tuple", min_len=2, max_len=6)
    log: list[int] = []
    twins = [functools.partial(_recording, fn, i, log) for i, fn in enumerate(fns)]
    venv = open_front_end(front_end, twins, backend=backend)
    try:
        lock = Lockstep(venv, make_oracle(fns), action_seed=12)
        lock.reset(seed=3)
        finish_orders = []
        for _ in range(10):
            del log[:]
            lock.step()
            finish_orders.append(list(log))
        if backend in IN_LOOP_BACKENDS:
            # (NEXT_STEP: an env that ended is reset instead of stepped: one call each.)
            assert all(sorted(order) == list(range(8)) for order in finish_orders)
            assert any(order != sorted(order) for order in finish_orders), (
                "the twins should have finished out of order at least once"
            )
    finally:
        venv.shutdown()


# --------------------------------------------------------------------------- in flight


class GateEnv(aiovec.AsyncEnv):
    """An async env whose ``step`` waits until the shared gate opens."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.steps = 0

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        return self.observation_space.sample(), {}

    async def step(self, action):
        await self.gate.wait()
        self.steps += 1
        return np.full(2, self.steps / 10, np.float32), 1.0, False, False, {}


@pytest.mark.asyncio
@pytest.mark.async_envs
@pytest.mark.parametrize("backend", IN_LOOP_BACKENDS)
async def test_second_step_while_one_is_in_flight_raises(backend):
    gate = asyncio.Event()
    fns = [functools.partial(GateEnv, gate) for _ in range(2)]
    async with aiovec.AsyncioVectorEnv(fns, backend=backend) as venv:
        await venv.reset(seed=0)
        first = asyncio.create_task(venv.step(np.array([0, 1])))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not first.done()
        with pytest.raises(aiovec.StateError):
            await venv.step(np.array([1, 0]))
        gate.set()
        obs, rewards, *_ = await first
        np.testing.assert_array_equal(rewards, [1.0, 1.0])
        np.testing.assert_array_equal(obs, np.full((2, 2), 0.1, np.float32))
        # The rejected call touched nothing; the env goes on normally.
        obs, *_ = await venv.step(np.array([1, 0]))
        np.testing.assert_array_equal(obs, np.full((2, 2), 0.2, np.float32))
    assert venv.closed


@pytest.mark.asyncio
@pytest.mark.async_envs
@pytest.mark.parametrize("backend", IN_LOOP_BACKENDS)
async def test_cancelled_step_leaves_a_clear_state(backend):
    gate = asyncio.Event()
    fns = [functools.partial(GateEnv, gate) for _ in range(3)]
    async with aiovec.AsyncioVectorEnv(fns, backend=backend) as venv:
        await venv.reset(seed=0)
        task = asyncio.create_task(venv.step(np.array([0, 1, 0])))
        for _ in range(3):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()  # a call still in flight would now complete and count a step
        await _spin()
        assert [env.steps for env in venv.envs] == [0, 0, 0], "no call may survive the cancel"
        with pytest.raises(aiovec.StateError, match="reset"):
            await venv.step(np.array([0, 1, 0]))
        await venv.reset(seed=1)
        _, rewards, *_ = await venv.step(np.array([0, 1, 0]))
        np.testing.assert_array_equal(rewards, [1.0, 1.0, 1.0])


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", LOCAL_BACKENDS)  # local factories, built directly
async def test_async_with_closes(backend):
    fns = space_env_fns(2)
    async with aiovec.AsyncioVectorEnv(fns, backend=backend) as venv:
        assert venv.closed is False
        await venv.reset(seed=0)
    assert venv.closed is True
    with pytest.raises(aiovec.ClosedError):
        await venv.reset(seed=0)


@pytest.mark.parametrize("backend", IN_LOOP_BACKENDS)  # where the envs live in this process
def test_envs_property_lists_the_envs(make_venv, backend):
    venv = make_venv(space_env_fns(3))
    envs = venv.envs
    assert len(envs) == 3
    inner = [getattr(env, "env", env) for env in envs]
    assert all(isinstance(env, SpaceEnv) for env in inner)


# --------------------------------------------------------------------------- garbage collection


class _DropsOnStep(SpaceEnv):
    """Empties ``holder`` as it steps: the last reference to another vector env goes there."""

    def __init__(self, holder: list[object]) -> None:
        super().__init__()
        self.holder = holder

    def step(self, action):
        self.holder.clear()
        return super().step(action)


class _SuspendsThenDrops(aiovec.AsyncEnv):
    """An async env whose step waits on the loop (which then runs), then empties ``holder``."""

    def __init__(self, holder: list[object]) -> None:
        self.env = _DropsOnStep(holder)
        self.observation_space, self.action_space = (
            self.env.observation_space,
            self.env.action_space,
        )

    async def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    async def step(self, action):
        await asyncio.sleep(0)
        return self.env.step(action)


@pytest.mark.parametrize("dropped_backend", ["inline", "process"])
@pytest.mark.parametrize("caller", [_DropsOnStep, _SuspendsThenDrops])
def test_a_vector_env_collected_inside_another_ones_call_closes_cleanly(caller, dropped_backend):
    """Its loop is closed, nothing is left unawaited; only its "never closed" warning comes."""
    holder: list[object] = [aiovec.BlockingVectorEnv([SpaceEnv], backend=dropped_backend)]
    dropped = holder[0]
    dropped.reset(seed=0)
    loop = dropped._runner._loop
    del dropped
    venv = aiovec.BlockingVectorEnv([functools.partial(caller, holder)])
    venv.reset(seed=0)
    with pytest.warns(ResourceWarning) as caught:
        venv.step(np.zeros(1, np.int64))  # the dropped one is collected inside this call
    venv.close()
    assert not holder
    assert loop.is_closed()
    assert [str(w.message).split(" was ")[0] for w in caught] == [
        f"BlockingVectorEnv(AsyncioVectorEnv(num_envs=1, backend='{dropped_backend}', state=READY))"
    ]
