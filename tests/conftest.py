"""Shared scaffolding of the scenario suites.

One scenario body runs through every backend x front end x env flavour:

- **front ends**: ``"await"`` drives an :class:`aiovec.AsyncioVectorEnv` on one
  ``asyncio.Runner`` owned by the adapter for its whole life;
  ``"blocking"`` forwards to an :class:`aiovec.BlockingVectorEnv`.
- **flavours**: ``"sync"`` hands plain gymnasium envs to aiovec; ``"async"``
  wraps each in :class:`aiovec.testing.AsyncTwin`, so a batch finishes in a
  random order.
- **the oracle** is ``gymnasium.vector.SyncVectorEnv`` over the same plain
  factories; :class:`Lockstep` drives both with the same seeds and actions and
  asserts identical results after every call.

Adding a backend is one line: append its name to :data:`BACKENDS`.  ``"ray"``
is there when Ray is installed: its tests run on one local Ray cluster of two
nodes (:func:`ray_cluster`), started once per session, before any test's leak
check, and only when a collected test needs it.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import importlib.util
import math
import os
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import gymnasium
import numpy as np
import pytest
import served
from faults.leaks import LeakCheck
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import aiovec
from aiovec.testing import AsyncTwin, SpaceEnv

HAVE_RAY = importlib.util.find_spec("ray") is not None
BACKENDS = [
    "inline",
    "thread",
    "process",
    *(["ray"] if HAVE_RAY else []),
    *(["remote"] if served.HAVE_SERVE else []),
]
LOCAL_BACKENDS = [b for b in BACKENDS if b != "remote"]
"""The backends a test can hand local factories to directly (``"remote"``'s envs are
sessions on a server: `open_front_end` makes them from the factories)."""
SYNC_ONLY_BACKENDS = {"thread"}  # they run synchronous (blocking) envs only
FRONT_ENDS = ["await", "blocking"]
FLAVOURS = ["sync", "async"]
MODES = list(AutoresetMode)

EnvFn = Callable[[], Any]

# Observation / action space pairs the scenarios run over (name -> (obs, act)).
SPACES: dict[str, tuple[spaces.Space[Any], spaces.Space[Any]]] = {
    "box-discrete": (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3)),
    "image-box": (
        spaces.Box(0, 255, (4, 4, 3), np.uint8),
        spaces.Box(-2.0, 2.0, (2,), np.float32),
    ),
    "discrete-multidiscrete": (spaces.Discrete(5, start=-2), spaces.MultiDiscrete([3, 4])),
    "multidiscrete-multibinary": (spaces.MultiDiscrete([2, 3, 4]), spaces.MultiBinary(3)),
    "multibinary-box64": (
        spaces.MultiBinary([2, 2]),
        spaces.Box(-1.0, 1.0, (2, 2), np.float64),
    ),
    "dict-tuple": (
        spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (2,), np.float64), "id": spaces.Discrete(4)}),
        spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float32))),
    ),
    "nested-dict-of-tuple": (
        spaces.Dict(
            {
                "a": spaces.Tuple(
                    (spaces.Box(0, 10, (2,), np.int64), spaces.Discrete(3)),
                ),
                "b": spaces.Dict(
                    {"c": spaces.MultiBinary(2), "d": spaces.MultiDiscrete([[2, 3], [4, 5]])}
                ),
            }
        ),
        spaces.Dict(
            {
                "x": spaces.Discrete(2),
                "y": spaces.Tuple(
                    (spaces.Box(-1.0, 1.0, (1,), np.float32), spaces.MultiDiscrete([2, 2]))
                ),
            }
        ),
    ),
}


# --------------------------------------------------------------------------- factories


def space_env_fns(
    num_envs: int,
    space: str = "box-discrete",
    **kwargs: Any,
) -> list[EnvFn]:
    """``num_envs`` factories of :class:`SpaceEnv` over the named space pair."""
    obs_space, act_space = SPACES[space]
    return [functools.partial(SpaceEnv, obs_space, act_space, **kwargs) for _ in range(num_envs)]


def _make_twin(fn: EnvFn, index: int, max_yields: int) -> AsyncTwin:
    return AsyncTwin(fn(), max_yields=max_yields, seed=7919 * (index + 1))


def flavoured(fns: Sequence[EnvFn], flavour: str, *, max_yields: int = 4) -> Sequence[EnvFn]:
    """The factories aiovec gets: as given (``"sync"``) or wrapped in ``AsyncTwin``.

    Anything but a list/tuple of callables (bad input under test) is passed on as is.
    """
    if flavour == "sync" or not isinstance(fns, list | tuple) or not all(map(callable, fns)):
        return fns  # type: ignore[return-value]
    if flavour == "async":
        return [functools.partial(_make_twin, fn, i, max_yields) for i, fn in enumerate(fns)]
    raise AssertionError(f"unknown flavour {flavour!r}")


# --------------------------------------------------------------------------- front ends


def run_main_task(runner: asyncio.Runner, coro: Coroutine[Any, Any, Any]) -> Any:
    """``runner.run(coro)``, with the result handed back beside the main task, not as its result.

    ``asyncio.Runner.run`` sets a SIGINT handler that holds the main task, and sets
    the old one back at the end; ``signal.signal`` (Python 3.11) then formats the
    repr of the handler it replaces, the task's result included, and throws it
    away.  A step's result is arrays: that repr was a fifth of a scenario test.
    The coroutine runs as before, on the runner's loop; cancelling the main task
    (Ctrl-C) cancels it where it waits; its error propagates unchanged.
    """
    box: list[Any] = []
    runner.run(_kept_in(box, coro))
    return box[0]


async def _kept_in(box: list[Any], coro: Coroutine[Any, Any, Any]) -> None:
    box.append(await coro)


async def _build_asyncio_env(
    env_fns: Sequence[EnvFn], kwargs: dict[str, Any]
) -> aiovec.AsyncioVectorEnv:
    return aiovec.AsyncioVectorEnv(env_fns, **kwargs)


class AwaitFrontEnd:
    """A synchronous face of one ``AsyncioVectorEnv``, run on one ``asyncio.Runner``.

    The vector env is built inside the runner's loop and every coroutine runs on
    that same loop, as an asyncio program would.
    """

    front_end = "await"

    def __init__(self, env_fns: Sequence[EnvFn], **kwargs: Any) -> None:
        self._runner = asyncio.Runner()
        try:
            self.venv = self._runner.run(_build_asyncio_env(env_fns, kwargs))
        except BaseException:
            self._runner.close()
            raise

    def __getattr__(self, name: str) -> Any:
        if name in {"venv", "_runner"}:
            raise AttributeError(name)
        return getattr(self.venv, name)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run any coroutine on the adapter's loop (as the main task of ``asyncio.Runner.run``)."""
        return run_main_task(self._runner, coro)

    def reset(self, **kwargs: Any) -> Any:
        return self.run(self.venv.reset(**kwargs))

    def step(self, actions: Any) -> Any:
        return self.run(self.venv.step(actions))

    def render(self) -> Any:
        return self.run(self.venv.render())

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.venv.call(name, *args, **kwargs))

    def get_attr(self, name: str, **kwargs: Any) -> Any:
        return self.run(self.venv.get_attr(name, **kwargs))

    def set_attr(self, name: str, values: Any, **kwargs: Any) -> Any:
        return self.run(self.venv.set_attr(name, values, **kwargs))

    def env_is_wrapped(self, wrapper_class: type, **kwargs: Any) -> Any:
        return self.run(self.venv.env_is_wrapped(wrapper_class, **kwargs))

    def close(self) -> Any:
        return self.run(self.venv.close())

    def shutdown(self) -> None:
        """Close the vector env (if still open) and the runner; for teardown."""
        try:
            if not self.venv.closed:
                self.close()
        finally:
            self._runner.close()


