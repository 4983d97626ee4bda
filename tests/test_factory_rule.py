"""The factory rule: env factories run on the event loop that runs the envs; async ones are awaited.

`LoopBoundEnv` stands in for an env that opens a client session (aiohttp's
``ClientSession``) in ``__init__``: it needs ``asyncio.get_running_loop()`` there,
and keeps a future of that loop that each call awaits, which fails unless the
call runs on the very loop the env was built on.  `make_env_after_waiting` is an
``async def`` factory that truly suspends (it waits for a callback of the loop, as
a connect waits for the server): the await API builds it with
``AsyncioVectorEnv.create``, the blocking one in its constructor.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from conftest import BACKENDS, FRONT_ENDS, SYNC_ONLY_BACKENDS, AwaitFrontEnd, open_front_end
from gymnasium import spaces

import aiovec

ASYNC_BACKENDS = [b for b in BACKENDS if b not in SYNC_ONLY_BACKENDS]


class LoopBoundEnv(aiovec.AsyncEnv[np.ndarray, np.int64]):
    """An env bound, from its ``__init__`` on, to the running loop (as a client session is)."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()  # "no running event loop" off the loop
        self.session: asyncio.Future[None] = self.loop.create_future()
        self.loop.call_soon(self.session.set_result, None)
        self.fail = False
        self.closed = False

    async def close(self) -> None:
        self.closed = True

    async def _request(self) -> np.ndarray:
        await self.session  # "attached to a different loop" if called on another loop
        assert asyncio.get_running_loop() is self.loop
        return np.zeros(1, np.float32)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        await super().reset(seed=seed)
        return await self._request(), {}

    async def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.fail:
            raise ConnectionResetError("the server went away")
        return await self._request(), 1.0, False, False, {}


async def make_loop_bound_env() -> LoopBoundEnv:
    """An ``async def`` factory that finishes without waiting."""
    return LoopBoundEnv()


async def connect() -> None:
    """Wait until the loop has run a callback (as a connect waits for its server)."""
    connected = asyncio.Event()
    asyncio.get_running_loop().call_soon(connected.set)
    await connected.wait()


async def make_env_after_waiting() -> LoopBoundEnv:
    """An ``async def`` factory that waits on the loop (as a connect would)."""
    await connect()
    return LoopBoundEnv()


class CreatedFrontEnd(AwaitFrontEnd):
    """The await front end, built with ``await AsyncioVectorEnv.create(...)``."""

    def __init__(self, env_fns: Any, **kwargs: Any) -> None:
        self._runner = asyncio.Runner()
        try:
            self.venv = self._runner.run(aiovec.AsyncioVectorEnv.create(env_fns, **kwargs))
        except BaseException:
            self._runner.close()
            raise


def open_awaiting(front_end: str, env_fns: Any, **kwargs: Any) -> Any:
    """Open ``front_end`` the way that awaits factories that wait (``create`` for await)."""
    if front_end == "await":
        return CreatedFrontEnd(env_fns, **kwargs)
    return open_front_end(front_end, env_fns, **kwargs)


def run_and_restart_env_0(venv: Any) -> None:
    """Step, fail env 0 (rebuilt from its factory), and step the rebuilt env."""
    venv.reset(seed=0)
    _, rewards, _, truncations, _ = venv.step(np.zeros(2, np.int64))
    assert rewards.tolist() == [1.0, 1.0]
    assert not truncations.any()
    venv.set_attr("fail", [True, False])  # env 0 fails: rebuilt from its factory
    _, rewards, _, truncations, infos = venv.step(np.zeros(2, np.int64))
    assert truncations.tolist() == [True, False]
    assert infos["_error"].tolist() == [True, False]
    venv.step(np.zeros(2, np.int64))  # env 0's autoreset after its truncation
    _, rewards, _, truncations, _ = venv.step(np.zeros(2, np.int64))
    assert rewards.tolist() == [1.0, 1.0]  # the rebuilt env runs on the loop it was built on


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
@pytest.mark.parametrize("factory", [LoopBoundEnv, make_loop_bound_env], ids=["sync", "async"])
def test_an_env_bound_to_the_loop_in_init_runs_on_every_backend_and_front_end(
    front_end: str, backend: str, factory: Any
) -> None:
    venv = open_front_end(front_end, [factory] * 2, backend=backend, on_error="restart")
    try:
        run_and_restart_env_0(venv)
    finally:
        venv.shutdown()


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_an_async_factory_that_waits_is_awaited_inline_and_again_on_restart(
    front_end: str,
) -> None:
    built: list[LoopBoundEnv] = []

    async def make() -> LoopBoundEnv:
        built.append(await make_env_after_waiting())
        return built[-1]

    venv = open_awaiting(front_end, [make] * 2, backend="inline", on_error="restart")
    try:
        assert list(venv.envs) == built
        run_and_restart_env_0(venv)
        assert len(built) == 3  # env 0 rebuilt by awaiting its factory again
        assert venv.envs == (built[2], built[1])
        assert built[0].closed
    finally:
        venv.shutdown()


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", [b for b in ASYNC_BACKENDS if b != "inline"])
def test_an_async_factory_that_waits_is_awaited_in_workers(front_end: str, backend: str) -> None:
    venv = open_front_end(front_end, [make_env_after_waiting] * 2, backend=backend)
    try:
        venv.reset(seed=0)
        _, rewards, *_ = venv.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [1.0, 1.0]
    finally:
        venv.shutdown()


