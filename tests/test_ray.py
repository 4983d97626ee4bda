"""backend="ray": placement over raylets, lost nodes and actors, options, the missing extra.

The conformance and fault suites run every scenario on ``backend="ray"`` too;
this file holds what only Ray has.  Everything runs on the session's local
cluster of two nodes (``ray_cluster`` in ``conftest.py``); the tests that lose
a node add one of their own first.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import HAVE_RAY, RAY_NODE

import aiovec
from aiovec.backends import load_backend
from aiovec.testing import AsyncHangingEnv, Gate, SpaceEnv

pytestmark = pytest.mark.ray

NUM_ENVS = 4
PLACEMENT_TIMEOUT = 10.0  # seconds for a new actor on a lost node's resource: never placed
needs_ray = pytest.mark.skipif(
    not HAVE_RAY, reason='needs the "ray" extra: pip install "aiovec[ray]"'
)


def fns(count: int = NUM_ENVS) -> list[Any]:
    return [functools.partial(SpaceEnv, min_len=50, max_len=50) for _ in range(count)]


class Counted:
    """A factory that counts its calls in this process (to show none was made)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> SpaceEnv:
        self.calls += 1
        return SpaceEnv()


# --------------------------------------------------------------------------- no ray


def test_a_missing_ray_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    monkeypatch.delitem(sys.modules, "aiovec.backends.ray", raising=False)
    factory = Counted()
    with pytest.raises(ModuleNotFoundError, match=r'pip install "aiovec\[ray\]"'):
        aiovec.AsyncioVectorEnv([factory] * 2, backend="ray")
    with pytest.raises(ModuleNotFoundError, match=r"backend='ray' needs ray"):
        load_backend("ray")
    assert factory.calls == 0


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("backend", "options", "error", "match"),
    [
        ("ray", [("num_cpus", 1)], TypeError, "backend_options must be a dict or None"),
        ("inline", {"num_cpus": 1}, ValueError, "not taken by backend='inline'"),
        ("ray", {"num_cpu": 1}, ValueError, "unknown option.*num_cpu.*expected some of"),
    ],
)
def test_bad_backend_options_are_refused_before_any_env_is_built(backend, options, error, match):
    if backend == "ray" and not HAVE_RAY:
        pytest.skip('needs the "ray" extra: pip install "aiovec[ray]"')
    factory = Counted()
    with pytest.raises(error, match=match):
        aiovec.AsyncioVectorEnv([factory] * 2, backend=backend, backend_options=options)
    assert factory.calls == 0


@needs_ray
def test_an_option_ray_refuses_is_refused_before_any_actor_starts(ray_cluster):
    factory = Counted()
    with pytest.raises(ValueError, match="num_cpus"):
        aiovec.BlockingVectorEnv([factory] * 2, backend="ray", backend_options={"num_cpus": -1})
    assert factory.calls == 0


# --------------------------------------------------------------------------- placement


@needs_ray
def test_actors_spread_over_the_raylets_and_give_the_same_results(ray_cluster):
    import ray

    nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    venv = aiovec.BlockingVectorEnv(fns(), backend="ray", num_workers=2)
    try:
        hosts = venv.vector_env._backend.node_ids
        assert len(set(hosts)) == 2, f"both actors on one raylet: {hosts}"
        assert set(hosts) <= nodes
        assert_same_as_inline(venv)
    finally:
        venv.close()


def assert_same_as_inline(venv: aiovec.BlockingVectorEnv) -> None:
    """``venv`` (over `fns`) resets and steps exactly as the inline backend does."""
    oracle = aiovec.BlockingVectorEnv(fns())
    try:
        for got, want in zip(venv.reset(seed=5), oracle.reset(seed=5), strict=True):
            np.testing.assert_equal(got, want)
        for step in range(3):
            actions = (np.arange(NUM_ENVS) + step) % 3
            for got, want in zip(venv.step(actions), oracle.step(actions), strict=True):
                np.testing.assert_equal(got, want)
    finally:
        oracle.close()