class BlockingFrontEnd:
    """Forwards to an ``aiovec.BlockingVectorEnv``."""

    front_end = "blocking"

    def __init__(self, env_fns: Sequence[EnvFn], **kwargs: Any) -> None:
        self.venv = aiovec.BlockingVectorEnv(env_fns, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "venv":
            raise AttributeError(name)
        return getattr(self.venv, name)

    def reset(self, **kwargs: Any) -> Any:
        return self.venv.reset(**kwargs)

    def step(self, actions: Any) -> Any:
        return self.venv.step(actions)

    def render(self) -> Any:
        return self.venv.render()

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.venv.call(name, *args, **kwargs)

    def get_attr(self, name: str, **kwargs: Any) -> Any:
        return self.venv.get_attr(name, **kwargs)

    def set_attr(self, name: str, values: Any, **kwargs: Any) -> Any:
        return self.venv.set_attr(name, values, **kwargs)

    def env_is_wrapped(self, wrapper_class: type, **kwargs: Any) -> Any:
        return self.venv.env_is_wrapped(wrapper_class, **kwargs)

    def close(self) -> Any:
        return self.venv.close()

    def shutdown(self) -> None:
        if not self.venv.closed:
            self.venv.close()


class SplitFrontEnd(BlockingFrontEnd):
    """A ``BlockingVectorEnv`` driven through gymnasium's ``AsyncVectorEnv`` spellings.

    ``reset`` is ``reset_async`` + ``reset_wait`` and ``step`` is ``step_async``
    + ``step_wait``: run through the scenario suite, they must give exactly
    what ``reset`` and ``step`` give.  Not in :data:`FRONT_ENDS` (the whole
    suite a third time is too slow); tests pick it with ``front_end="split"``.
    """

    front_end = "split"

    def reset(self, **kwargs: Any) -> Any:
        self.venv.reset_async(**kwargs)
        return self.venv.reset_wait()

    def step(self, actions: Any) -> Any:
        self.venv.step_async(actions)
        return self.venv.step_wait()


FrontEnd = AwaitFrontEnd | BlockingFrontEnd


def shared_actors(backend: str) -> dict[str, Any]:
    """Keyword arguments that host a ray vector env in the session's actors; ``{}`` elsewhere.

    Actors of the closed vector envs host the next ones' envs (:data:`RAY_ACTORS`):
    a new actor is a process that takes about a second to start.
    """
    if backend == "ray" and RAY_ACTORS:
        return {"backend_options": {"actor_pool": RAY_ACTORS[0]}}
    return {}


def open_front_end(
    front_end: str,
    env_fns: Sequence[EnvFn],
    *,
    flavour: str = "sync",
    backend: str = "inline",
    **kwargs: Any,
) -> FrontEnd:
    """Build aiovec through ``front_end`` over ``env_fns`` in the given flavour."""
    cls = {"await": AwaitFrontEnd, "blocking": BlockingFrontEnd, "split": SplitFrontEnd}[front_end]
    if backend == "ray":  # one actor per raylet of the test cluster (each costs a process)
        kwargs.setdefault("num_workers", 2)
        for key, value in shared_actors(backend).items():
            kwargs.setdefault(key, value)
    fns = flavoured(env_fns, flavour)
    if backend == "remote":  # the same envs, built on the session's server
        fns = served.sessions(fns)
    adapter = cls(fns, backend=backend, **kwargs)
    adapter.flavour = flavour
    adapter.backend = backend
    return adapter


@contextmanager
def driven(front_end: str, env_fns: Sequence[EnvFn], **kwargs: Any) -> Iterator[FrontEnd]:
    """:func:`open_front_end` as a context manager (for hypothesis bodies)."""
    adapter = open_front_end(front_end, env_fns, **kwargs)
    try:
        yield adapter
    finally:
        adapter.shutdown()


@contextmanager
def oracle_env(env_fns: Sequence[EnvFn], **kwargs: Any) -> Iterator[SyncVectorEnv]:
    """gymnasium's ``SyncVectorEnv`` over the same factories, always closed."""
    oracle = SyncVectorEnv(env_fns, **kwargs)
    try:
        yield oracle
    finally:
        oracle.close()


# --------------------------------------------------------------------------- fixtures


def freeze_what_the_session_keeps() -> None:
    """Collect garbage, then move every object alive now out of the collector's sight.

    What is alive here (modules, collected tests, the Ray client) stays alive until
    the session ends.  The leak check (``faults/leaks.py``) runs ``gc.collect()``
    after each of ~1,000 fault tests and fuzz examples: with these objects frozen, a
    collection looks only at what the tests made since, about a tenth of the work
    (frozen objects are still freed by reference counting; only cycles among them
    are not looked for).  Nothing a test makes is frozen, so what the check sees,
    and the ``ResourceWarning`` of a vector env dropped unclosed, are unchanged.
    """
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    freeze_what_the_session_keeps()


ASYNC_ENVS = "async_envs"
"""The mark of a test that hands async envs to aiovec whatever its ``flavour``."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{ASYNC_ENVS}: hands async envs to aiovec (not collected on sync-only backends)"
    )


def exists(item: pytest.Item) -> bool:
    """Whether a collected combination is one aiovec accepts.

    A sync-only backend refuses async envs by design (``test_factory_rule.py``
    checks the refusal): a test that runs async envs there (``flavour="async"``,
    or the :data:`ASYNC_ENVS` mark) is not a test case, so it is not collected.
    """
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if params.get("backend") not in SYNC_ONLY_BACKENDS:
        return True
    return params.get("flavour") != "async" and item.get_closest_marker(ASYNC_ENVS) is None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = [item for item in items if exists(item)]


@pytest.fixture(autouse=True, scope="session")
def _process_workers_start_with_fork() -> Iterator[None]:
    """The scenario suite starts process workers with fork: 40% faster than forkserver.

    ``tests/test_process.py`` runs its cases under all three start methods.
    """
    from aiovec.backends import process  # imported here: aiovec loads backends lazily

    before, process.START_METHOD = process.START_METHOD, "fork"
    yield
    process.START_METHOD = before


def uses_ray(item: pytest.Item) -> bool:
    """Whether a collected test runs on the ray backend (a parameter or the ``ray`` mark)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("backend") == "ray":
        return True
    return item.get_closest_marker("ray") is not None


RAY_NODE = {"num_cpus": 2, "object_store_memory": 100 * 1024 * 1024}
"""Each node of the test cluster: logical CPUs (actors spread over them), a small store."""
RAY_ACTORS: list[Any] = []
"""The session's `aiovec.backends.ray.ActorPool` (while the cluster is up), which every
ray vector env built by `open_front_end` takes its actors from and gives them back to:
a new actor is a process that takes about a second to start (docs/ray.md)."""


@pytest.fixture(scope="session", autouse=True)
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A local Ray cluster of two nodes (two raylets), connected; shut down at the end.

    Started only if some collected test uses ray.  Session-scoped and autouse, so
    it is up before the first test's leak check looks at this process's threads
    and fds.
    """
    if not HAVE_RAY or not any(uses_ray(item) for item in request.session.items):
        yield None
        return
    import ray
    from ray.cluster_utils import Cluster

    tests = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    cluster = Cluster(initialize_head=True, head_node_args={**RAY_NODE, "include_dashboard": False})
    try:
        cluster.add_node(**RAY_NODE)
        cluster.wait_for_nodes()
        # the actors unpickle factories defined in the test modules: they import them
        ray.init(
            address=cluster.address,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
            log_to_driver=False,
        )
        from aiovec.backends.ray import ActorPool

        with ActorPool() as pool:
            RAY_ACTORS.append(pool)
            try:
                _warm_up_ray(pool)
                freeze_what_the_session_keeps()  # Ray's modules and client, loaded just now
                yield cluster
            finally:
                RAY_ACTORS.clear()
    finally:
        ray.shutdown()
        cluster.shutdown()


def _warm_up_ray(pool: Any) -> None:
    """Run one vector env on both raylets, so that Ray opens the connections it keeps.

    Ray opens some sockets on first use and keeps them for the session (their
    number does not grow with the vector envs made); opened here, they are
    part of every test's leak-check snapshot instead of the first test's leak.
    """
    venv = aiovec.BlockingVectorEnv(
        space_env_fns(2), backend="ray", num_workers=2, backend_options={"actor_pool": pool}
    )
    try:
        venv.reset(seed=0)
        venv.step(venv.action_space.sample())
    finally:
        venv.close()


def uses_remote(item: pytest.Item) -> bool:
    """Whether a collected test runs on the remote backend (a parameter)."""
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("backend") == "remote"


@pytest.fixture(scope="session", autouse=True)
def serve_server(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The aiovec server of ``backend="remote"`` (``served.py``), if a collected test needs it.

    Session-scoped and autouse, so that its thread is up before the first test's
    leak check.
    """
    if not served.HAVE_SERVE or not any(uses_remote(item) for item in request.session.items):
        yield None
        return
    yield from served.running_server()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, ray_cluster: Any) -> str:
    return str(request.param)


