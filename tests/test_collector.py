"""``aiovec.Collector``: segments checked against each env stepped alone (the oracle).

Every backend x front end x autoreset mode: each env's concatenated segments
must be what that env gives when reset with its seed and stepped alone with
the same actions, through gymnasium's own ``reset``/``step``.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from conftest import MODES, SPACES, open_front_end, random_policy, space_env_fns
from faults.leaks import LeakCheck
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.testing import AsyncHangingEnv, AsyncTwin, FaultyEnv, Gate, SpaceEnv

N = 4
SPACE = SPACES["box-discrete"]
LENGTH = 5


def run_collector(
    adapter: Any,
    policy: Callable[..., Any],
    batches: int,
    *,
    each: Callable[[aiovec.Collector, aiovec.SegmentBatch], None] | None = None,
    **kwargs: Any,
) -> list[aiovec.SegmentBatch]:
    """``batches`` batches of a collector over ``adapter``'s vector env, on either front end."""
    kwargs.setdefault("segment_length", LENGTH)
    kwargs.setdefault("batch_size", 3)
    collector = aiovec.Collector(adapter.venv, policy, seed=10, **kwargs)
    got: list[aiovec.SegmentBatch] = []
    if adapter.front_end == "blocking":  # a `break` closes the iterator, and so the collector
        for batch in collector:
            got.append(batch)
            if each is not None:
                each(collector, batch)
            if len(got) == batches:
                break
        return got

    async def main() -> None:
        async with collector:
            async for batch in collector:
                got.append(batch)
                if each is not None:
                    each(collector, batch)
                if len(got) == batches:
                    break

    adapter.run(main())
    return got


def trajectories(batches: Sequence[aiovec.SegmentBatch]) -> dict[int, dict[str, np.ndarray]]:
    """Each env's segments, concatenated in the order they came."""
    out: dict[int, dict[str, list[Any]]] = {}
    for batch in batches:
        for b, i in enumerate(batch.env_ids.tolist()):
            parts = out.setdefault(i, {})
            for name in ("obs", "actions", "rewards", "terminations", "truncations", "next_obs"):
                parts.setdefault(name, []).append(getattr(batch, name)[b])
            parts.setdefault("tag", []).append(batch.extras["tag"][b])
    return {i: {k: np.concatenate(v) for k, v in p.items()} for i, p in out.items()}


def replay(fn: Callable[[], Any], seed: int, actions: np.ndarray) -> dict[str, list[Any]]:
    """The env stepped alone: reset with ``seed``, then ``actions``, resetting at each end."""
    env = fn()
    got: dict[str, list[Any]] = {k: [] for k in ("obs", "rewards", "term", "trunc", "next_obs")}
    obs, _ = env.reset(seed=seed)
    for action in actions:
        got["obs"].append(obs)
        nxt, reward, term, trunc, _ = env.step(action)
        for key, value in zip(
            ("rewards", "term", "trunc", "next_obs"), (reward, term, trunc, nxt), strict=False
        ):
            got[key].append(value)
        obs = env.reset()[0] if term or trunc else nxt
    env.close()
    return got


def check_oracle(fns: Sequence[Callable[[], Any]], batches: Sequence[aiovec.SegmentBatch]) -> None:
    trajs = trajectories(batches)
    assert len(trajs) > 1
    for i, t in trajs.items():
        want = replay(fns[i], 10 + i, t["actions"])
        np.testing.assert_array_equal(t["obs"], np.array(want["obs"]), err_msg=f"env {i} obs")
        np.testing.assert_array_equal(t["next_obs"], np.array(want["next_obs"]))
        np.testing.assert_array_equal(t["rewards"], np.array(want["rewards"]))
        np.testing.assert_array_equal(t["terminations"], np.array(want["term"]))
        np.testing.assert_array_equal(t["truncations"], np.array(want["trunc"]))
        assert (t["tag"] == 10 * i).all()  # the policy's extras stay with their env


@pytest.mark.parametrize("mode", MODES)
def test_segments_are_each_env_stepped_alone(
    backend: str, front_end: str, flavour: str, mode: AutoresetMode
) -> None:
    fns = space_env_fns(N, max_len=4)
    adapter = open_front_end(front_end, fns, flavour=flavour, backend=backend, autoreset_mode=mode)
    try:
        batches = run_collector(adapter, random_policy(adapter.venv.single_action_space), 6)
    finally:
        adapter.shutdown()
    check_oracle(fns, batches)
    assert all(b.obs.shape == (3, LENGTH, 3) for b in batches)


