"""``aiovec.EpisodeCollector``: whole episodes in groups, checked against each env alone.

Every episode must be what its env gives when reset with the episode's seed
and task and stepped alone with the same actions, through gymnasium's own
``reset``/``step`` (the oracle); every member of a group has the group's task
and seed; every task is run once.  Then the knobs: a rejected group is
replaced, a failed member is retried / its group dropped / the error raised,
``max_lag`` admits before it drops, a run resumes from ``state_dict()``, and
bad arguments are refused before any env is touched.  Leaving the loop is
tested with the Collector's, in tests/test_collector_exit.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import MODES, SPACES, open_front_end, random_policy, space_env_fns
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec.testing import AsyncHangingEnv, AsyncTwin, FaultyEnv, Gate

N = 4
SPACE = SPACES["box-discrete"]
SEED = 100


def tasks_of(count: int) -> list[dict[str, Any]]:
    """Tasks of 1-5 steps (SpaceEnv's ``length`` option), each one its own."""
    return [{"length": 1 + (7 * k) % 5, "task": k} for k in range(count)]


def run_episodes(
    adapter: Any,
    policy: Callable[..., Any],
    *,
    batches: int | None = None,
    each: Callable[[aiovec.EpisodeCollector, aiovec.EpisodeBatch], None] | None = None,
    state: dict[str, Any] | None = None,
    box: list[aiovec.EpisodeCollector] | None = None,
    **kwargs: Any,
) -> tuple[list[aiovec.EpisodeBatch], aiovec.EpisodeCollector]:
    """Batches of an EpisodeCollector over ``adapter``'s vector env, on either front end.

    ``batches``: stop after so many (``None``: until the tasks run out);
    ``box``: the collector is put there (for a policy that updates it).
    """
    kwargs.setdefault("batch_size", 2)
    kwargs.setdefault("seed", SEED)
    collector = aiovec.EpisodeCollector(adapter.venv, policy, **kwargs)
    if box is not None:
        box.append(collector)
    if state is not None:
        collector.load_state_dict(state)
    got: list[aiovec.EpisodeBatch] = []
    if adapter.front_end == "blocking":
        with collector:
            for batch in collector:
                got.append(batch)
                if each is not None:
                    each(collector, batch)
                if len(got) == batches:
                    break
        return got, collector

    async def main() -> None:
        async with collector:
            async for batch in collector:
                got.append(batch)
                if each is not None:
                    each(collector, batch)
                if len(got) == batches:
                    break

    adapter.run(main())
    return got, collector


def async_random_policy(space: gymnasium.spaces.Space[Any]) -> Callable[..., Any]:
    plain = random_policy(space)

    async def policy(obs: Any, env_ids: np.ndarray) -> Any:
        await asyncio.sleep(0.001)
        return plain(obs, env_ids)

    return policy


def check_alone(fn: Callable[[], Any], episode: aiovec.Episode) -> None:
    """``episode`` is its env reset with its seed and task, stepped alone with its actions."""
    env = fn()
    obs, _ = env.reset(seed=episode.seed, options=episode.task)
    where = f"episode {episode.episode_id} (group {episode.group_id})"
    for t, action in enumerate(episode.actions):
        np.testing.assert_array_equal(episode.obs[t], obs, err_msg=f"{where} obs {t}")
        obs, reward, term, trunc, _ = env.step(action)
        assert episode.rewards[t] == reward, where
        last = t == len(episode) - 1
        assert (term or trunc) == last, f"{where}: the episode is cut or runs past its end"
    np.testing.assert_array_equal(episode.final_obs, obs, err_msg=f"{where} final obs")
    assert (episode.terminated, episode.truncated) == (term, trunc), where
    env.close()


def check_groups(
    fns: Sequence[Callable[[], Any]],
    batches: Sequence[aiovec.EpisodeBatch],
    tasks: Sequence[dict[str, Any]],
    group_size: int,
    runs: int = 1,
) -> None:
    """Each task ran once, as one group of ``group_size`` episodes true to the oracle.

    ``runs``: collectors the batches come from (each numbers its episodes).
    """
    groups = [g for b in batches for g in b.groups]
    assert sorted(g[0].group_id for g in groups) == list(range(len(tasks)))
    for group in groups:
        assert [e.index for e in group] == list(range(group_size))
        first = group[0]
        assert first.task == tasks[first.group_id]
        assert {(e.group_id, e.seed) for e in group} == {(first.group_id, SEED + first.group_id)}
        for episode in group:
            assert episode.task == first.task
            assert episode.status == "ok"
            assert (episode.extras["tag"] == 10 * episode.env_id).all()  # with its env
            assert (episode.versions == 0).all()
            assert len(episode.infos) == len(episode)
            assert episode.start_time <= episode.end_time
            check_alone(fns[episode.env_id], episode)
        np.testing.assert_array_equal(group[0].obs[0], group[-1].obs[0])  # one start
    if runs == 1:
        assert len({e.episode_id for g in groups for e in g}) == len(tasks) * group_size


@pytest.mark.parametrize("mode", MODES)
def test_groups_are_each_env_stepped_alone_with_its_task_and_seed(
    backend: str, front_end: str, mode: AutoresetMode
) -> None:
    fns = space_env_fns(N, max_len=4)
    tasks = tasks_of(7)
    adapter = open_front_end(front_end, fns, backend=backend, autoreset_mode=mode)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches, _ = run_episodes(adapter, policy, group_size=3, tasks=tasks)
    finally:
        adapter.shutdown()
    assert [len(b.groups) for b in batches] == [2, 2, 2, 1]  # the last holds what is left
    check_groups(fns, batches, tasks, 3)


def _delayed(fn: Callable[[], Any], i: int) -> AsyncTwin:
    return AsyncTwin(fn(), max_yields=0, max_delay=0.004 * (i % 3), seed=i)


def test_groups_with_random_delays_and_an_async_policy(front_end: str) -> None:
    """Members run on whichever envs are free; a policy's answer lands amid a recv."""
    fns = space_env_fns(N, max_len=4)
    tasks = tasks_of(9)
    delayed = [functools.partial(_delayed, fn, i) for i, fn in enumerate(fns)]
    adapter = open_front_end(front_end, delayed)
    try:
        policy = async_random_policy(adapter.venv.single_action_space)
        batches, _ = run_episodes(
            adapter, policy, group_size=2, tasks=iter(tasks), max_policy_calls=None
        )
    finally:
        adapter.shutdown()
    check_groups(fns, batches, tasks, 2)
    envs_of = [{e.env_id for e in g} for b in batches for g in b.groups]
    assert any(len(envs) > 1 for envs in envs_of)  # a group's members ran on several envs


def test_without_tasks_groups_are_single_episodes(front_end: str) -> None:
    fns = space_env_fns(N, max_len=4)
    adapter = open_front_end(front_end, fns)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches, _ = run_episodes(adapter, policy, batches=5, batch_size=3)
    finally:
        adapter.shutdown()
    groups = [g for b in batches for g in b.groups]
    assert len(groups) == 15
    assert all(len(g) == 1 and g[0].task is None for g in groups)
    for group in groups:
        check_alone(fns[group[0].env_id], group[0])


def _even_groups_only(group: list[aiovec.Episode]) -> bool:
    return group[0].group_id % 2 == 0


def test_a_rejected_group_is_replaced_by_the_next_task(backend: str, front_end: str) -> None:
    """One group in flight: a rejection that kept its place would end the run early."""
    fns = space_env_fns(N, max_len=4)
    tasks = tasks_of(8)
    adapter = open_front_end(front_end, fns, backend=backend)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches, collector = run_episodes(
            adapter,
            policy,
            group_size=2,
            tasks=tasks,
            max_in_flight=1,
            accept_group=_even_groups_only,
        )
    finally:
        adapter.shutdown()
    # the last group is rejected after the last full batch: a last batch carries it alone
    assert [[g[0].group_id for g in b.groups] for b in batches] == [[0, 2], [4, 6], []]
    assert [[d.group_id for d in b.discarded] for b in batches] == [[1], [3, 5], [7]]
    assert collector.rejected == 4
    for discarded in (d for b in batches for d in b.discarded):  # handed back whole
        assert discarded.reason == "rejected"
        assert discarded.task == tasks[discarded.group_id]
        assert discarded.seed == SEED + discarded.group_id
        assert [e.index for e in discarded.episodes] == [0, 1]
        for episode in discarded.episodes:
            check_alone(fns[episode.env_id], episode)


def _episode(rewards: list[float]) -> aiovec.Episode:
    return aiovec.Episode(
        env_id=0,
        episode_id=0,
        group_id=0,
        index=0,
        task=None,
        seed=0,
        obs=np.zeros((len(rewards), 1)),
        actions=np.zeros(len(rewards)),
        rewards=np.array(rewards),
        final_obs=np.zeros(1),
        terminated=True,
        truncated=False,
        status="ok",
        versions=np.zeros(len(rewards), np.int64),
        extras={},
        infos=[{}] * len(rewards),
        start_time=0.0,
        end_time=0.0,
    )


def test_a_group_set_aside_but_not_yet_handed_back_is_pending_in_the_state() -> None:
    """Stopped between a rejection and the next batch: the task runs again, counted once."""
    from aiovec._core.episodes import Groups

    groups = Groups(
        [{"task": 0}, {"task": 1}],
        group_size=1,
        batch_size=1,
        max_in_flight=2,
        max_lag=None,
        seed=0,
        accept=lambda members: members[0].group_id == 1,
        on_error="raise",
        max_retries=0,
    )
    first, second = groups.next_member(), groups.next_member()
    assert first is not None
    assert second is not None
    groups.ended(first[0], 0, dataclasses.replace(_episode([1.0]), group_id=0))
    assert [(d.reason, d.group_id) for d in groups.discarded] == [("rejected", 0)]
    state = groups.state_dict()
    assert state["pending"] == [(0, {"task": 0}), (1, {"task": 1})]
    assert state["rejected"] == 0  # it comes back in the resumed run, and is counted there
    groups.ended(second[0], 0, dataclasses.replace(_episode([1.0]), group_id=1))
    batch = groups.take(1)
    assert [g[0].group_id for g in batch.groups] == [1]
    assert [d.group_id for d in batch.discarded] == [0]
    assert groups.state_dict()["rejected"] == 1
    assert groups.discarded == []  # handed back: nothing is kept


def test_rewards_differ_keeps_groups_with_a_signal() -> None:
    assert not aiovec.rewards_differ([_episode([1.0, 0.0]), _episode([0.5, 0.5])])
    assert aiovec.rewards_differ([_episode([1.0]), _episode([0.0])])
    assert not aiovec.rewards_differ([_episode([0.0]), _episode([0.0]), _episode([0.0])])


def _faulty_once(fn: Callable[[], Any], made: list[int]) -> Any:
    """The env's first build fails at its 4th step; its rebuilds do not."""
    made.append(1)
    return FaultyEnv(fn(), method="step", at=4) if len(made) == 1 else fn()


def _faulty(fn: Callable[[], Any]) -> Any:
    return FaultyEnv(fn(), method="step", at=2)


def run_faulty(
    front_end: str, backend: str, fault: Callable[..., Any], **kwargs: Any
) -> tuple[list[aiovec.EpisodeBatch], aiovec.EpisodeCollector, list[Callable[[], Any]]]:
    """Env 1 fails (``fault``); tasks of 5 steps, groups of 2, on a restarting vector env."""
    on_error = kwargs.pop("on_error_of", "raise")
    fns = space_env_fns(N, max_len=4)
    faulty = list(fns)
    faulty[1] = fault(fns[1])
    flavour = kwargs.pop("flavour", "sync" if backend == "thread" else "async")
    adapter = open_front_end(front_end, faulty, flavour=flavour, backend=backend, **kwargs)
    tasks = [{"length": 5, "task": k} for k in range(6)]
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches, collector = run_episodes(
            adapter, policy, group_size=2, tasks=tasks, on_error=on_error
        )
    finally:
        adapter.shutdown()
    return batches, collector, fns


def test_a_failed_member_is_retried(backend: str, front_end: str) -> None:
    fault = lambda fn: functools.partial(_faulty_once, fn, [])  # noqa: E731
    batches, _, fns = run_faulty(front_end, backend, fault, on_error="restart", on_error_of="retry")
    tasks = [{"length": 5, "task": k} for k in range(6)]
    check_groups(fns, batches, tasks, 2)  # every member ok, from its group's reset
    started = max(e.episode_id for b in batches for e in b.episodes) + 1
    assert started == 13  # 12 members, one of them twice


def test_a_failed_members_group_is_dropped(backend: str, front_end: str) -> None:
    fault = lambda fn: functools.partial(_faulty_once, fn, [])  # noqa: E731
    batches, collector, fns = run_faulty(
        front_end, backend, fault, on_error="restart", on_error_of="drop"
    )
    ids = sorted(g[0].group_id for b in batches for g in b.groups)
    assert len(ids) == 5
    assert collector.failed == 1
    ((failed,),) = [b.discarded for b in batches if b.discarded]
    assert failed.reason == "failed"
    assert failed.task == {"length": 5, "task": failed.group_id}
    assert sorted([*ids, failed.group_id]) == list(range(6))
    assert "error" in [e.status for e in failed.episodes]  # the member that failed, with why
    for episode in (e for b in batches for e in b.episodes):
        assert episode.status == "ok"
        check_alone(fns[episode.env_id], episode)


def test_a_failed_member_is_kept_with_its_status(front_end: str) -> None:
    fault = lambda fn: functools.partial(_faulty_once, fn, [])  # noqa: E731
    batches, _, _ = run_faulty(front_end, "inline", fault, on_error="restart", on_error_of="keep")
    statuses = [e.status for b in batches for e in b.episodes]
    assert statuses.count("error") == 1
    assert statuses.count("ok") == 11
    failed = next(e for b in batches for e in b.episodes if e.status == "error")
    assert failed.env_id == 1
    assert failed.truncated
    assert len(failed) == 4
    assert "RuntimeError" in failed.infos[-1]["error"]


def _hangs_once(gate: Gate, fn: Callable[[], Any], made: list[int]) -> Any:
    """The env's first build hangs at its 4th step (until cancelled); its rebuilds do not."""
    made.append(1)
    return AsyncHangingEnv(fn(), gate, at=4) if len(made) == 1 else fn()


def test_a_member_that_timed_out_says_so(front_end: str, tmp_path: Any) -> None:
    gate = Gate(tmp_path)
    fault = lambda fn: functools.partial(_hangs_once, gate, fn, [])  # noqa: E731
    try:
        batches, _, _ = run_faulty(
            front_end,
            "inline",
            fault,
            on_error="restart",
            step_timeout=0.2,
            on_error_of="keep",
            flavour="sync",  # the hanging env is async already
        )
    finally:
        gate.release()
    statuses = [e.status for b in batches for e in b.episodes]
    assert statuses.count("timeout") == 1
    assert statuses.count("ok") == 11


def test_a_failed_member_raises(backend: str, front_end: str) -> None:
    fault = lambda fn: functools.partial(_faulty_once, fn, [])  # noqa: E731
    with pytest.raises(aiovec.EnvError, match=r"member \d of group \d") as caught:
        run_faulty(front_end, backend, fault, on_error="restart")
    assert caught.value.env_index == 1


def test_retries_are_bounded(front_end: str) -> None:
    """An env that always fails: the member is tried 1 + max_retries times, then it raises.

    The error names the budget and the ways on, and the env's error once.
    """
    with pytest.raises(aiovec.EnvError) as caught:
        run_faulty(
            front_end, "inline", _faulty_every_build, on_error="restart", on_error_of="retry"
        )
    message = str(caught.value)
    assert "its try 3 of 3: on_error='retry' with max_retries=2 gives up" in message
    assert "raise max_retries, or pass on_error='drop'" in message
    assert "or 'keep' (kept with its status)" in message
    assert message.count("RuntimeError") == 1, message
    assert message.endswith(
        "RuntimeError: injected failure in step #2 (in step(); the env was rebuilt and reset)"
    )
    assert type(caught.value.__cause__) is RuntimeError


def _faulty_every_build(fn: Callable[[], Any]) -> Callable[[], Any]:
    return functools.partial(_faulty, fn)


def test_an_env_error_without_restart_raises(front_end: str) -> None:
    with pytest.raises(aiovec.EnvError) as caught:
        run_faulty(front_end, "inline", _faulty_every_build)
    assert caught.value.env_index == 1


def _reset_fails_once(fn: Callable[[], Any], made: list[int]) -> Any:
    """The env's first build fails at its second reset; its rebuilds do not."""
    made.append(1)
    return FaultyEnv(fn(), method="reset", at=2) if len(made) == 1 else fn()


def test_a_member_whose_reset_failed_starts_again_from_its_seed(
    backend: str, front_end: str
) -> None:
    """The vector env restarts the env (its own reset): the member's reset is sent again."""
    fns = space_env_fns(N, max_len=4)
    faulty = list(fns)
    faulty[1] = functools.partial(_reset_fails_once, fns[1], [])
    tasks = tasks_of(8)
    adapter = open_front_end(front_end, faulty, backend=backend, on_error="restart")
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches, _ = run_episodes(adapter, policy, group_size=2, tasks=tasks)
    finally:
        adapter.shutdown()
    check_groups(fns, batches, tasks, 2)


def test_max_lag_admits_before_it_drops(front_end: str) -> None:
    """``max_lag=0``, one update per batch: no group starts early, so none is dropped."""
    fns = space_env_fns(N, max_len=4)
    adapter = open_front_end(front_end, fns)
    seen: list[tuple[int, list[int]]] = []

    def each(collector: aiovec.EpisodeCollector, batch: aiovec.EpisodeBatch) -> None:
        versions = np.concatenate([e.versions for e in batch.episodes])
        seen.append((collector.policy_version, sorted(set(versions.tolist()))))
        collector.update_policy()

    try:
        policy = random_policy(adapter.venv.single_action_space)
        _, collector = run_episodes(
            adapter, policy, group_size=2, tasks=tasks_of(8), max_lag=0, each=each
        )
    finally:
        adapter.shutdown()
    assert seen == [(v, [v]) for v in range(4)]
    assert collector.dropped == 0


def test_max_lag_drops_what_admission_could_not_keep(front_end: str) -> None:
    """Updates amid a batch (from the policy): groups older than allowed are dropped."""
    fns = space_env_fns(N, max_len=4)
    adapter = open_front_end(front_end, fns)
    box: list[aiovec.EpisodeCollector] = []
    plain = random_policy(adapter.venv.single_action_space)

    def policy(obs: Any, env_ids: np.ndarray) -> Any:
        box[0].update_policy()  # a version per call: an episode of 3 steps spans 3
        return plain(obs, env_ids)

    def each(collector: aiovec.EpisodeCollector, batch: aiovec.EpisodeBatch) -> None:
        if batch.groups:
            oldest = min(int(e.versions.min()) for e in batch.episodes)
            assert oldest >= collector.policy_version - 1

    tasks = tasks_of(12)
    try:
        batches, collector = run_episodes(
            adapter, policy, group_size=2, tasks=tasks, max_lag=1, each=each, box=box
        )
    finally:
        adapter.shutdown()
    assert collector.dropped > 0
    dropped = [d for b in batches for d in b.discarded]
    assert {d.reason for d in dropped} == {"dropped"}
    assert len(dropped) == collector.dropped
    assert [len(d.episodes) for d in dropped] == [2] * len(dropped)  # finished, then dropped
    yielded = [g[0].group_id for b in batches for g in b.groups]
    assert sorted(yielded + [d.group_id for d in dropped]) == list(range(12))


def _resume(front_end: str, backend: str, stop_after: int) -> list[list[aiovec.Episode]]:
    fns = space_env_fns(N, max_len=4)
    tasks = tasks_of(11)
    adapter = open_front_end(front_end, fns, backend=backend)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        first, collector = run_episodes(
            adapter, policy, group_size=2, tasks=tasks, batches=stop_after
        )
        state = collector.state_dict()
        if backend == "inline":  # (elsewhere whether tasks are out at the stop is timing's)
            assert state["cursor"] > 2 * stop_after  # tasks were in flight when it stopped
            assert state["pending"]
        rest, _ = run_episodes(adapter, policy, group_size=2, tasks=tasks, state=state)
    finally:
        adapter.shutdown()
    groups = [g for b in [*first, *rest] for g in b.groups]
    check_groups(fns, [*first, *rest], tasks, 2, runs=2)
    ids = [e.episode_id for b in [*first, *rest] for e in b.episodes]
    assert len(set(ids)) == len(ids), "an episode_id came twice across the resumed run"
    return groups


def test_a_run_resumed_from_state_dict_yields_every_task_once(backend: str, front_end: str) -> None:
    groups = _resume(front_end, backend, stop_after=2)
    assert len(groups) == 11


def test_a_resumed_run_hands_back_every_task_once_yielded_or_set_aside(front_end: str) -> None:
    """With rejections: each task once, in a batch's groups or its discarded; ids unique."""
    fns = space_env_fns(N, max_len=4)
    tasks = tasks_of(12)
    adapter = open_front_end(front_end, fns)
    kwargs: dict[str, Any] = {"group_size": 2, "tasks": tasks, "accept_group": _even_groups_only}
    try:
        policy = random_policy(adapter.venv.single_action_space)
        first, collector = run_episodes(adapter, policy, batches=1, **kwargs)
        state = collector.state_dict()
        rest, resumed = run_episodes(adapter, policy, state=state, **kwargs)
    finally:
        adapter.shutdown()
    batches = [*first, *rest]
    yielded = [g[0].group_id for b in batches for g in b.groups]
    discarded = [d.group_id for b in batches for d in b.discarded]
    assert sorted(yielded + discarded) == list(range(12))
    assert set(discarded) == set(range(1, 12, 2))
    assert resumed.rejected == len(discarded)
    episodes = [
        e for b in batches for e in [*b.episodes, *(x for d in b.discarded for x in d.episodes)]
    ]
    ids = [e.episode_id for e in episodes]
    assert len(set(ids)) == len(ids), "an episode_id came twice across the resumed run"


def _zeros(obs: Any, env_ids: np.ndarray) -> np.ndarray:
    return np.zeros(len(env_ids), np.int64)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"envs": "venv"}, TypeError, "envs must be an aiovec.AsyncioVectorEnv or aiovec.Block"),
        ({"policy": 3}, TypeError, "policy must be callable, got int 3"),
        ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, got 0"),
        ({"group_size": 2.0}, TypeError, "group_size must be an int >= 1, got float 2.0"),
        ({"group_size": 2, "tasks": None}, ValueError, "group_size=2 needs tasks"),
        ({"tasks": "abc"}, TypeError, "tasks must be an iterable of reset options"),
        ({"tasks": [{}, 5]}, TypeError, "tasks must give reset options (a dict or None each), "),
        ({"max_in_flight": 0}, ValueError, "max_in_flight must be an int >= 1, got 0"),
        ({"accept_group": 1}, TypeError, "accept_group must be callable or None, got int 1"),
        (
            {"accept_group": aiovec.rewards_differ},
            ValueError,
            "accept_group=rewards_differ compares a group's members: it needs group_size > 1",
        ),
        ({"on_error": "ignore"}, ValueError, "on_error must be one of ('raise', 'retry'"),
        ({"on_error": "retry"}, ValueError, "on_error='retry' needs a vector env that restarts"),
        ({"max_retries": -1}, ValueError, "max_retries must be an int >= 0, got -1"),
        ({"max_batch": True}, TypeError, "max_batch must be an int >= 1, got bool True"),
        ({"max_wait": -1}, ValueError, "max_wait must be a positive number of seconds"),
        ({"max_policy_calls": 0}, ValueError, "max_policy_calls must be an int >= 1, got 0"),
        ({"max_lag": -1}, ValueError, "max_lag must be an int >= 0, got -1"),
        ({"seed": -3}, ValueError, "seed must be an int >= 0 or None, got -3"),
    ],
)
def test_bad_arguments_are_refused_before_any_env_is_touched(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    adapter = open_front_end("blocking", space_env_fns(2))
    arguments: dict[str, Any] = {
        "envs": adapter.venv,
        "policy": _zeros,
        "batch_size": 1,
        "group_size": 1,
        "tasks": [{}],
        **kwargs,
    }
    try:
        with pytest.raises(error, match=re.escape(message)):
            aiovec.EpisodeCollector(arguments.pop("envs"), arguments.pop("policy"), **arguments)
        assert adapter.venv.state is aiovec.State.NEEDS_RESET
    finally:
        adapter.shutdown()


def test_a_bad_task_from_an_iterator_is_named() -> None:
    adapter = open_front_end("blocking", space_env_fns(2))
    try:
        with pytest.raises(TypeError, match=re.escape("got task 1: str 'x'")):
            run_episodes(adapter, _zeros, tasks=iter([{}, "x"]))
    finally:
        adapter.shutdown()


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        ([1], TypeError, "state must be a dict from state_dict(), got list"),
        ({"cursor": 1}, ValueError, "state lacks ['dropped', 'episodes', 'failed', 'pending'"),
        (
            {
                "cursor": 9,
                "pending": [],
                "seed": 0,
                "rejected": 0,
                "dropped": 0,
                "failed": 0,
                "episodes": 0,
            },
            ValueError,
            "state's cursor is 9 but tasks ran out after 2",
        ),
    ],
)
def test_a_bad_state_is_refused(state: Any, error: type[Exception], message: str) -> None:
    adapter = open_front_end("blocking", space_env_fns(2))
    try:
        collector = aiovec.EpisodeCollector(adapter.venv, _zeros, batch_size=1, tasks=[{}, {}])
        with pytest.raises(error, match=re.escape(message)):
            collector.load_state_dict(state)
    finally:
        adapter.shutdown()


