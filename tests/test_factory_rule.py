"""The factory rule: env factories run on the event loop that runs the envs; async ones are awaited.

`LoopBoundEnv` stands in for an env that opens a client session (aiohttp's
``ClientSession``) in ``__init__``: it needs ``asyncio.get_running_loop()`` there,
and keeps a future of that loop that each call awaits, which fails unless the
call runs on the very loop the env was built on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from conftest import BACKENDS, FRONT_ENDS, SYNC_ONLY_BACKENDS, open_front_end
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


async def make_env_after_waiting() -> LoopBoundEnv:
    """An ``async def`` factory that waits on the loop (as a connect would)."""
    await asyncio.sleep(0)
    return LoopBoundEnv()


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", ASYNC_BACKENDS)
@pytest.mark.parametrize("factory", [LoopBoundEnv, make_loop_bound_env], ids=["sync", "async"])
def test_an_env_bound_to_the_loop_in_init_runs_on_every_backend_and_front_end(
    front_end: str, backend: str, factory: Any
) -> None:
    venv = open_front_end(front_end, [factory] * 2, backend=backend, on_error="restart")
    try:
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


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_an_async_factory_that_waits_fails_inline_naming_the_env_and_the_fix(
    front_end: str,
) -> None:
    fns = [make_loop_bound_env, make_env_after_waiting]
    with pytest.raises(aiovec.EnvError, match=r"env_fns\[1\]") as caught:
        open_front_end(front_end, fns, backend="inline")
    assert caught.value.env_index == 1
    assert "backend='process'" in str(caught.value.errors[1])


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", sorted(SYNC_ONLY_BACKENDS))
def test_an_async_factory_on_a_sync_only_backend_is_refused_naming_the_fix(
    front_end: str, backend: str
) -> None:
    with pytest.raises(TypeError, match=r"env_fns\[0\]\(\) returned an awaitable.*'inline'"):
        open_front_end(front_end, [make_loop_bound_env] * 2, backend=backend)