def _delayed(fn: Callable[[], Any], i: int) -> AsyncTwin:
    return AsyncTwin(fn(), max_yields=0, max_delay=0.004 * (i % 3), seed=i)


@pytest.mark.parametrize("front_end", ["await", "blocking"])
def test_segments_with_random_per_env_delays(front_end: str) -> None:
    """Envs with random per-env delays (0, up to 4 ms, up to 8 ms): segments still exact."""
    fns = space_env_fns(6, max_len=4)
    delayed = [functools.partial(_delayed, fn, i) for i, fn in enumerate(fns)]
    adapter = open_front_end(front_end, delayed)
    try:
        batches = run_collector(adapter, random_policy(adapter.venv.single_action_space), 8)
    finally:
        adapter.shutdown()
    check_oracle(fns, batches)


@pytest.mark.parametrize("front_end", ["await", "blocking"])
def test_no_reset_row_is_a_transition(front_end: str) -> None:
    """Under NEXT_STEP every transition's obs is one the env's step was taken from."""
    fns = space_env_fns(N, max_len=2)
    adapter = open_front_end(front_end, fns)
    try:
        batches = run_collector(adapter, random_policy(adapter.venv.single_action_space), 4)
    finally:
        adapter.shutdown()
    for batch in batches:
        assert batch.rewards.min() > 0  # SpaceEnv's rewards are > 0; a reset row's is 0
    check_oracle(fns, batches)


def versions_seen(front_end: str, **kwargs: Any) -> list[tuple[int, np.ndarray]]:
    """(policy version, batch.versions) of 5 batches, the policy updated after each."""
    adapter = open_front_end(front_end, space_env_fns(N, max_len=4))
    seen: list[tuple[int, np.ndarray]] = []

    def each(collector: aiovec.Collector, batch: aiovec.SegmentBatch) -> None:
        seen.append((collector.policy_version, batch.versions))
        collector.update_policy()

    try:
        policy = random_policy(adapter.venv.single_action_space)
        run_collector(adapter, policy, 5, each=each, **kwargs)
    finally:
        adapter.shutdown()
    assert [v for v, _ in seen] == list(range(5))
    return seen


def test_versions_and_max_lag(front_end: str) -> None:
    """Each transition records its policy's version; max_lag keeps stale segments out."""
    for version, versions in versions_seen(front_end, max_lag=0):
        assert (versions == version).all()


def test_without_max_lag_old_versions_are_kept(front_end: str) -> None:
    assert any((versions < version).any() for version, versions in versions_seen(front_end))