def test_the_constructor_refuses_a_factory_that_waits_inline_naming_the_env_and_create() -> None:
    first: list[LoopBoundEnv] = []

    async def make_first() -> LoopBoundEnv:
        first.append(LoopBoundEnv())
        return first[0]

    with pytest.raises(aiovec.EnvError, match=r"env_fns\[1\]") as caught:
        open_front_end("await", [make_first, make_env_after_waiting], backend="inline")
    assert caught.value.env_index == 1
    assert "await AsyncioVectorEnv.create(" in str(caught.value.errors[1])
    assert first[0].closed  # the env built before is closed


def test_the_constructor_refuses_a_factory_that_catches_the_refusal_and_waits_again() -> None:
    async def make_stubborn() -> LoopBoundEnv:
        try:
            await connect()
        except RuntimeError:
            await connect()
        return LoopBoundEnv()

    with pytest.raises(RuntimeError, match=r"an env factory waited while AsyncioVectorEnv"):
        open_front_end("await", [make_loop_bound_env, make_stubborn], backend="inline")


BAD_OPTIONS = [
    {"backend": "nope"},
    {"num_workers": 0},
    {"step_timeout": -1.0},
    {"on_error": "ignore"},
    {"copy": "yes"},
    {"max_concurrency": 0},
    {"backend_options": {"cpus": None}},
    {"autoreset_mode": "sometimes"},
    {"no_such_option": 1},
]


@pytest.mark.asyncio
@pytest.mark.parametrize("options", BAD_OPTIONS, ids=lambda options: next(iter(options)))
async def test_create_refuses_bad_input_as_the_constructor_does_before_any_factory_runs(
    options: dict[str, Any],
) -> None:
    calls: list[int] = []

    async def make() -> LoopBoundEnv:
        calls.append(1)
        return LoopBoundEnv()

    with pytest.raises((TypeError, ValueError)) as plain:
        aiovec.AsyncioVectorEnv([make] * 2, **options)
    with pytest.raises(plain.type) as created:
        await aiovec.AsyncioVectorEnv.create([make] * 2, **options)
    assert str(created.value) == str(plain.value)
    assert calls == []


@pytest.mark.asyncio
async def test_create_closes_the_envs_built_when_a_factory_fails() -> None:
    built: list[LoopBoundEnv] = []

    async def make() -> LoopBoundEnv:
        built.append(await make_env_after_waiting())
        return built[-1]

    async def make_failing() -> LoopBoundEnv:
        await connect()
        raise ConnectionRefusedError("no server")

    with pytest.raises(aiovec.EnvError, match=r"env_fns\[2\]") as caught:
        await aiovec.AsyncioVectorEnv.create([make, make, make_failing, make], backend="inline")
    assert isinstance(caught.value.errors[2], ConnectionRefusedError)
    assert len(built) == 2
    assert all(env.closed for env in built)


@pytest.mark.asyncio
async def test_create_cancelled_while_a_factory_waits_closes_the_envs_built() -> None:
    built: list[LoopBoundEnv] = []
    waiting = asyncio.Event()

    async def make() -> LoopBoundEnv:
        built.append(LoopBoundEnv())
        return built[-1]

    async def make_hanging() -> LoopBoundEnv:
        waiting.set()
        await asyncio.Event().wait()  # a server that never answers
        raise AssertionError("unreachable")

    task = asyncio.ensure_future(aiovec.AsyncioVectorEnv.create([make, make, make_hanging]))
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(built) == 2
    assert all(env.closed for env in built)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", sorted(SYNC_ONLY_BACKENDS))
def test_an_async_factory_on_a_sync_only_backend_is_refused_naming_the_fix(
    front_end: str, backend: str
) -> None:
    with pytest.raises(TypeError, match=r"env_fns\[0\]\(\) returned an awaitable.*'inline'"):
        open_front_end(front_end, [make_loop_bound_env] * 2, backend=backend)


@pytest.mark.asyncio
async def test_blocking_inside_a_running_loop_awaits_a_factory_that_waits() -> None:
    envs = aiovec.BlockingVectorEnv([make_env_after_waiting] * 2)  # on its helper thread's loop
    try:
        envs.reset(seed=0)
        _, rewards, *_ = envs.step(np.zeros(2, np.int64))
        assert rewards.tolist() == [1.0, 1.0]
    finally:
        envs.close()