@pytest.fixture(params=FRONT_ENDS)
def front_end(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_venv(backend: str, front_end: str, flavour: str) -> Iterator[Callable[..., FrontEnd]]:
    """Build aiovec (plain factories in; the flavour is applied here); closed at teardown."""
    opened: list[FrontEnd] = []

    def make(env_fns: Sequence[EnvFn], **kwargs: Any) -> FrontEnd:
        adapter = open_front_end(front_end, env_fns, flavour=flavour, backend=backend, **kwargs)
        opened.append(adapter)
        return adapter

    yield make
    errors = []
    for adapter in reversed(opened):
        try:
            adapter.shutdown()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    assert not errors, f"closing aiovec at teardown failed: {errors!r}"


@pytest.fixture
def make_oracle() -> Iterator[Callable[..., SyncVectorEnv]]:
    """Build gymnasium's ``SyncVectorEnv``; closed at teardown."""
    opened: list[SyncVectorEnv] = []

    def make(env_fns: Sequence[EnvFn], **kwargs: Any) -> SyncVectorEnv:
        oracle = SyncVectorEnv(env_fns, **kwargs)
        opened.append(oracle)
        return oracle

    yield make
    for oracle in opened:
        oracle.close()


@pytest.fixture
def make_lockstep(
    make_venv: Callable[..., FrontEnd], make_oracle: Callable[..., SyncVectorEnv]
) -> Callable[..., Lockstep]:
    """Build aiovec and the oracle over the same factories, driven together."""

    def make(
        env_fns: Sequence[EnvFn],
        *,
        autoreset_mode: Any = AutoresetMode.NEXT_STEP,
        action_seed: int = 0,
        **kwargs: Any,
    ) -> Lockstep:
        venv = make_venv(env_fns, autoreset_mode=autoreset_mode, **kwargs)
        oracle_kwargs = {"copy": kwargs["copy"]} if "copy" in kwargs else {}
        oracle = make_oracle(env_fns, autoreset_mode=autoreset_mode, **oracle_kwargs)
        return Lockstep(venv, oracle, action_seed=action_seed)

    return make


@pytest.fixture
def leak_check(request: pytest.FixtureRequest) -> Iterator[LeakCheck]:
    """Fail the test if it leaves a thread, child process, fd or shared-memory block behind.

    See ``tests/faults/leaks.py``.  The fault suite and the fuzz tests use it
    on every test; ``AIOVEC_LEAK_CHECK=all`` puts it on every test of the suite.
    On ray, sockets are not counted: Ray's own threads open and close their
    connections (to raylets and actor workers) when they please, and aiovec opens
    none there; that the actors themselves go is checked in ``test_ray.py``.
    """
    check = LeakCheck.start()
    yield check
    leaks = check.finish()
    if uses_ray(request.node):
        leaks = [leak for leak in leaks if " -> socket:[" not in leak]
    assert not leaks, "the test left behind: " + "; ".join(leaks)


@pytest.fixture(autouse=True)
def _leak_check_everywhere(request: pytest.FixtureRequest) -> None:
    if os.environ.get("AIOVEC_LEAK_CHECK") == "all":
        request.getfixturevalue("leak_check")


# --------------------------------------------------------------------------- comparisons


def _where(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "<root>"


def assert_same(
    actual: Any,
    expected: Any,
    path: tuple[Any, ...] = (),
    *,
    ignore: frozenset[tuple[Any, ...]] = frozenset(),
) -> None:
    """Assert ``actual`` equals ``expected`` exactly, recursively.

    Arrays must agree in type, dtype, shape and every element (object arrays
    element by element); mappings in their key sets; tuples/lists in length and
    items; scalars in type and value.  ``ignore`` lists key paths not compared.
    """
    if path in ignore:
        return
    where = _where(path)
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), f"{where}: expected an ndarray, got {actual!r}"
        assert actual.dtype == expected.dtype, (
            f"{where}: dtype {actual.dtype} != expected {expected.dtype}"
        )
        assert actual.shape == expected.shape, (
            f"{where}: shape {actual.shape} != expected {expected.shape}"
        )
        if expected.dtype == object:
            for index in np.ndindex(expected.shape):
                assert_same(actual[index], expected[index], (*path, index), ignore=ignore)
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=where, strict=True)
    elif isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{where}: expected a mapping, got {actual!r}"
        assert set(actual) == set(expected), (
            f"{where}: keys {sorted(map(str, actual))} != expected {sorted(map(str, expected))}"
        )
        for key in expected:
            assert_same(actual[key], expected[key], (*path, key), ignore=ignore)
    elif isinstance(expected, tuple | list):
        assert type(actual) is type(expected), (
            f"{where}: expected a {type(expected).__name__}, got {actual!r}"
        )
        assert len(actual) == len(expected), f"{where}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, (*path, i), ignore=ignore)
    elif expected is None:
        assert actual is None, f"{where}: expected None, got {actual!r}"
    else:
        assert type(actual) is type(expected), (
            f"{where}: type {type(actual).__name__} != expected {type(expected).__name__}"
        )
        same = actual == expected or (
            isinstance(expected, float) and math.isnan(expected) and math.isnan(actual)
        )
        assert same, f"{where}: {actual!r} != expected {expected!r}"