class Lengths:
    """A curriculum: episode ``e`` of env ``i`` lasts ``1 + (i + e) % 3`` steps."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def __call__(self, env_id: int, episode: int) -> dict[str, Any]:
        self.asked.append((env_id, episode))
        return {"length": 1 + (env_id + episode) % 3}


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_reset_options_reach_every_autoreset(backend: str, front_end: str, mode: Any) -> None:
    fns = space_env_fns(N, min_len=9, max_len=9)
    adapter = open_front_end(front_end, fns, backend=backend, autoreset_mode=mode)
    hook = Lengths()
    try:
        batches = run_collector(
            adapter, random_policy(adapter.venv.single_action_space), 4, reset_options=hook
        )
    finally:
        adapter.shutdown()
    for i, t in trajectories(batches).items():
        ends = np.flatnonzero(t["terminations"] | t["truncations"])
        lengths = np.diff(np.concatenate([[-1], ends]))
        want = [1 + (i + e) % 3 for e in range(len(lengths))]
        assert lengths.tolist() == want
    assert len(hook.asked) == len(set(hook.asked))  # each episode asked once


def test_reset_options_on_the_vector_env_alone(front_end: str) -> None:
    """The hook without a collector: autoresets by step() get it too; reset() merges."""
    fns = space_env_fns(2, min_len=9, max_len=9)
    hook = Lengths()
    adapter = open_front_end(front_end, fns, reset_options=hook)
    try:
        adapter.reset(seed=0, options={"other": 1})
        lengths = [0, 0]
        for _ in range(6):
            _, _, term, trunc, _ = adapter.step(np.zeros(2, np.int64))
            for i in np.flatnonzero(term | trunc).tolist():
                lengths[i] += 1
        assert hook.asked[:2] == [(0, 0), (1, 0)]
        assert (0, 1) in hook.asked
        assert (1, 1) in hook.asked
        adapter.reset(options={"length": 7})  # explicit options override the hook's
    finally:
        adapter.shutdown()
    assert lengths[0] >= 2  # episode 0 of env 0 lasts 1 step, then NEXT_STEP resets it


def test_reset_options_must_return_a_dict() -> None:
    adapter = open_front_end("blocking", space_env_fns(2), reset_options=lambda i, e: [i])
    try:
        with pytest.raises(TypeError, match=r"reset_options\(env_id=0, episode=0\).*list"):
            adapter.reset(seed=0)
    finally:
        adapter.shutdown()


@pytest.mark.parametrize("cap", [None, 2, 1])
def test_async_policy_calls_in_flight_up_to_the_cap(front_end: str, cap: int | None) -> None:
    """``max_policy_calls`` caps the calls in flight (one by default); ``None`` lifts it."""
    fns = space_env_fns(8, max_len=4)
    adapter = open_front_end(front_end, fns)
    in_flight = [0]
    most = [0]
    space = adapter.venv.single_action_space

    async def policy(obs: Any, env_ids: np.ndarray) -> Any:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        for _ in range(3):
            await asyncio.sleep(0)
        in_flight[0] -= 1
        return np.array([space.sample() for _ in env_ids]), {"tag": env_ids * 10}

    try:
        batches = run_collector(adapter, policy, 4, max_batch=2, max_policy_calls=cap)
    finally:
        adapter.shutdown()
    assert most[0] == (cap or 4)  # 8 envs, 2 per call: 4 calls at once without a cap
    check_oracle(fns, batches)


def test_restart_mid_segment_keeps_earlier_transitions(backend: str, front_end: str) -> None:
    """Other envs finish while the failed one restarts (async envs in a random order)."""
    fns = space_env_fns(N, min_len=50, max_len=50)
    faulty = list(fns)
    faulty[1] = functools.partial(_faulty, fns[1])
    flavour = "sync" if backend == "thread" else "async"
    adapter = open_front_end(
        front_end, faulty, flavour=flavour, backend=backend, on_error="restart"
    )
    try:
        batches = run_collector(
            adapter, random_policy(adapter.venv.single_action_space), 4, segment_length=6
        )
    finally:
        adapter.shutdown()
    mine = [(b, k) for b in batches for k in np.flatnonzero(b.env_ids == 1).tolist()]
    batch, k = mine[0]
    # the rebuilt env fails at its own third step again: every third transition
    assert batch.truncations[k].tolist() == [False, False, True, False, False, True]
    assert batch.infos["_error"][k].tolist() == [False, False, True, False, False, True]
    assert "RuntimeError" in batch.infos["error"][k, 2]
    # the two steps before the failure are the env's own
    want = replay(fns[1], 11, batch.actions[k, :2])
    np.testing.assert_array_equal(batch.next_obs[k, :2], np.array(want["next_obs"]))


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_a_restarted_env_starts_its_episode_with_the_hooks_options(
    front_end: str, mode: Any
) -> None:
    fns = space_env_fns(N, min_len=9, max_len=9)
    fns[1] = functools.partial(_faulty_once, fns[1], [])  # the rebuilt env does not fail
    adapter = open_front_end(front_end, fns, on_error="restart", autoreset_mode=mode)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches = run_collector(adapter, policy, 6, segment_length=4, reset_options=Lengths())
    finally:
        adapter.shutdown()
    mine = [(b, k) for b in batches for k in np.flatnonzero(b.env_ids == 1).tolist()]
    ends = np.concatenate([b.terminations[k] | b.truncations[k] for b, k in mine])
    errors = np.concatenate(
        [b.infos.get("_error", np.zeros((len(b.env_ids), 4), bool))[k] for b, k in mine]
    )
    assert errors.sum() == 1
    start = 0
    for episode, end in enumerate(np.flatnonzero(ends).tolist()):
        if not errors[end]:  # an episode the error did not cut short
            assert end + 1 - start == 1 + (1 + episode) % 3, episode
        start = end + 1


def _faulty_once(fn: Callable[[], Any], made: list[int]) -> Any:
    made.append(1)
    return _faulty(fn) if len(made) == 1 else fn()


def _faulty(fn: Callable[[], Any]) -> Any:
    return FaultyEnv(fn(), method="step", at=3, error=RuntimeError("boom"))


def test_an_env_error_propagates_without_restart(front_end: str) -> None:
    fns = space_env_fns(N, max_len=4)
    fns[2] = functools.partial(_faulty, fns[2])
    adapter = open_front_end(front_end, fns)
    try:
        with pytest.raises(aiovec.EnvError) as caught:
            run_collector(adapter, random_policy(adapter.venv.single_action_space), 10)
        assert caught.value.env_index == 2
    finally:
        adapter.shutdown()


def _gated(gate: Gate, i: int) -> Any:
    """Env 0 answers; the others' first step waits for ``gate`` (never released)."""
    env = SpaceEnv(*SPACE, min_len=9, max_len=9)
    return env if i == 0 else AsyncHangingEnv(env, gate)


