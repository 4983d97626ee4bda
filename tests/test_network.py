"""Vector envs of TCP clients against the loopback game server, end to end."""

from __future__ import annotations

import numpy as np
import pytest

import aiovec
from aiovec.gameserver import BlockingGameClientEnv, GameClientEnv, GameServer, LocalGameEnv

N = 8


@pytest.mark.asyncio
async def test_dropped_connections_are_restarted_and_no_other_transition_is_lost():
    async with GameServer(latency=0.001) as server:
        fns = [lambda: GameClientEnv(port=server.port)] * N
        async with aiovec.AsyncioVectorEnv(fns, on_error="restart", step_timeout=5) as venv:
            await venv.reset(seed=1)
            actions = np.arange(N) % 5
            for _ in range(3):
                await venv.step(actions)
            dropped = server.drop_all()
            assert dropped == N
            _, rewards, terminations, truncations, infos = await venv.step(actions)
            assert truncations.all()  # every env lost its connection: all rebuilt, reset
            assert infos["_error"].all()
            assert (rewards == 0).all()
            assert not terminations.any()
            for _ in range(3):  # reconnected: they go on
                _, _, _, truncations, infos = await venv.step(actions)
                assert "_error" not in infos
            assert server.stats.connections >= 2 * N


@pytest.mark.asyncio
async def test_a_slow_server_times_out_and_raises_naming_the_envs():
    async with GameServer(latency=0.5) as server:
        fns = [lambda: GameClientEnv(port=server.port)] * 3
        venv = aiovec.AsyncioVectorEnv(fns, step_timeout=0.05, reset_timeout=5)
        try:
            await venv.reset(seed=0)
            with pytest.raises(aiovec.EnvTimeoutError) as info:
                await venv.step(np.zeros(3, np.int64))
            assert sorted(info.value.errors) == [0, 1, 2]
            assert venv.state is aiovec._core.lifecycle.State.BROKEN
        finally:
            await venv.close()


def test_thread_backend_with_blocking_clients_matches_the_local_game():
    with GameServer(latency=0.002).start_in_thread() as server:
        fns = [lambda: BlockingGameClientEnv(port=server.port)] * N
        with (
            aiovec.BlockingVectorEnv([LocalGameEnv] * N) as oracle,
            aiovec.BlockingVectorEnv(fns, backend="thread", max_concurrency=4) as envs,
        ):
            first, want = envs.reset(seed=7)[0], oracle.reset(seed=7)[0]
            assert np.array_equal(first, want)
            rng = np.random.default_rng(0)
            for _ in range(20):
                actions = rng.integers(0, 5, N)
                got, want = envs.step(actions), oracle.step(actions)
                for g, w in zip(got[:4], want[:4], strict=True):
                    assert np.array_equal(g, w)
            stats = envs.latency_stats()
            assert (stats.count > 0).all()
            assert stats.overall_p50 >= 0.002


def test_partial_stepping_over_tcp_through_the_blocking_front_end():
    with GameServer(latency=0.001, jitter=0.004).start_in_thread() as server:
        fns = [lambda: GameClientEnv(port=server.port)] * N
        with aiovec.BlockingVectorEnv(fns) as envs:
            envs.reset(seed=3)
            envs.send(np.zeros(N, np.int64))
            received = 0
            for _ in range(30):
                *_, env_ids = envs.recv(min_envs=N // 4)
                assert len(env_ids) >= N // 4
                received += len(env_ids)
                envs.send(np.ones(len(env_ids), np.int64), env_ids)  # route by env_ids
            *_, env_ids = envs.recv()  # the last ones sent
            assert received >= 30 * (N // 4)
            assert envs.state is aiovec._core.lifecycle.State.READY
