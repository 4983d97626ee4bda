"""A game server that drops every connection, then refuses new ones for a while.

Envs 1 and 3 are TCP clients of the loopback :class:`~aiovec.gameserver.GameServer`
(``GameClientEnv`` on the inline and process backends, ``BlockingGameClientEnv``
on the thread backend); envs 0 and 2 play the same game locally.  The oracle is
``SyncVectorEnv`` of four local games: until the server fails, every row matches
it; afterwards the local envs' rows still do.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import Lockstep
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec._core.lifecycle import State
from aiovec.gameserver import BlockingGameClientEnv, GameClientEnv, GameServer, LocalGameEnv
from faults.conftest import skip_unless_available
from faults.scenarios import assert_restarted_row, assert_rows_equal

pytestmark = [
    pytest.mark.timeout(60),
    # Python >= 3.12 warns when a process with threads forks (the server runs on one);
    # the workers never touch the server's thread or its loop.
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

CLIENTS = (1, 3)
LOCAL = (0, 2)
N = 4


@pytest.fixture
def server() -> Iterator[Any]:
    with GameServer(latency=0.0).start_in_thread() as running:
        yield running


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port where nothing listens: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def client(backend: str, port: int) -> Any:
    cls = BlockingGameClientEnv if backend == "thread" else GameClientEnv
    return cls(port=port, connect_timeout=5.0)


class RefusedThenServed:
    """Builds a client of the real server, except builds 2..refusals+1: a refused port.

    Each refused build leaves a marker file, so the test can count them even
    when the factory ran in a worker process.
    """

    def __init__(self, backend: str, port: int, dead: int, refusals: int, marks: str) -> None:
        self.backend, self.port, self.dead = backend, port, dead
        self.refusals, self.marks, self.builds = refusals, marks, 0
        self.tag = uuid.uuid4().hex

    def __call__(self) -> Any:
        self.builds += 1
        if 1 < self.builds <= 1 + self.refusals:
            with open(os.path.join(self.marks, f"refused-{self.tag}-{self.builds}"), "w"):
                pass
            return client(self.backend, self.dead)
        return client(self.backend, self.port)


def vector_fns(backend: str, make_client: Any) -> list[Any]:
    return [LocalGameEnv if i in LOCAL else make_client(i) for i in range(N)]


def actions(step: int) -> np.ndarray:
    return (np.arange(N, dtype=np.int64) + step) % 5


@pytest.fixture
def oracle() -> Iterator[SyncVectorEnv]:
    env = SyncVectorEnv([LocalGameEnv] * N)
    yield env
    env.close()


def start(open_venv: Any, backend: str, oracle: SyncVectorEnv, fns: list[Any], **kw: Any) -> Any:
    skip_unless_available(backend)
    lock = Lockstep(open_venv(fns, **kw), oracle)
    lock.reset(seed=11)
    for step in range(1, 4):
        lock.step(actions(step))
    return lock


def test_dropped_then_refused_raises_naming_the_clients(open_venv, backend, server, oracle):
    fns = vector_fns(backend, lambda i: functools.partial(client, backend, server.port))
    lock = start(open_venv, backend, oracle, fns, reset_timeout=10)
    assert server.drop_all() == len(CLIENTS)
    with pytest.raises(aiovec.EnvError) as info:
        lock.venv.step(actions(4))
    lock.oracle.step(actions(4))
    assert sorted(info.value.errors) == list(CLIENTS)
    assert all(isinstance(e, ConnectionError) for e in info.value.errors.values())
    assert lock.venv.state is State.BROKEN

    server.pause_accepting(refuse=True)
    with pytest.raises(aiovec.EnvError, match=r"in reset\(\)") as info:
        lock.venv.reset(seed=12)
    assert sorted(info.value.errors) == list(CLIENTS)
    assert all(isinstance(e, ConnectionError) for e in info.value.errors.values())

    server.resume_accepting()
    lock.reset(seed=13)
    for step in range(5, 9):
        lock.step(actions(step))


def test_restart_rides_out_a_server_that_refuses_for_a_while(
    open_venv, backend, server, oracle, dead_port, tmp_path
):
    marks = str(tmp_path)
    fns = vector_fns(
        backend, lambda i: RefusedThenServed(backend, server.port, dead_port, 2, marks)
    )
    policy = aiovec.RestartPolicy(attempts=3, backoff=0.001)
    lock = start(open_venv, backend, oracle, fns, on_error=policy, reset_timeout=10)
    server.drop_all()
    got = lock.venv.step(actions(4))
    want = lock.oracle.step(actions(4))
    assert_rows_equal(got, want, LOCAL)
    for i in CLIENTS:
        assert_restarted_row(got, i, lock.venv.single_observation_space, "ConnectionResetError")
    assert len(os.listdir(marks)) == 2 * len(CLIENTS), "each client was refused twice"
    for step in range(5, 10):
        got = lock.venv.step(actions(step))
        assert_rows_equal(got, lock.oracle.step(actions(step)), LOCAL)
        assert "_error" not in got[4]
    assert lock.venv.state is State.READY


def test_a_server_that_stays_down_fails_loudly(open_venv, backend, server, oracle):
    fns = vector_fns(backend, lambda i: functools.partial(client, backend, server.port))
    policy = aiovec.RestartPolicy(attempts=2, backoff=0.001)
    lock = start(open_venv, backend, oracle, fns, on_error=policy, reset_timeout=10)
    server.pause_accepting(refuse=True)
    server.drop_all()
    with pytest.raises(aiovec.EnvError, match="restart failed after 2 attempts") as info:
        lock.venv.step(actions(4))
    lock.oracle.step(actions(4))
    assert sorted(info.value.errors) == list(CLIENTS)
    assert all(isinstance(e, ConnectionError) for e in info.value.errors.values())
    assert lock.venv.state is State.BROKEN
    server.resume_accepting()
    lock.reset(seed=14)
    for step in range(5, 8):
        lock.step(actions(step))