@pytest.mark.async_envs  # its hanging envs are async: not collected on the thread backend
def test_break_stops_every_env_call(
    front_end: str, backend: str, tmp_path: Any, leak_check: LeakCheck
) -> None:
    """Leaving the loop cancels the envs still out; the vector env can be reset and closed."""
    gate = Gate(tmp_path)
    fns = [functools.partial(_gated, gate, i) for i in range(N)]
    adapter = open_front_end(front_end, fns, backend=backend)
    try:
        policy = lambda obs, ids: np.zeros(len(ids), np.int64)  # noqa: E731
        batches = run_collector(adapter, policy, 1, segment_length=2, batch_size=1)
        assert batches[0].env_ids.tolist() == [0]
        assert adapter.venv.state is aiovec.State.BROKEN  # nothing is left in flight
        if backend == "inline":
            assert [env.cancelled for env in adapter.venv.envs[1:]] == [1, 1, 1]
        adapter.reset(seed=0)  # the hung calls are gone: a reset answers
    finally:
        gate.release()
        adapter.shutdown()


def _zeros(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    return np.zeros(len(env_ids), np.int64)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"envs": "venv"}, TypeError, "envs must be an aiovec.AsyncioVectorEnv or aiovec.Block"),
        ({"policy": 3}, TypeError, "policy must be callable, got int 3"),
        ({"segment_length": 0}, ValueError, "segment_length must be an int >= 1, got 0"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int >= 1, got float 2.0"),
        ({"max_batch": True}, TypeError, "max_batch must be an int >= 1, got bool True"),
        ({"max_wait": -1}, ValueError, "max_wait must be a positive number of seconds"),
        ({"max_lag": -1}, ValueError, "max_lag must be an int >= 0, got -1"),
        ({"reset_options": 5}, TypeError, "reset_options must be a callable"),
    ],
)
def test_bad_arguments_are_refused_before_any_env_is_touched(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    adapter = open_front_end("blocking", space_env_fns(2))
    arguments: dict[str, Any] = {
        "envs": adapter.venv,
        "policy": _zeros,
        "segment_length": 2,
        "batch_size": 1,
        **kwargs,
    }
    try:
        with pytest.raises(error, match=re.escape(message)):
            aiovec.Collector(arguments.pop("envs"), arguments.pop("policy"), **arguments)
        assert adapter.venv.state is aiovec.State.NEEDS_RESET
    finally:
        adapter.shutdown()


def test_one_reset_options_hook_only() -> None:
    adapter = open_front_end("blocking", space_env_fns(2), reset_options=Lengths())
    try:
        with pytest.raises(ValueError, match="has a reset_options hook already"):
            aiovec.Collector(
                adapter.venv, _zeros, segment_length=2, batch_size=1, reset_options=Lengths()
            )
    finally:
        adapter.shutdown()


def test_each_front_end_iterates_its_own_way() -> None:
    adapter = open_front_end("blocking", space_env_fns(2))
    try:
        collector = aiovec.Collector(adapter.venv, _zeros, segment_length=2, batch_size=1)
        with pytest.raises(TypeError, match="iterated with `for`, not `async for`"):
            collector.__aiter__()
    finally:
        adapter.shutdown()
    adapter = open_front_end("await", space_env_fns(2))
    try:
        collector = aiovec.Collector(adapter.venv, _zeros, segment_length=2, batch_size=1)
        with pytest.raises(TypeError, match="iterated with `async for`, not `for`"):
            iter(collector)
    finally:
        adapter.shutdown()


def _slow_first_reset(gate: Gate, i: int) -> Any:
    """Env 0's first reset waits for ``gate``; the other envs answer at once."""
    env = SpaceEnv(*SPACE, min_len=3, max_len=6)
    return AsyncHangingEnv(env, gate, method="reset") if i == 0 else AsyncTwin(env, max_yields=1)


@pytest.mark.async_envs  # env 0 is async: not collected on the thread backend
def test_each_env_steps_once_its_own_reset_is_done(
    front_end: str, backend: str, tmp_path: Any
) -> None:
    """The first batch comes while env 0 still resets; env 0 joins in once it is done."""
    gate = Gate(tmp_path)
    fns = [functools.partial(_slow_first_reset, gate, i) for i in range(N)]
    adapter = open_front_end(front_end, fns, backend=backend)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        releases = []

        def release(collector: aiovec.Collector, batch: aiovec.SegmentBatch) -> None:
            releases.append(0 in batch.env_ids.tolist())
            gate.release()  # after the first batch: a lock-step start never gets there

        batches = run_collector(adapter, policy, 12, each=release, segment_length=2)
    finally:
        gate.release()
        adapter.shutdown()
    assert releases[0] is False  # the first batch came before env 0's reset was done
    assert any(releases)  # and env 0 stepped after it
    check_oracle([functools.partial(SpaceEnv, *SPACE, min_len=3, max_len=6)] * N, batches)


class _HeldEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """Env 0's steps wait on ``hold``; env 1's answer at once, counted in ``steps``."""

    observation_space, action_space = SPACE

    def __init__(self, i: int, hold: asyncio.Event, steps: list[int]) -> None:
        self.i, self.hold, self.steps = i, hold, steps

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        return np.zeros(3, np.float32), {}

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.i == 0:
            await self.hold.wait()
        self.steps[self.i] += 1
        return np.zeros(3, np.float32), 0.0, False, False, {}


def test_a_policy_answer_reaches_its_env_while_a_recv_waits() -> None:
    """No timer runs while everything waits, and an answer is sent as soon as it returns.

    Env 0 is out (its step waits), env 1's policy call waits for ``answer``:
    the collector then waits on both with no timer scheduled; once the call
    returns, env 1 steps within a few loop iterations (no 2 ms poll).
    """

    async def main() -> None:
        hold, answer, asked = asyncio.Event(), asyncio.Event(), asyncio.Event()
        steps = [0, 0]

        async def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
            if env_ids.tolist() == [1]:
                asked.set()
                await answer.wait()
            return np.zeros(len(env_ids), np.int64)

        fns = [functools.partial(_HeldEnv, i, hold, steps) for i in range(2)]
        async with aiovec.AsyncioVectorEnv(fns) as venv:
            collector = aiovec.Collector(
                venv, policy, segment_length=50, batch_size=1, max_batch=1, max_policy_calls=None
            )
            consumer = asyncio.ensure_future(anext(aiter(collector)))
            await asyncio.wait_for(asked.wait(), 5)
            for _ in range(5):
                await asyncio.sleep(0)  # everything waits now: env 0's step, env 1's call
            loop = asyncio.get_running_loop()
            timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
            assert timers == []
            before = steps[1]
            answer.set()
            for _ in range(10):
                await asyncio.sleep(0)
                if steps[1] > before:
                    break
            assert steps[1] > before, "env 1 was not stepped after its policy call returned"
            consumer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consumer
            await collector.aclose()
            hold.set()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("answer", "error", "message"),
    [
        (lambda ids: np.zeros(len(ids) - 1, np.int64), ValueError, "must have shape (4,)"),
        (lambda ids: np.int64(0), TypeError, "got a scalar"),
        (lambda ids: np.zeros((len(ids), 2), np.int64), ValueError, "shape (4,)"),
        (lambda ids: np.zeros(len(ids), np.float32), TypeError, "float32"),
        (
            lambda ids: (np.zeros(len(ids), np.int64), {"value": np.zeros(1)}),
            ValueError,
            "extra 'value' of policy",
        ),
        (
            lambda ids: (np.zeros(len(ids), np.int64), {"logp": 0.5}),
            ValueError,
            "one row per env (4), got a scalar",
        ),
    ],
)
def test_a_wrong_policy_output_is_refused(
    front_end: str, answer: Callable[[np.ndarray], Any], error: type[Exception], message: str
) -> None:
    """Before anything is recorded or sent: the error names the policy, the envs, the extra."""

    def my_policy(obs: Any, env_ids: np.ndarray) -> Any:
        return answer(env_ids)

    adapter = open_front_end(front_end, space_env_fns(N))
    try:
        with pytest.raises(error) as caught:
            run_collector(adapter, my_policy, 1)
        assert message in str(caught.value)
        assert "my_policy" in str(caught.value)
        assert "env(s) [0, 1, 2, 3]" in str(caught.value)
        adapter.reset(seed=0)  # usable after a reset
    finally:
        adapter.shutdown()