def assert_infos_equal(
    actual: Mapping[str, Any],
    expected: Mapping[str, Any],
    *,
    ignore: frozenset[tuple[Any, ...]] = frozenset(),
) -> None:
    """Vector infos identical: keys, ``_key`` masks, values, dtypes, nested dicts.

    Object arrays (``final_obs``, strings) are compared element by element, and
    unmasked entries too (gymnasium fills them with zeros / ``None``).  ``ignore``
    lists key paths (e.g. ``("episode", "t")``) left out.
    """
    assert type(actual) is dict, f"infos must be a dict, got {type(actual).__name__}"
    assert_same(actual, expected, ("infos",), ignore={("infos", *p) for p in ignore})


RESET_FIELDS = ("obs", "infos")
STEP_FIELDS = ("obs", "rewards", "terminations", "truncations", "infos")


def assert_results_equal(
    actual: Sequence[Any],
    expected: Sequence[Any],
    fields: Sequence[str] = STEP_FIELDS,
    *,
    ignore: frozenset[tuple[Any, ...]] = frozenset(),
) -> None:
    """A reset or step result equals the oracle's, field by field.

    ``ignore`` holds info key paths (without the leading ``"infos"``) not compared.
    """
    assert isinstance(actual, tuple), f"expected a tuple result, got {type(actual).__name__}"
    assert len(actual) == len(fields), f"expected {len(fields)} results, got {len(actual)}"
    for name, a, e in zip(fields, actual, expected, strict=True):
        if name == "infos":
            assert_infos_equal(a, e, ignore=ignore)
        else:
            assert_same(a, e, (name,))


