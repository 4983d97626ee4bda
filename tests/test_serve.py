"""``aiovec serve`` and ``backend="remote"``: end to end, under cuts, late replies and abuse.

The scenario suites run over ``backend="remote"`` too (``conftest.py``: the
conformance, edge, property, collector and episode suites, the bad-input
checks, ...); here is what only a server has: connections cut at random
moments (every rollout stays exact), late replies, heartbeats, tokens, bad
bytes on the port, limits, and where the server runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from served import HAVE_SERVE, SERVE_SKIP

if not HAVE_SERVE:
    pytest.skip(SERVE_SKIP, allow_module_level=True)

from conftest import SPACES, assert_results_equal, oracle_env, space_env_fns
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec._serve import connection as connection_module
from aiovec._serve import protocol, wsclient
from aiovec._serve import server as server_module
from aiovec.testing import AsyncHangingEnv, AsyncTwin, Gate, HangingEnv, SpaceEnv

pytestmark = pytest.mark.usefixtures("leak_check")


def make_env(
    space: str = "box-discrete",
    min_len: int = 1,
    max_len: int = 4,
    flavour: str = "sync",
    twin_seed: int = 0,
) -> Any:
    """The server's factory: a SpaceEnv (the scenario suite's), as it is or as an async twin."""
    obs, act = SPACES[space]
    env = SpaceEnv(obs, act, min_len=min_len, max_len=max_len)
    if flavour == "async":
        return AsyncTwin(env, max_yields=4, seed=twin_seed)
    return env


def local_fns(n: int, space: str, min_len: int = 1, max_len: int = 4) -> list[Any]:
    return space_env_fns(n, space, min_len=min_len, max_len=max_len)


@pytest.fixture
def server() -> Iterator[Any]:
    with aiovec.serve(make_env) as running:
        yield running


class Cutter:
    """Aborts the server's side of a connection at random, before or after it takes a message."""

    def __init__(self, rng: random.Random, chance: float) -> None:
        self.rng, self.chance, self.cuts = rng, chance, 0
        self._handle = connection_module.Connection.handle

    def handle(self, conn: Any, message: Any) -> None:
        if not isinstance(message, protocol.StepMsg | protocol.CallMsg):  # sessions opened
            self._handle(conn, message)
            return
        before = self.rng.random() < self.chance / 2
        if before:
            self._cut(conn)
            return
        self._handle(conn, message)
        if self.rng.random() < self.chance / 2:
            self._cut(conn)

    def method(self) -> Any:
        """``handle`` as a method of the server's connections."""

        def handle(conn: Any, message: Any) -> None:
            self.handle(conn, message)

        return handle

    def _cut(self, conn: Any) -> None:
        transport = conn.transport
        if transport is not None and not transport.is_closing():
            self.cuts += 1
            transport.abort()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=[m.value for m in AutoresetMode])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_cut_at_random_moments_every_rollout_exact(
    server: Any, monkeypatch: pytest.MonkeyPatch, mode: AutoresetMode, flavour: str
) -> None:
    """Connections cut on the server side before and after it takes requests, and on the
    client side mid-step: every result is the local one (no step lost, none run twice)."""
    rng = random.Random(f"{mode}-{flavour}")
    cutter = Cutter(rng, 0.15)
    monkeypatch.setattr(connection_module.Connection, "handle", cutter.method())
    n, space = 4, "dict-tuple"

    async def run() -> int:
        cuts = 0
        async with aiovec.make(
            server.url, n, blocking=False, autoreset_mode=mode, space=space, flavour=flavour
        ) as venv:
            backend = venv._backend
            with oracle_env(local_fns(n, space), autoreset_mode=mode) as oracle:
                actions = oracle.action_space
                actions.seed(5)
                assert_results_equal(
                    await venv.reset(seed=9), oracle.reset(seed=9), ("obs", "infos")
                )
                for step in range(120):
                    batch = actions.sample()
                    stepping = asyncio.ensure_future(venv.step(batch))
                    if rng.random() < 0.2:  # a cut on the client's side, mid-step
                        for _ in range(rng.randrange(3)):
                            await asyncio.sleep(0)
                        backend.drop_connection()
                        cuts += 1
                    got = await stepping
                    want = oracle.step(batch)
                    assert_results_equal(got, want)
                    if mode is AutoresetMode.DISABLED and (want[2] | want[3]).any():
                        mask = want[2] | want[3]
                        assert_results_equal(
                            await venv.reset(seed=step, options={"reset_mask": mask}),
                            oracle.reset(seed=step, options={"reset_mask": mask}),
                            ("obs", "infos"),
                        )
                assert backend.reconnects >= cuts
        return cuts

    client_cuts = asyncio.run(run())
    assert client_cuts + cutter.cuts >= 20, "the run must include many cuts"


