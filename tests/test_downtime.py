"""RestartPolicy(max_downtime=...): a server that goes away for a while and comes back.

The server is a real loopback TCP server (127.0.0.1) that is taken down (its
listener closed, its connections dropped) and brought back by the test: no
sleep synchronises anything.  It counts the steps it answered for each env, and
each answer is that count, so a lost or repeated step shows in the
observations.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import socket
import threading
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest

import aiovec

SPACE = gymnasium.spaces.Discrete(1_000_000)


class CountingServer:
    """Answers ``step <env>`` with how many steps it has answered for ``<env>``.

    ``count <env>`` answers the count without stepping.  ``down()`` closes the
    listener (connecting is refused) and drops every connection; ``up()``
    listens again on the same port.
    """

    def __init__(self) -> None:
        self.port = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.up()

    def up(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port))
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._start(self._accept, listener)

    def down(self) -> None:
        listener, self._listener = self._listener, None
        assert listener is not None
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        listener.close()
        with self._lock:
            for conn in self._conns:
                conn.shutdown(socket.SHUT_RDWR)
        self._join()

    def close(self) -> None:
        if self._listener is not None:
            self.down()

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _join(self) -> None:
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(10)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # taken down
            with self._lock:
                self._conns.add(conn)
            self._start(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn.makefile("rwb") as stream:
                for line in stream:
                    command, env = line.decode().split()
                    with self._lock:
                        if command == "step":
                            self.counts[env] += 1
                        count = self.counts[env]
                    stream.write(b"%d\n" % count)
                    stream.flush()
        finally:
            # Forgotten before it is closed: down() shuts down only open sockets.
            with self._lock:
                self._conns.discard(conn)
            conn.close()


class CountingClient(aiovec.AsyncEnv[int, int]):
    """An env whose observation is the server's count of the steps it answered for it."""

    observation_space = SPACE
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, port: int, name: str) -> None:
        self.port, self.name = port, name
        self.writer: asyncio.StreamWriter | None = None

    async def _ask(self, command: str) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(f"{command} {self.name}\n".encode())
        line = await self.reader.readline()
        if not line:
            raise ConnectionResetError("the server closed the connection")
        return int(line)

    async def reset(self, *, seed=None, options=None):
        return await self._ask("count"), {}

    async def step(self, action):
        return await self._ask("step"), 0.0, False, False, {}

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()


@pytest.fixture
def server():
    server = CountingServer()
    yield server
    server.close()


def factories(
    server: CountingServer, n: int, come_back_at: int | None
) -> tuple[list[Any], list[int]]:
    """Env factories; the server comes back when env 0 is built for the ``come_back_at``-th time."""
    built = [0] * n

    def make(i: int) -> Callable[[], CountingClient]:
        def build() -> CountingClient:
            built[i] += 1
            if i == 0 and built[i] == come_back_at:
                server.up()
            return CountingClient(server.port, f"env{i}")

        return build

    return [make(i) for i in range(n)], built


def check_rows(history: list[np.ndarray], truncations: list[np.ndarray], counts, n: int) -> None:
    """Every step row is the server's next count; restart and autoreset rows repeat the last."""
    for i in range(n):
        last, steps, after_truncation = history[0][i], 0, False
        for obs, trunc in zip(history[1:], truncations, strict=True):
            if after_truncation or trunc[i]:  # a restart row or the autoreset after it
                assert obs[i] == last, f"env {i}: a reset changed the count"
            else:
                assert obs[i] == last + 1, f"env {i}: a step was lost or repeated"
                steps += 1
            last, after_truncation = obs[i], bool(trunc[i])
        assert counts[f"env{i}"] == last == steps


@pytest.mark.asyncio
async def test_a_server_away_for_two_seconds_is_waited_for(server, caplog):
    n = 3
    fns, built = factories(server, n, come_back_at=6)  # 5 failed tries: 0.2+0.4+0.8+0.8 s
    policy = aiovec.RestartPolicy(max_downtime=10.0, backoff=0.2, max_backoff=0.8)
    caplog.set_level(logging.DEBUG, logger="aiovec")
    async with aiovec.AsyncioVectorEnv(fns, on_error=policy, reset_timeout=5.0) as venv:
        obs, _ = await venv.reset()
        history, truncations = [obs], []
        actions = np.zeros(n, np.int64)
        for t in range(8):
            if t == 3:
                server.down()
                assert not caplog.records  # nothing is logged for steps that went well
            obs, _, _, trunc, infos = await venv.step(actions)
            history.append(obs)
            truncations.append(trunc)
            if t == 3:
                assert trunc.all()
                assert "ConnectionResetError" in infos["error"][0]
    assert built == [6, 6, 6]  # more tries than the default policy's 3
    check_rows(history, truncations, server.counts, n)
    messages = [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.WARNING and r.name == "aiovec" for r in caplog.records)
    # the outage is said twice (issue 35): as it starts, and at the first step every env
    # answers, with counts: 3 envs, tried 5 times each; no line per try within SAY_EVERY
    assert len(messages) == 2, messages
    assert re.fullmatch(
        r"envs 0, 1, 2 failed in step\(\): ConnectionResetError.*; restarting \(an outage.*\)",
        messages[0],
    )
    assert re.fullmatch(
        r"envs 0, 1, 2 back after [0-9.]+ s "
        r"\(15 restarts; 3 failures: ConnectionResetError x3\)",
        messages[1],
    )


def test_a_server_that_stays_away_is_given_up_after_max_downtime(server, caplog):
    fns, built = factories(server, 2, come_back_at=None)
    policy = aiovec.RestartPolicy(max_downtime=0.3, backoff=0.1, max_backoff=0.1)
    with aiovec.BlockingVectorEnv(fns, on_error=policy) as envs:
        envs.reset()
        server.down()
        caplog.set_level(logging.WARNING, logger="aiovec")
        with pytest.raises(aiovec.EnvError, match="restart failed after 4 attempts") as info:
            envs.step(np.zeros(2, np.int64))
    assert set(info.value.errors) == {0, 1}
    assert isinstance(info.value.errors[0], ConnectionRefusedError)
    # Tries start at 0, 0.1, 0.2 and 0.3 s (the last wait cut to end there); no more.
    assert built == [5, 5]
    assert "giving up after 4 restart attempt(s)" in caplog.records[-1].getMessage()
    assert caplog.records[-1].getMessage().startswith("envs 0, 1: giving up")


@pytest.mark.parametrize(
    ("indices", "said"),
    [
        ([3], "env 3"),
        ([0, 1, 2, 7, 9], "envs 0, 1, 2, 7, 9"),
        (list(range(256)), "envs 0-255"),
        ([*range(10), 20], "11 envs"),
    ],
)
def test_log_lines_name_a_handful_of_envs_and_count_more(indices, said):
    from aiovec._log import say_envs as _envs

    assert _envs(indices) == said