def test_each_front_end_iterates_its_own_way() -> None:
    adapter = open_front_end("blocking", space_env_fns(2))
    try:
        collector = aiovec.EpisodeCollector(adapter.venv, _zeros, batch_size=1)
        with pytest.raises(TypeError, match="EpisodeCollector over a BlockingVectorEnv is iter"):
            collector.__aiter__()
    finally:
        adapter.shutdown()


class ResetCounter(gymnasium.Env[np.ndarray, int]):
    """Its observations say how many times it was reset; an episode lasts ``length`` steps."""

    observation_space = gymnasium.spaces.Box(0.0, 1e6, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self) -> None:
        self.resets = self.t = 0
        self.length = 1

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.resets += 1
        self.t, self.length = 0, (options or {}).get("length", 3)
        return np.array([self.resets], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.array([self.resets], np.float32), 0.0, self.t >= self.length, False, {}


@pytest.mark.parametrize("mode", MODES)
def test_each_episode_costs_its_env_one_reset(
    mode: AutoresetMode, backend: str, front_end: str, flavour: str
) -> None:
    """An env whose member ended is reset once, with the next member's seed and task.

    (Under ``SAME_STEP`` the vector env's autoreset ran too: two resets per episode.)
    """
    adapter = open_front_end(
        front_end, [ResetCounter] * N, flavour=flavour, backend=backend, autoreset_mode=mode
    )
    tasks = tasks_of(10)
    try:
        policy = random_policy(adapter.venv.single_action_space)
        batches, _ = run_episodes(adapter, policy, group_size=2, tasks=tasks)
    finally:
        adapter.shutdown()
    episodes = sorted((e for b in batches for e in b.episodes), key=lambda e: e.episode_id)
    assert len(episodes) == 20  # every task ran: every episode is here
    for env in range(N):
        resets = [int(e.obs[0][0]) for e in episodes if e.env_id == env]
        assert resets == list(range(1, len(resets) + 1)), f"env {env}'s resets: {resets}"
    for episode in episodes:  # the episode's last step was the env's, before any reset
        assert episode.final_obs[0] == episode.obs[0][0]
        assert len(episode) == episode.task["length"]


# -- a sandbox fleet: a fault rate is not a crash loop ------------------------------------

# docs/collector.md's settings for a sandbox fleet (step_timeout scaled down to a test's)
FLEET_RESTARTS = aiovec.RestartPolicy(max_downtime=60.0, max_backoff=5.0)
FLEET_COLLECTOR: dict[str, Any] = {"on_error": "retry", "max_retries": 20}


class Sandbox(aiovec.AsyncEnv[np.ndarray, int]):
    """A sandbox of a fleet: 2% of its steps raise, 1% hang (past ``step_timeout``).

    Its faults come from a generator of its own, not from its seeded one: a
    member retried from its group's seed must not meet the same fault again.
    ``always_fails``: every step raises (a broken image).
    """

    observation_space = gymnasium.spaces.Box(0.0, 50.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)
    built = 0

    def __init__(self, always_fails: bool = False) -> None:
        Sandbox.built += 1
        self.faults = np.random.default_rng(Sandbox.built)
        self.always_fails = always_fails
        self.t = self.length = 0

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        await super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(8, 25))
        return np.zeros(1, np.float32), {}

    async def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(0)
        fault = self.faults.random()
        if self.always_fails or fault < 0.02:
            raise RuntimeError("the sandbox crashed")
        if fault < 0.03:
            await asyncio.Event().wait()  # hangs: step_timeout cancels it
        self.t += 1
        reward = float(self.np_random.random() < 0.5)
        return np.full(1, self.t, np.float32), reward, self.t >= self.length, False, {}