@pytest.mark.timeout(60)
def test_blocking_front_end_resumes_exactly(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    cutter = Cutter(rng, 0.2)
    monkeypatch.setattr(connection_module.Connection, "handle", cutter.method())
    n, space = 3, "image-box"
    with (
        aiovec.make(server.url, n, space=space, autoreset_mode="SameStep") as venv,
        oracle_env(local_fns(n, space), autoreset_mode=AutoresetMode.SAME_STEP) as oracle,
    ):
        assert isinstance(venv, aiovec.BlockingVectorEnv)
        assert_results_equal(venv.reset(seed=1), oracle.reset(seed=1), ("obs", "infos"))
        oracle.action_space.seed(2)
        for _ in range(100):
            batch = oracle.action_space.sample()
            assert_results_equal(venv.step(batch), oracle.step(batch))
    assert cutter.cuts >= 10


def test_256_sessions_share_one_connection(server: Any) -> None:
    with aiovec.make(server.url, 256, space="box-discrete") as venv:
        venv.reset(seed=0)
        venv.step(venv.action_space.sample())
        connections = list(server.server.connections)
        assert len(connections) == 1
        (group,) = connections[0].groups.values()
        assert group.count == 256


def _hanging_env(gate: Gate) -> Any:
    obs, act = SPACES["box-discrete"]
    return AsyncHangingEnv(SpaceEnv(obs, act, min_len=50, max_len=50), gate, at=2)


@pytest.mark.timeout(60)
def test_a_late_reply_never_reaches_a_later_step(tmp_path: Any) -> None:
    gate = Gate(tmp_path)
    with (
        aiovec.serve(functools.partial(_hanging_env, gate)) as served_,
        # (the reset after the timeout waits for the hung steps to end on the server: on a
        # busy machine that can take longer than the steps' 0.3 s)
        aiovec.make(served_.url, 2, step_timeout=0.3, reset_timeout=30.0) as venv,
    ):
        if True:
            oracle_fns = local_fns(2, "box-discrete", 50, 50)
            with oracle_env(oracle_fns) as oracle:
                venv.reset(seed=4)
                oracle.reset(seed=4)
                actions = np.array([1, 2])
                assert_results_equal(venv.step(actions), oracle.step(actions))
                with pytest.raises(aiovec.EnvTimeoutError):
                    venv.step(actions)  # both hang at their second step
                gate.release()  # the late answer comes now, and must be dropped
                assert_results_equal(venv.reset(seed=7), oracle.reset(seed=7), ("obs", "infos"))
                for _ in range(5):
                    assert_results_equal(venv.step(actions), oracle.step(actions))


def test_a_wrong_token_is_refused_and_the_right_one_taken() -> None:
    with aiovec.serve(make_env, token="s3cret") as served_:
        with pytest.raises(PermissionError, match="wrong token"):
            aiovec.make(served_.url, 1, token="guess")
        with pytest.raises(PermissionError, match="needs a token"):
            aiovec.make(served_.url, 1)
        with aiovec.make(served_.url, 1, token="s3cret") as venv:
            venv.reset(seed=0)


def test_a_public_address_without_a_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(server_module.TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match="without a token"):
        aiovec.serve(make_env, host="0.0.0.0")
    monkeypatch.setenv(server_module.TOKEN_ENV, "from-the-environment")
    assert aiovec.serve(make_env, host="0.0.0.0").server.token == "from-the-environment"


def _raw_ws(url: str) -> socket.socket:
    sock, _ = wsclient.connect_blocking(url, None, 5.0)
    sock.setblocking(True)
    sock.settimeout(5.0)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server ends the connection (True) or 5 s pass (False)."""
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


@pytest.mark.parametrize(
    "payload",
    [b"\xc1\xc1 not msgpack", b"\x91\x92\xa5hello", b"\x91\xa4open"],
    ids=["garbage", "a wrong message", "not a message"],
)
def test_garbage_closes_that_connection_only(server: Any, payload: bytes) -> None:
    with aiovec.make(server.url, 2, space="box-discrete") as venv:
        venv.reset(seed=0)
        raw = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        with raw:
            raw.sendall(b"\x00\xff garbage, not HTTP\r\n\r\n")
            assert _closed_by_server(raw)
        with _raw_ws(server.url) as sock:
            sock.sendall(wsclient.mask_frame(payload))
            assert _closed_by_server(sock)
        venv.step(venv.action_space.sample())  # the other client is still served


def test_an_oversized_frame_closes_that_connection_only() -> None:
    with (
        aiovec.serve(make_env, max_frame=4096) as served_,
        aiovec.make(served_.url, 1, space="box-discrete") as venv,
    ):
        if True:
            venv.reset(seed=0)
            with _raw_ws(served_.url) as sock:  # a well-formed hello, only too big
                hello = protocol.encode([protocol.HelloMsg(1, [(1, "t" * 10000)])])
                sock.sendall(wsclient.mask_frame(hello))
                assert _closed_by_server(sock)
            venv.step(venv.action_space.sample())


def test_sessions_per_connection_are_limited() -> None:
    with aiovec.serve(make_env, max_sessions=4) as served_:
        with pytest.raises(ValueError, match="limit of 4 per connection"):
            aiovec.make(served_.url, 5)
        with aiovec.make(served_.url, 4) as venv:
            venv.reset(seed=0)


def test_a_busy_server_asks_again_and_nothing_is_lost() -> None:
    with aiovec.serve(make_env, window=1) as served_:
        n = 4
        with (
            aiovec.make(served_.url, n, flavour="async", space="box-discrete") as venv,
            oracle_env(local_fns(n, "box-discrete")) as oracle,
        ):
            venv.reset(seed=0)
            oracle.reset(seed=0)
            for _ in range(5):  # one send per env: four requests at once, a window of one
                actions = np.array([1, 0, 2, 1])
                for i in range(n):
                    venv.send(actions[i : i + 1], [i])
                got = venv.recv(min_envs=n)
                order = np.argsort(got[5])
                want = oracle.step(actions)
                np.testing.assert_array_equal(got[0][order], want[0])
                np.testing.assert_array_equal(got[1][order], want[1])


@pytest.mark.timeout(60)
def test_sessions_not_resumed_in_time_fail_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError("the network is down (test)")

    with aiovec.serve(make_env, resume_window=0.3) as served_:
        with aiovec.make(served_.url, 2, space="box-discrete") as venv:
            venv.reset(seed=0)
            monkeypatch.setattr(wsclient, "connect_async", unreachable)
            venv.vector_env._backend.drop_connection()
            with pytest.raises(aiovec.EnvError) as info:
                venv.step(venv.action_space.sample())
            cause = info.value.errors[0]
            assert isinstance(cause, ConnectionError)
            assert "could not resume within 0.3 s" in str(cause)
            with pytest.raises(aiovec.EnvError, match="could not resume"):
                venv.reset(seed=1)  # the sessions are lost for good
        deadline = time.monotonic() + 5
        while served_.server.groups and time.monotonic() < deadline:
            time.sleep(0.01)  # the server's own window ends on its own thread
        assert not served_.server.groups


def test_the_server_refuses_a_bad_factory_keyword(server: Any) -> None:
    with pytest.raises(aiovec.EnvError) as info:
        aiovec.make(server.url, 2, colour="blue")
    assert "colour" in str(info.value.errors[0])


def test_factory_keywords_must_be_plain_data(server: Any) -> None:
    with pytest.raises(TypeError, match="cannot be sent"):
        aiovec.make(server.url, 2, space=object())


def test_the_serve_command_prints_its_url_and_serves() -> None:
    command = [sys.executable, "-m", "aiovec", "serve", "aiovec.testing:TrivialEnv", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            url = line.split()[-1]
            assert url.startswith("ws://127.0.0.1:"), line
            with aiovec.make(url, 3) as venv:
                obs, _ = venv.reset(seed=0)
                assert obs.shape == (3, 4)
        finally:
            process.terminate()
            process.wait(10)


def test_the_serve_command_refuses_a_public_address_without_a_token() -> None:
    command = [sys.executable, "-m", "aiovec", "serve", "aiovec.testing:TrivialEnv"]
    done = subprocess.run(
        [*command, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in __import__("os").environ.items() if k != "AIOVEC_SERVE_TOKEN"},
        check=False,
    )
    assert done.returncode == 2
    assert "without a token" in done.stderr


@pytest.mark.asyncio
async def test_a_server_on_the_callers_loop_serves_the_await_api_built_there() -> None:
    """``async with aiovec.serve(...)`` runs on this loop; ``server.connect`` steps on it too."""
    n, space = 3, "dict-tuple"
    async with aiovec.serve(make_env) as server:
        assert server.url.startswith("ws://127.0.0.1:")
        for blocking in (True, False):  # a constructor here would wait on this very loop
            with pytest.raises(RuntimeError, match="runs on this event loop"):
                aiovec.make(server.url, n, blocking=blocking, space=space)
        async with await server.connect(n, space=space) as venv:
            assert isinstance(venv, aiovec.AsyncioVectorEnv)
            with oracle_env(local_fns(n, space)) as oracle:
                oracle.action_space.seed(1)
                want = oracle.reset(seed=2)
                assert_results_equal(await venv.reset(seed=2), want, ("obs", "infos"))
                for _ in range(20):
                    batch = oracle.action_space.sample()
                    assert_results_equal(await venv.step(batch), oracle.step(batch))
        assert len(server.server.groups) == 0  # closed with the vector env


@pytest.mark.timeout(30)
def test_a_client_idle_between_calls_keeps_its_connection_and_sessions() -> None:
    """A blocking script runs no loop between calls, so it sends nothing: the server must
    not take that silence for a dead client (it once closed the connection after three
    heartbeats, and the sessions after the resume window)."""
    with (
        aiovec.serve(make_env, heartbeat=0.05, resume_window=0.2) as served_,
        aiovec.make(served_.url, 2, space="box-discrete") as venv,
    ):
        venv.reset(seed=0)
        time.sleep(1.0)  # the scenario itself: idle for 20 heartbeats and 5 resume windows
        venv.step(venv.action_space.sample())
        assert venv.vector_env._backend.reconnects == 0
        assert len(served_.server.connections) == 1


def _slow_or_not(gate: Gate, hang: bool) -> Any:
    obs, act = SPACES["box-discrete"]
    env = SpaceEnv(obs, act, min_len=50, max_len=50)
    return AsyncHangingEnv(env, gate, at=2) if hang else AsyncTwin(env, max_yields=2, seed=0)


@pytest.mark.timeout(60)
def test_under_a_timeout_only_the_late_env_times_out(tmp_path: Any) -> None:
    """A step under ``step_timeout`` is answered as envs finish: the fast env's result is not
    held back behind the slow one until both look late."""
    gate = Gate(tmp_path)
    from aiovec.backends.remote import Remote

    with aiovec.serve(functools.partial(_slow_or_not, gate)) as served_:
        fns = [Remote(served_.url, {"hang": False}), Remote(served_.url, {"hang": True})]
        with aiovec.BlockingVectorEnv(fns, backend="remote", step_timeout=0.5) as venv:
            venv.reset(seed=0)
            venv.step(np.array([1, 1]))
            with pytest.raises(aiovec.EnvTimeoutError) as info:
                venv.step(np.array([1, 1]))  # env 1 hangs at its second step
            assert set(info.value.errors) == {1}
            gate.release()


class _Said(logging.Handler):
    """Sets ``event`` when the aiovec logger says ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def _stalling_env(gate: Gate) -> Any:
    """An env whose second step holds the server's loop (a sync env on inline) until ``gate``."""
    obs, act = SPACES["box-discrete"]
    return HangingEnv(SpaceEnv(obs, act, min_len=50, max_len=50), gate, at=2)


@pytest.mark.timeout(60)
def test_a_server_that_stops_answering_is_dropped_and_resumed(tmp_path: Any) -> None:
    """While a step waits, the client pings every heartbeat; after three silent ones it drops
    the connection and resumes it once the server answers again, the step exact."""
    gate = Gate(tmp_path)
    said = _Said("no answer to heartbeats")
    logging.getLogger("aiovec").addHandler(said)

    async def run() -> None:
        with aiovec.serve(functools.partial(_stalling_env, gate), heartbeat=0.1) as served_:
            async with aiovec.make(served_.url, 1, blocking=False) as venv:
                with oracle_env(local_fns(1, "box-discrete", 50, 50)) as oracle:
                    assert_results_equal(
                        await venv.reset(seed=3), oracle.reset(seed=3), ("obs", "infos")
                    )
                    actions = np.array([1])
                    assert_results_equal(await venv.step(actions), oracle.step(actions))
                    stepping = asyncio.ensure_future(venv.step(actions))  # holds the server
                    await asyncio.get_running_loop().run_in_executor(None, said.event.wait, 30)
                    gate.release()  # the server answers again: the step resumes
                    assert_results_equal(await stepping, oracle.step(actions))
                    assert venv._backend.reconnects >= 1

    try:
        asyncio.run(run())
    finally:
        logging.getLogger("aiovec").removeHandler(said)