@pytest.fixture
def doomed_node(ray_cluster: Any) -> Iterator[tuple[Any, str]]:
    """A third node of the cluster, with a custom resource ``doomed``; removed at the end."""
    if ray_cluster is None:
        pytest.skip('needs the "ray" extra: pip install "aiovec[ray]"')
    node = ray_cluster.add_node(**RAY_NODE, resources={"doomed": 4})
    ray_cluster.wait_for_nodes()
    try:
        yield node, node.node_id
    finally:
        if node in ray_cluster.worker_nodes:
            ray_cluster.remove_node(node)


class HangsWhenTold(SpaceEnv):
    """Steps at once until its ``hang`` attribute is set; then its step never returns."""

    hang = False

    def step(self, action: Any) -> Any:
        if self.hang:
            threading.Event().wait()  # until its process goes
        return super().step(action)


@needs_ray
def test_custom_resources_place_actors_and_a_lost_node_fails_their_envs(ray_cluster, doomed_node):
    import ray

    node, node_id = doomed_node
    options = {"resources": {"doomed": 1}, "num_cpus": 0, "placement_timeout": PLACEMENT_TIMEOUT}
    fns_ = [functools.partial(HangsWhenTold, min_len=50, max_len=50)] * NUM_ENVS
    venv = aiovec.BlockingVectorEnv(fns_, backend="ray", num_workers=2, backend_options=options)
    try:
        assert venv.vector_env._backend.node_ids == (node_id, node_id)
        venv.reset(seed=1)
        venv.step(np.zeros(NUM_ENVS, dtype=np.int64))
        venv.set_attr("hang", True)  # a step cannot finish before the node goes
        venv.send(np.zeros(NUM_ENVS, dtype=np.int64))  # in flight while the node goes
        ray_cluster.remove_node(node)
        with pytest.raises(aiovec.WorkerDiedError) as info:
            venv.recv(min_envs=NUM_ENVS)
        named = set(info.value.errors)
        assert named in ({0, 1}, {2, 3}, {0, 1, 2, 3}), "whole groups, as they were found dead"
        first = min(named)
        cause = info.value.errors[first]
        # the death in the process backend's words, Ray's own word as its cause
        assert isinstance(cause, ChildProcessError), repr(cause)
        assert isinstance(cause.__cause__, ray.exceptions.RayActorError), "Ray's word, kept"
        assert f"Ray actor hosting envs {first}-{first + 1}" in str(cause)
        # reset() rebuilds lost envs on new actors, which no node left can take
        with pytest.raises(aiovec.EnvError) as again:
            venv.reset(seed=2)
        assert set(again.value.errors) == set(range(NUM_ENVS))
        for i, cause in again.value.errors.items():
            assert isinstance(cause, (TimeoutError, ray.exceptions.RayActorError)), (
                f"{i}: {cause!r}"
            )
        assert any(
            isinstance(cause, TimeoutError)
            and f"was not placed within {PLACEMENT_TIMEOUT} s" in str(cause)
            and "'doomed': 1" in str(cause)
            for cause in again.value.errors.values()
        )
    finally:
        venv.close()


@needs_ray
def test_under_restart_actors_of_a_lost_node_are_replaced_elsewhere(ray_cluster, doomed_node):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node, node_id = doomed_node
    there = NodeAffinitySchedulingStrategy(node_id, soft=True)  # elsewhere once it is gone
    venv = aiovec.BlockingVectorEnv(
        fns(),
        backend="ray",
        num_workers=2,
        on_error="restart",
        backend_options={"scheduling_strategy": there},
    )
    space = venv.single_observation_space
    try:
        assert venv.vector_env._backend.node_ids == (node_id, node_id)
        venv.reset(seed=1)
        ray_cluster.remove_node(node)
        obs, rewards, terminations, truncations, infos = venv.step(np.ones(NUM_ENVS, np.int64))
        assert truncations.all()
        assert not terminations.any()
        assert not rewards.any()
        assert infos["_error"].all()
        assert all("rebuilt" in text for text in infos["error"])
        assert all(space.contains(row) for row in obs)
        assert node_id not in venv.vector_env._backend.node_ids
        _, _, _, truncations, _ = venv.step(np.ones(NUM_ENVS, np.int64))
        assert not truncations.any()
    finally:
        venv.close()