def fleet(fns: list[Callable[[], Any]], backend: str) -> aiovec.AsyncioVectorEnv[Any, Any]:
    return aiovec.AsyncioVectorEnv(
        fns, backend=backend, num_workers=2, step_timeout=0.05, on_error=FLEET_RESTARTS
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["inline", "process"])
def test_a_sandbox_fleet_with_a_fault_rate_completes_its_batches(backend: str) -> None:
    """16 sandboxes, groups of 8: 12 batches with the documented settings, every group whole.

    Episodes of 8-24 steps, so that about 40% of the tries of a member fail, and each
    sandbox fails some 20 times: more than the restart limit of an earlier rule (10
    restarts per env within 300 s) allowed.
    """
    tasks = [{"task": k} for k in range(1000)]

    async def main() -> tuple[list[aiovec.EpisodeBatch], int]:
        batches: list[aiovec.EpisodeBatch] = []
        async with fleet([Sandbox] * 16, backend) as venv:
            collector = aiovec.EpisodeCollector(
                venv, _zeros, batch_size=4, group_size=8, tasks=tasks, seed=0, **FLEET_COLLECTOR
            )
            async with collector:
                async for batch in collector:
                    batches.append(batch)
                    if len(batches) == 12:
                        break
            return batches, collector.failed

    batches, failed = asyncio.run(main())
    assert len(batches) == 12
    assert failed == 0
    started = max(e.episode_id for b in batches for e in b.episodes) + 1
    assert started > 1.3 * 12 * 4 * 8  # a third of the members were tried again, or more
    for batch in batches:
        assert [len(g) for g in batch.groups] == [8] * 4
        assert {e.status for e in batch.episodes} == {"ok"}  # failed tries were retried
        for group in batch.groups:
            assert {e.task["task"] for e in group} == {group[0].group_id}


@pytest.mark.timeout(60)
def test_a_sandbox_that_always_fails_still_ends_in_the_restart_limit() -> None:
    """A crash loop among the fleet: the restart limit names it, retries or not."""
    fns: list[Callable[[], Any]] = [Sandbox] * 16
    fns[5] = functools.partial(Sandbox, always_fails=True)

    async def main() -> None:
        async with fleet(fns, "inline") as venv:
            tasks = [{"task": k} for k in range(1000)]
            collector = aiovec.EpisodeCollector(
                venv, _zeros, batch_size=2, group_size=8, tasks=tasks, seed=0, **FLEET_COLLECTOR
            )
            async with collector:
                async for _ in collector:
                    pass

    with pytest.raises(aiovec.EnvError) as caught:
        asyncio.run(main())
    assert 5 in caught.value.errors  # (another env may fail in that step too, and lead)
    assert "restart limit reached: env 5 failed 11 times in a row, never 5 clean steps" in str(
        caught.value
    )