@pytest.mark.parametrize(
    "answer",
    [
        lambda ids: np.zeros(len(ids) + 1, np.int64),  # the check of a batch size seen before
        lambda ids: (np.zeros(len(ids), np.int64), {"value": np.zeros(5)}),
    ],
)
def test_a_wrong_output_of_a_later_call_names_the_envs_of_that_call(
    front_end: str, answer: Callable[[np.ndarray], Any]
) -> None:
    """4 envs, 2 per call: the call for envs [2, 3] goes wrong, after [0, 1]'s went well."""
    calls: list[list[int]] = []

    def policy(obs: Any, env_ids: np.ndarray) -> Any:
        calls.append(env_ids.tolist())
        if env_ids.tolist() == [2, 3]:
            return answer(env_ids)
        return np.zeros(len(env_ids), np.int64)

    adapter = open_front_end(front_end, space_env_fns(N))
    try:
        with pytest.raises(ValueError, match=re.escape("policy for env(s) [2, 3] ")):
            run_collector(adapter, policy, 1, max_batch=2)
    finally:
        adapter.shutdown()
    assert calls == [[0, 1], [2, 3]]


def test_the_actions_are_checked_once_per_round(
    front_end: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By the collector, which names its policy and envs; the vector env trusts that check."""
    checks: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Callable[[object], None]:
        check = action_checker(*args, **kwargs)

        def counted(actions: object) -> None:
            checks.append(1)
            check(actions)

        return counted

    from aiovec._core import batching, validate

    action_checker = validate.action_checker
    monkeypatch.setattr(validate, "action_checker", counting)
    monkeypatch.setattr(batching, "action_checker", counting)
    calls: list[int] = []

    def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
        calls.append(len(env_ids))
        return np.zeros(len(env_ids), np.int64)

    adapter = open_front_end(front_end, space_env_fns(N))
    try:
        run_collector(adapter, policy, 2, max_batch=2)
    finally:
        adapter.shutdown()
    assert len(checks) == len(calls) > 0


def test_max_wait_bounds_the_wait_for_a_full_policy_call() -> None:
    """Env 0 never answers: after ``max_wait`` the policy is called with the others.

    (``max_wait`` counts from the first ready env; a ``recv`` that waited for a
    whole ``max_batch`` before any env was ready waited for env 0 forever.)
    """

    async def main() -> None:
        hold = asyncio.Event()
        steps = [0, 0, 0, 0]
        calls: list[list[int]] = []

        def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
            calls.append(env_ids.tolist())
            return np.zeros(len(env_ids), np.int64)

        fns = [functools.partial(_HeldEnv, min(i, 1), hold, steps) for i in range(4)]
        async with aiovec.AsyncioVectorEnv(fns) as venv:
            collector = aiovec.Collector(
                venv, policy, segment_length=2, batch_size=3, max_wait=0.01
            )
            async with asyncio.timeout(10), collector:
                batch = await anext(aiter(collector))
            hold.set()
        assert sorted(batch.env_ids.tolist()) == [1, 2, 3]
        assert calls[0] == [0, 1, 2, 3]  # env 0 was asked once, at the start
        assert all(0 not in ids for ids in calls[1:])

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_max_wait_with_every_policy_call_slot_taken_does_not_spin(front_end: str) -> None:
    """Ready envs past ``max_wait`` wait for a free call slot (the loop is not held)."""

    async def policy(obs: Any, env_ids: np.ndarray) -> np.ndarray:
        await asyncio.sleep(0.005)  # a model server's answer
        return np.zeros(len(env_ids), np.int64)

    adapter = open_front_end(front_end, space_env_fns(N))
    try:
        batches = run_collector(adapter, policy, 3, max_wait=0.001, max_batch=1)
    finally:
        adapter.shutdown()
    assert len(batches) == 3