def kill_and_wait(actor: Any) -> None:
    """Kill a Ray actor and return once it is dead (``ray.kill`` only asks for it)."""
    import ray

    ray.kill(actor, no_restart=True)
    for _ in range(10_000):  # each call answers at once while it lives, then fails
        try:
            ray.get(actor.ready.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
    raise AssertionError(f"{actor} still answers after ray.kill")


@needs_ray
def test_a_killed_actor_is_worker_died_then_replaced_under_restart(ray_cluster):
    import ray

    for on_error in ("raise", "restart"):
        venv = aiovec.BlockingVectorEnv(fns(), backend="ray", num_workers=2, on_error=on_error)
        try:
            venv.reset(seed=3)
            first = venv.vector_env._backend.actors[1]
            kill_and_wait(first)
            if on_error == "raise":
                with pytest.raises(aiovec.WorkerDiedError) as info:
                    venv.step(np.zeros(NUM_ENVS, np.int64))
                assert set(info.value.errors) == {2, 3}
                cause = info.value.errors[2]  # the death as the process backend says it
                assert isinstance(cause, ChildProcessError), repr(cause)
                assert isinstance(cause.__cause__, ray.exceptions.RayActorError), repr(cause)
                assert "Ray actor hosting envs 2-3" in str(cause)
                continue
            _, _, _, truncations, infos = venv.step(np.zeros(NUM_ENVS, np.int64))
            assert truncations.tolist() == [False, False, True, True]
            assert infos["_error"].tolist() == [False, False, True, True]
            assert venv.vector_env._backend.actors[1] != first
        finally:
            venv.close()


class ImportsNowhereElse:
    """A factory that cannot be unpickled in any process but the one that made it."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __call__(self) -> SpaceEnv:
        return SpaceEnv()

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["pid"] != os.getpid():
            raise ModuleNotFoundError("No module named 'only_on_the_driver'")
        self.__dict__.update(state)


@needs_ray
def test_an_actor_that_cannot_load_its_factories_is_worker_died_with_a_hint(ray_cluster):
    fns_ = [SpaceEnv, SpaceEnv, ImportsNowhereElse(), SpaceEnv]
    with pytest.raises(aiovec.WorkerDiedError, match="importable on every node") as info:
        aiovec.BlockingVectorEnv(fns_, backend="ray", num_workers=2)
    assert set(info.value.errors) == {2, 3}


class MarksItsClose(SpaceEnv):
    """Leaves a file in ``directory`` when closed (wherever it runs on this machine)."""

    def __init__(self, directory: str, *args: Any) -> None:
        super().__init__(*args)
        self.directory = directory

    def close(self) -> None:
        with open(os.path.join(self.directory, f"closed-{id(self)}-{os.getpid()}"), "w"):
            pass


@needs_ray
def test_envs_built_before_a_failed_construction_are_closed_in_their_actors(ray_cluster, tmp_path):
    from gymnasium import spaces

    directory = str(tmp_path)
    fns_ = [functools.partial(MarksItsClose, directory)] * 3
    fns_.append(functools.partial(MarksItsClose, directory, spaces.Discrete(2)))
    with pytest.raises(ValueError, match="observation"):
        aiovec.BlockingVectorEnv(fns_, backend="ray", num_workers=2)
    assert len(os.listdir(directory)) == 4


@needs_ray
def test_close_kills_every_actor(ray_cluster):
    venv = aiovec.BlockingVectorEnv(fns(), backend="ray", num_workers=2)
    actors = venv.vector_env._backend.actors
    venv.reset(seed=0)
    venv.close()
    _assert_dead(actors)


# --------------------------------------------------------------------------- placement bound


@needs_ray
def test_an_actor_no_node_can_take_fails_construction_once_its_placement_times_out(
    ray_cluster, monkeypatch
):
    from aiovec.backends import ray as ray_backend

    killed: list[Any] = []
    kill = ray_backend._kill
    monkeypatch.setattr(ray_backend, "_kill", lambda handle: (killed.append(handle), kill(handle)))
    options = {"resources": {"nowhere": 1}, "placement_timeout": 1}
    with pytest.raises(TimeoutError, match=r"not placed within 1.0 s.*'nowhere': 1"):
        aiovec.BlockingVectorEnv(fns(), backend="ray", num_workers=2, backend_options=options)
    assert len(killed) == 2, "both actors, placed or waiting, are killed"
    _assert_dead(killed)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (float("inf"), ValueError),
        ("10", TypeError),
        (True, TypeError),
    ],
)
@needs_ray
def test_a_bad_placement_timeout_is_refused(ray_cluster, value, error):
    factory = Counted()
    with pytest.raises(error, match="placement_timeout"):
        aiovec.BlockingVectorEnv(
            [factory] * 2, backend="ray", backend_options={"placement_timeout": value}
        )
    assert factory.calls == 0


# --------------------------------------------------------------------------- actor pool


@needs_ray
def test_a_pool_hosts_the_next_vector_env_in_the_actors_of_a_closed_one(ray_cluster):
    from aiovec.backends.ray import ActorPool

    with ActorPool() as pool:
        options = {"actor_pool": pool}
        first = aiovec.BlockingVectorEnv(
            fns(), backend="ray", num_workers=2, backend_options=options
        )
        actors = set(first.vector_env._backend.actors)
        nodes = set(first.vector_env._backend.node_ids)
        first.reset(seed=1)
        first.close()
        assert len(pool) == 2
        assert pool.reused == 0
        venv = aiovec.BlockingVectorEnv(
            fns(), backend="ray", num_workers=2, backend_options=options
        )
        try:
            assert set(venv.vector_env._backend.actors) == actors
            assert set(venv.vector_env._backend.node_ids) == nodes
            assert len(pool) == 0
            assert pool.reused == 2
            assert_same_as_inline(venv)
        finally:
            venv.close()
        assert len(pool) == 2
    _assert_dead(actors)


@needs_ray
def test_a_pool_keeps_only_actors_that_closed_cleanly_and_matching_options(ray_cluster):
    from aiovec.backends.ray import ActorPool

    with ActorPool(max_idle=3) as pool:
        venv = aiovec.BlockingVectorEnv(
            fns(),
            backend="ray",
            num_workers=2,
            on_error="raise",
            backend_options={"actor_pool": pool},
        )
        killed, kept = venv.vector_env._backend.actors
        kill_and_wait(killed)
        with pytest.raises(aiovec.WorkerDiedError):
            venv.reset(seed=0)  # found dead
        venv.reset(seed=0)  # rebuilds the dead actor's envs on a new actor, not from the pool
        venv.close()
        assert len(pool) == 2
        assert kept in pool_handles(pool)
        assert killed not in pool_handles(pool)
        other = aiovec.BlockingVectorEnv(
            fns(), backend="ray", num_workers=2, backend_options={"actor_pool": pool, "num_cpus": 0}
        )
        assert not set(other.vector_env._backend.actors) & set(pool_handles(pool))
        other.close()
        assert len(pool) == 3, "the pool is full: the fourth actor was killed"
        idle = pool_handles(pool)
    _assert_dead(idle)


@needs_ray
def test_an_idle_actor_found_dead_is_replaced_by_a_new_one(ray_cluster):
    from aiovec.backends.ray import ActorPool

    with ActorPool() as pool:
        options = {"actor_pool": pool}
        aiovec.BlockingVectorEnv(
            fns(), backend="ray", num_workers=2, backend_options=options
        ).close()
        dead, alive = pool_handles(pool)
        kill_and_wait(dead)
        venv = aiovec.BlockingVectorEnv(
            fns(), backend="ray", num_workers=2, backend_options=options
        )
        try:
            actors = venv.vector_env._backend.actors
            assert alive in actors
            assert dead not in actors
            venv.reset(seed=0)
            venv.step(np.zeros(NUM_ENVS, np.int64))
        finally:
            venv.close()


@needs_ray
def test_a_closed_pool_kills_what_it_is_given(ray_cluster):
    from aiovec.backends.ray import ActorPool

    pool = ActorPool()
    venv = aiovec.BlockingVectorEnv(
        fns(), backend="ray", num_workers=2, backend_options={"actor_pool": pool}
    )
    actors = venv.vector_env._backend.actors
    pool.close()
    venv.close()
    assert pool.closed
    assert len(pool) == 0
    _assert_dead(actors)
    with pytest.raises(TypeError, match="ActorPool"):
        aiovec.BlockingVectorEnv(fns(), backend="ray", backend_options={"actor_pool": object()})


def pool_handles(pool: Any) -> list[Any]:
    return [entry[2] for entry in pool._idle]


def _assert_dead(actors: Any) -> None:
    """Each actor stops answering: ``ray.kill`` is asynchronous (it goes through Ray's
    control store), so a call sent just after it may still be answered."""
    import ray

    deadline = time.monotonic() + 30
    for actor in actors:
        while True:
            try:
                ray.get(actor.ready.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                break
            assert time.monotonic() < deadline, f"{actor} still answers 30 s after its kill"


@pytest.mark.parametrize(("value", "error"), [("3", TypeError), (2.0, TypeError), (-1, ValueError)])
@needs_ray
def test_a_bad_max_idle_is_refused(value, error):
    from aiovec.backends.ray import ActorPool

    with pytest.raises(error, match="max_idle"):
        ActorPool(max_idle=value)


# --------------------------------------------------------------------------- cancel in an actor


def _gated(gate: Any, hang: bool) -> Any:
    return AsyncHangingEnv(SpaceEnv(min_len=50, max_len=50), gate, at=1 if hang else 1 << 30)


@needs_ray
@pytest.mark.timeout(30)
@pytest.mark.asyncio
async def test_an_actor_cancels_a_call_whose_cancel_came_before_it(tmp_path):
    """`GroupActor` run on this loop (its methods are what Ray calls).

    A cancel that overtakes its call cancels the call as it starts (a step, a
    streamed step); one naming a call already over does nothing to later calls.
    Env 0's first step would wait on the gate for ever: only a cancel ends it.
    """
    import cloudpickle

    from aiovec.backends.pool.messages import StepRequest
    from aiovec.backends.ray.actor import GroupActor

    gate = Gate(tmp_path)
    fns = [functools.partial(_gated, gate, True), functools.partial(_gated, gate, False)]
    actor = GroupActor()
    try:
        ready = await actor.load(cloudpickle.dumps(fns), 0)
        assert ready.asyncs == (True, True)
        await actor.cancel(7, [0])  # call 7 has not started: kept for it
        reply = await actor.step(StepRequest(7, [0, 1], "NextStep", [False, False], [0, 1]))
        assert set(reply.errors) == {0}
        assert isinstance(reply.errors[0], asyncio.CancelledError)
        await actor.cancel(7, [1])  # call 7 is over: nothing to cancel
        reply = await actor.step(StepRequest(8, [1], "NextStep", [False], [1]))
        assert not reply.errors
        await actor.cancel(9, [0])  # a streamed step overtaken by its cancel
        streamed = StepRequest(9, [0], "NextStep", [False], [0], True)
        parts = [part async for part in actor.step_stream(streamed)]
        assert set(parts[-1].errors) == {0}
        assert not actor.early  # nothing kept once the calls are over
        assert not actor.waiting
    finally:
        gate.release()


# --------------------------------------------------------------------------- nothing left behind


def _others() -> set[asyncio.Task[Any]]:
    """The tasks of this loop that have not finished, but the test's own."""
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current and not task.done()}


@needs_ray
@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_a_timed_out_step_leaves_no_task_of_its_own_running(ray_cluster, tmp_path):
    """Issue 34: an async env past ``step_timeout`` is cancelled in its actor; the step's
    streamed replies are received to their end before `aiovec.EnvTimeoutError` is raised."""
    from conftest import shared_actors

    gate = Gate(tmp_path)
    fns = [functools.partial(_gated, gate, i == 0) for i in range(NUM_ENVS)]
    before = _others()
    venv = aiovec.AsyncioVectorEnv(
        fns, backend="ray", num_workers=2, step_timeout=0.5, **shared_actors("ray")
    )
    try:
        await venv.reset(seed=0)
        with pytest.raises(aiovec.EnvTimeoutError) as caught:
            await venv.step(np.zeros(NUM_ENVS, np.int64))
        assert set(caught.value.errors) == {0}
        assert _others() == before  # the step's streamed task ended before the error
    finally:
        gate.release()
        await venv.close()