def assert_spaces_equal(venv: Any, oracle: gymnasium.vector.VectorEnv) -> None:
    """Batched and single spaces, num_envs, render_mode and metadata agree."""
    assert venv.num_envs == oracle.num_envs
    assert venv.single_observation_space == oracle.single_observation_space
    assert venv.single_action_space == oracle.single_action_space
    assert venv.observation_space == oracle.observation_space
    assert venv.action_space == oracle.action_space
    assert venv.render_mode == oracle.render_mode
    mode = venv.metadata["autoreset_mode"]
    assert isinstance(mode, AutoresetMode), f"metadata autoreset_mode is {mode!r}"
    assert mode == oracle.metadata["autoreset_mode"]
    for key, value in oracle.metadata.items():
        assert venv.metadata.get(key) == value, f"metadata[{key!r}] differs"


# --------------------------------------------------------------------------- lockstep driver


class Lockstep:
    """Drive aiovec and the oracle with the same calls; every result must match.

    Actions come from the batched action space seeded with ``action_seed``;
    each side gets its own deep copy of every argument (gymnasium pops
    ``reset_mask`` from the options dict it is given).  ``ignore`` lists info
    key paths left out of the comparison.
    """

    def __init__(
        self,
        venv: Any,
        oracle: SyncVectorEnv,
        *,
        action_seed: int = 0,
        ignore: frozenset[tuple[Any, ...]] = frozenset(),
    ) -> None:
        self.venv = venv
        self.oracle = oracle
        self.ignore = ignore
        self.actions_space = copy.deepcopy(oracle.action_space)
        self.actions_space.seed(action_seed)
        self.last: tuple[Any, ...] | None = None

    @property
    def num_envs(self) -> int:
        return int(self.oracle.num_envs)

    def sample(self) -> Any:
        """The next random valid batch of actions."""
        return self.actions_space.sample()

    def reset(self, **kwargs: Any) -> tuple[Any, ...]:
        expected = self.oracle.reset(**copy.deepcopy(kwargs))
        actual = self.venv.reset(**copy.deepcopy(kwargs))
        assert_results_equal(actual, expected, RESET_FIELDS, ignore=self.ignore)
        return expected

    def step(self, actions: Any = None) -> tuple[Any, ...]:
        """Step both; return the oracle's result."""
        return self.step_pair(actions)[1]

    def step_pair(self, actions: Any = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Step both; return ``(aiovec's result, the oracle's result)``."""
        if actions is None:
            actions = self.sample()
        expected = self.oracle.step(copy.deepcopy(actions))
        actual = self.venv.step(copy.deepcopy(actions))
        assert_results_equal(actual, expected, ignore=self.ignore)
        self.last = expected
        return actual, expected

    def ended(self) -> np.ndarray:
        """Which envs ended on the last step (all False before any step)."""
        if self.last is None:
            return np.zeros(self.num_envs, dtype=np.bool_)
        return np.logical_or(self.last[2], self.last[3])

    def render(self) -> tuple[Any, ...]:
        expected = self.oracle.render()
        assert_same(self.venv.render(), expected, ("render",))
        return expected

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        expected = self.oracle.call(name, *args, **kwargs)
        assert_same(self.venv.call(name, *args, **kwargs), expected, ("call", name))
        return expected

    def get_attr(self, name: str) -> tuple[Any, ...]:
        expected = self.oracle.get_attr(name)
        assert_same(self.venv.get_attr(name), expected, ("get_attr", name))
        return expected

    def set_attr(self, name: str, values: Any) -> None:
        self.oracle.set_attr(name, copy.deepcopy(values))
        assert self.venv.set_attr(name, copy.deepcopy(values)) is None


def random_policy(space: gymnasium.spaces.Space[Any]) -> Callable[..., Any]:
    """A collector's policy: seeded random actions, and each env's id x 10 as an extra."""
    rng = np.random.default_rng(3)

    def policy(obs: Any, env_ids: np.ndarray) -> Any:
        space.seed(int(rng.integers(2**31)))
        return np.array([space.sample() for _ in env_ids]), {"tag": env_ids * 10}

    return policy


def counters(venv: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Each env's ``(episodes, episode_steps)`` (SpaceEnv counters): did anything run?"""
    return tuple(venv.get_attr("episodes")), tuple(venv.get_attr("episode_steps"))


__all__ = [
    "BACKENDS",
    "FLAVOURS",
    "FRONT_ENDS",
    "LOCAL_BACKENDS",
    "MODES",
    "SPACES",
    "AwaitFrontEnd",
    "BlockingFrontEnd",
    "Lockstep",
    "SplitFrontEnd",
    "assert_infos_equal",
    "assert_results_equal",
    "assert_same",
    "assert_spaces_equal",
    "counters",
    "driven",
    "flavoured",
    "open_front_end",
    "oracle_env",
    "random_policy",
    "run_main_task",
    "shared_actors",
    "space_env_fns",
]
