"""The loopback game server and its client envs (aiovec.gameserver)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import pickle
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from conftest import assert_same
from gymnasium.error import ResetNeeded
from gymnasium.vector import SyncVectorEnv

import aiovec
from aiovec.gameserver import (
    PROTOCOL_VERSION,
    BlockingGameClientEnv,
    ChaseGame,
    GameClientEnv,
    GameServer,
    LocalGameEnv,
    ProtocolError,
    game_spaces,
)
from aiovec.gameserver.protocol import Framer

GAME = {"size": 4, "max_steps": 10}  # small: episodes end often, both ways


# --------------------------------------------------------------------------- helpers


@pytest_asyncio.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Errors the event loop reported to its exception handler; none allowed."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    await asyncio.sleep(0)  # let pending callbacks (transport closes) run
    loop.set_exception_handler(None)
    assert errors == []


def other_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def message(**fields: Any) -> bytes:
    return frame(json.dumps(fields).encode())


def step_request(action: int) -> bytes:
    """A binary step request, as the clients send it."""
    return frame(b"S" + bytes([action]))


STEP_REPLY = struct.Struct(">c4fdBBII")  # tag, obs x 4, reward, terminated, truncated, info


def step_reply(*, obs: Any = (0.0, 0.5, 1.0, 0.25), flags: Any = (0, 0), **fields: Any) -> bytes:
    """A binary step reply frame; ``fields`` may override reward, steps and distance."""
    values = {"reward": -0.01, "steps": 1, "distance": 2, **fields}
    info = values["steps"], values["distance"]
    return frame(STEP_REPLY.pack(b"s", *obs, values["reward"], *flags, *info))


HELLO = message(type="hello", version=PROTOCOL_VERSION)


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    return await reader.readexactly(length)


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next frame: a JSON message, or a binary step reply as ``type``/``steps``."""
    payload = await read_frame(reader)
    if payload[:1] == b"s":
        return {"type": "step", "steps": STEP_REPLY.unpack(payload)[8]}
    return json.loads(payload)


def actions_for(seed: int, n: int, num_envs: int | None = None) -> np.ndarray:
    shape = (n,) if num_envs is None else (n, num_envs)
    return np.random.default_rng(seed).integers(0, 5, size=shape)


def play_local(seed: int, actions: np.ndarray) -> list[Any]:
    env, transcript = LocalGameEnv(**GAME), []
    transcript.append(env.reset(seed=seed))
    for action in actions:
        result = env.step(action)
        transcript.append(result)
        if result[2] or result[3]:
            transcript.append(env.reset())
    return transcript


async def play_remote(env: GameClientEnv, seed: int, actions: np.ndarray) -> list[Any]:
    transcript = [await env.reset(seed=seed)]
    for action in actions:
        result = await env.step(action)
        transcript.append(result)
        if result[2] or result[3]:
            transcript.append(await env.reset())
    return transcript


async def timed(call: Awaitable[Any]) -> float:
    start = time.monotonic()
    await call
    return time.monotonic() - start


# --------------------------------------------------------------------------- the game


def test_game_is_deterministic_and_ends_both_ways():
    actions = actions_for(0, 300)
    first, second = play_local(7, actions), play_local(7, actions)
    assert_same(second, first)
    steps = [t for t in first if len(t) == 5]
    assert any(t[2] for t in steps)
    assert any(t[3] for t in steps)
    assert {t[1] for t in steps} == {1.0, -0.01}
    assert all(game_spaces()[0].contains(t[0]) for t in first)


def test_game_checks_its_arguments():
    with pytest.raises(ValueError, match="size >= 2"):
        ChaseGame(size=1)
    with pytest.raises(ResetNeeded):
        ChaseGame().step(0)
    env = LocalGameEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must be in \[0, 5\), got 5"):
        env.step(5)
    with pytest.raises(TypeError):
        env.step(1.5)


def test_protocol_error_is_a_picklable_connection_error():
    error = pickle.loads(pickle.dumps(ProtocolError("oversized frame")))
    assert isinstance(error, ConnectionError)
    assert str(error) == "oversized frame"


def test_clients_accept_loopback_addresses_only():
    with pytest.raises(ValueError, match="loopback"):
        GameClientEnv("10.0.0.1", 80)
    with pytest.raises(ValueError, match="loopback"):
        BlockingGameClientEnv("example.com", 80)
    with pytest.raises(TypeError, match=r"port=server.port"):
        GameClientEnv()
    assert GameClientEnv("::1", 9).host == "::1"


def test_frames_are_cut_whatever_the_pieces_they_arrive_in():
    stream = frame(b"abc") + frame(b"") + frame(b"x" * 300)
    for piece in (1, 2, 3, 5, 7, 64, len(stream)):
        frames, payloads = Framer(max_bytes=300), []
        for start in range(0, len(stream), piece):
            payloads += frames.feed(stream[start : start + piece])
        assert payloads == [b"abc", b"", b"x" * 300], piece
        assert frames.pending == 0


def test_frames_refuse_an_oversized_header_before_its_body():
    frames = Framer(max_bytes=10)
    assert frames.feed(frame(b"0123456789")[:-1]) == []  # 10 bytes: allowed, not complete
    assert (frames.pending, frames.needed) == (13, 14)
    assert frames.feed(b"9" + struct.pack(">I", 11)[:2]) == [b"0123456789"]
    with pytest.raises(ProtocolError, match="oversized frame: 11 bytes announced"):
        frames.feed(struct.pack(">I", 11)[2:])  # the header's last byte: no body needed


@pytest.mark.asyncio
async def test_server_reads_requests_that_arrive_a_byte_at_a_time(loop_errors):
    async with GameServer(**GAME) as server:
        reader, writer = await asyncio.open_connection(*server.address)
        for byte in HELLO + RESET + step_request(4):
            writer.write(bytes([byte]))
            await writer.drain()
        kinds = [(await read_message(reader))["type"] for _ in range(3)]
        assert kinds == ["hello", "reset", "step"]
        writer.close()
        await writer.wait_closed()


def nodelay(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.asyncio
async def test_both_sides_send_small_frames_at_once(loop_errors):
    # TCP_NODELAY: a frame is not held back waiting for the peer's ACK (Nagle).
    async with GameServer() as server:
        env = GameClientEnv(port=server.port)
        blocking = BlockingGameClientEnv(port=server.port)
        await env.reset(seed=0)
        await asyncio.to_thread(blocking.reset, seed=0)
        assert nodelay(env._connection.transport.get_extra_info("socket"))
        assert nodelay(blocking._sock)
        sides = [c.transport.get_extra_info("socket") for c in server._connections]
        assert len(sides) == 2
        assert all(nodelay(s) for s in sides)
        await env.close()
        blocking.close()


# --------------------------------------------------------------------------- same results


@pytest.mark.asyncio
async def test_remote_env_matches_local_env(loop_errors):
    actions = actions_for(1, 60)
    async with GameServer(**GAME) as server:
        env = GameClientEnv(port=server.port)
        try:
            for seed in (0, 1, 2**40):
                remote, local = await play_remote(env, seed, actions), play_local(seed, actions)
                assert_same(remote, local)
                for got, want in zip(remote, local, strict=True):  # float32 obs, bit for bit
                    assert got[0].tobytes() == want[0].tobytes()
        finally:
            await env.close()
        assert server.stats.connections == 1  # one connection for all episodes
        assert server.stats.steps == 3 * 60
    assert env.game == {**GAME, "spaces": env.game["spaces"]}


@pytest.mark.asyncio
async def test_vector_of_remote_envs_matches_sync_vector_env(loop_errors):
    num_envs, actions = 16, actions_for(2, 40, 16)
    oracle = SyncVectorEnv([lambda: LocalGameEnv(**GAME)] * num_envs)
    async with GameServer(**GAME, latency=0.001, jitter=0.002) as server:
        fns = [lambda: GameClientEnv(port=server.port)] * num_envs
        async with aiovec.AsyncioVectorEnv(fns) as venv:
            assert_same(await venv.reset(seed=5), oracle.reset(seed=5))
            ended = np.zeros(2, dtype=int)
            for batch in actions:
                expected = oracle.step(batch)
                assert_same(await venv.step(batch), expected)
                ended += [expected[2].sum(), expected[3].sum()]
        assert server.stats.connections == num_envs
    oracle.close()
    assert ended.min() > 0, "the scenario should end episodes by both flags"


def test_blocking_client_matches_local_env():
    num_envs, actions = 4, actions_for(3, 40, 4)
    with GameServer(**GAME, latency=0.001).start_in_thread() as server:
        remote = SyncVectorEnv([lambda: BlockingGameClientEnv(port=server.port)] * num_envs)
        oracle = SyncVectorEnv([lambda: LocalGameEnv(**GAME)] * num_envs)
        assert_same(remote.reset(seed=9), oracle.reset(seed=9))
        for batch in actions:
            assert_same(remote.step(batch), oracle.step(batch))
        remote.close()
        oracle.close()
        stats = server.server.stats
        assert stats.steps + stats.resets == (40 + 1) * num_envs  # NEXT_STEP: resets in steps


# --------------------------------------------------------------------------- bad frames


RESET = message(type="reset", seed=0, options=None)
BAD_REQUESTS = {
    "not-json": (frame(b"{oops"), "malformed frame: not valid UTF-8 JSON"),
    "not-utf8": (frame(b"\xff\xfe\xfd"), "malformed frame: not valid UTF-8 JSON"),
    "nan": (frame(b'{"type": "reset", "seed": NaN, "options": null}'), "NaN is not allowed"),
    "deep": (frame(b"[" * 50_000), "malformed frame"),
    "empty": (frame(b""), "malformed frame"),
    "not-object": (message(type=None), "expected a JSON object with a string 'type'"),
    "unknown-type": (message(type="jump"), "unknown message type 'jump'"),
    "json-step": (message(type="step", action=1), "unknown message type 'step'"),
    "missing-field": (message(type="reset", seed=0), r"wrong fields in 'reset' message"),
    "extra-field": (
        message(type="reset", seed=0, options=None, x=2),
        r"wrong fields in 'reset' message",
    ),
    "wrong-type": (
        message(type="reset", seed="1", options=None),
        "'seed' must be int or NoneType, got '1'",
    ),
    "bool-seed": (
        message(type="reset", seed=True, options=None),
        "'seed' must be int or NoneType, got True",
    ),
    "bad-seed": (message(type="reset", seed=-1, options=None), "non-negative"),
    "bad-action": (RESET + step_request(7), r"action must be in \[0, 5\), got 7"),
    "short-step": (RESET + frame(b"S"), "malformed 'step' frame: expected 2 bytes, got 1"),
    "long-step": (RESET + frame(b"S\x01\x00"), "malformed 'step' frame: expected 2 bytes, got 3"),
    "no-reset": (step_request(1), "'step' before the first 'reset'"),
    "hello-twice": (HELLO, "'hello' must come first and once"),
    "oversized": (struct.pack(">I", 100_001), "100001 bytes announced, max_message_bytes is"),
}


async def error_reply(reader: asyncio.StreamReader) -> str:
    """The message of the first ``error`` reply (other replies skipped)."""
    while (reply := await read_message(reader))["type"] != "error":
        pass
    return str(reply["message"])


@pytest.mark.asyncio
@pytest.mark.parametrize("case", BAD_REQUESTS)
async def test_server_answers_bad_frames_with_error_and_hangs_up(case, loop_errors):
    data, expected = BAD_REQUESTS[case]
    async with GameServer(max_message_bytes=100_000) as server:
        good = GameClientEnv(port=server.port)
        await good.reset(seed=0)
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(HELLO + data)  # an oversized header comes
        assert re.search(expected, await error_reply(reader))  # without body: not waited for
        assert await reader.read() == b""  # then the server hangs up
        writer.close()
        await writer.wait_closed()
        await good.step(1)  # the other session never noticed
        assert server.stats.errors == 1
        await good.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (RESET, "'hello' must come first"),
        (step_request(0), "'hello' must come first and once, got 'step'"),
        (message(type="hello", version=99), "unsupported protocol version 99"),
    ],
)
async def test_server_needs_hello_first_and_the_same_version(first, expected, loop_errors):
    async with GameServer() as server:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(first)
        assert expected in await error_reply(reader)
        writer.close()
        await writer.wait_closed()


# Client side: a tiny fake server that sends a scripted answer.

GOOD_HELLO = message(
    type="hello",
    version=PROTOCOL_VERSION,
    game={
        "size": 8,
        "max_steps": 200,
        "spaces": {
            "observation": {"low": 0.0, "high": 1.0, "shape": [4], "dtype": "float32"},
            "action": {"n": 5},
        },
    },
)
WRONG_VERSION = GOOD_HELLO.replace(b'"version": 2', b'"version": 3')
WRONG_SPACES = GOOD_HELLO.replace(b'"n": 5', b'"n": 6')

# name -> (answer to the hello, answer to the reset or None, expected error)
BAD_REPLIES = {
    "not-json": (frame(b"\x00garbage"), None, "malformed frame: not valid UTF-8 JSON"),
    "oversized": (struct.pack(">I", 2**31), None, "2147483648 bytes announced, max_message"),
    "unknown-type": (message(type="bye"), None, "unknown message type 'bye'"),
    "wrong-fields": (message(type="hello"), None, "wrong fields in 'hello' message"),
    "wrong-reply": (
        message(type="reset", obs=[0] * 4, info={}),
        None,
        "expected a 'hello' reply, got 'reset'",
    ),
    "error": (message(type="error", message="go away"), None, "replied with an error: go away"),
    "version": (WRONG_VERSION, None, "server speaks protocol version 3"),
    "spaces": (WRONG_SPACES, None, "spaces .* differ"),
    "bad-obs": (GOOD_HELLO, message(type="reset", obs=[0, 1], info={}), "expected 4 numbers"),
    "nan-obs": (GOOD_HELLO, frame(b'{"type":"reset","obs":[NaN],"info":{}}'), "NaN"),
    "step-for-reset": (GOOD_HELLO, step_reply(), "expected a 'reset' reply, got 'step'"),
    "extra-frame": (GOOD_HELLO + GOOD_HELLO, None, "sent data with no request in flight"),
    "extra-bytes": (GOOD_HELLO + b"\x00", None, "sent data with no request in flight"),
}


@contextlib.asynccontextmanager
async def fake_server(*answers: bytes | None, hang_up: bool = False) -> AsyncIterator[int]:
    """Read a request and send each answer in turn; then hang up or wait for the client to."""
    handlers: list[asyncio.Task[Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        for answer in answers:
            if answer is not None:
                await read_frame(reader)
                writer.write(answer)
        if not hang_up:
            await reader.read()  # until the client hangs up
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        await asyncio.gather(*handlers)
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
@pytest.mark.parametrize("case", BAD_REPLIES)
@pytest.mark.parametrize("client", ["async", "blocking"])
async def test_client_raises_protocol_error_naming_the_problem(case, client, loop_errors):
    *answers, expected = BAD_REPLIES[case]
    async with fake_server(*answers) as port:
        if client == "async":
            env: Any = GameClientEnv(port=port)
            with pytest.raises(ProtocolError, match=expected):
                await env.reset(seed=0)
            with pytest.raises(ResetNeeded):  # the connection was dropped
                await env.step(0)
            await env.close()
        else:
            env = BlockingGameClientEnv(port=port)
            with pytest.raises(ProtocolError, match=expected):
                await asyncio.to_thread(env.reset, seed=0)
            with pytest.raises(ResetNeeded):
                env.step(0)
            env.close()


GOOD_RESET = message(type="reset", obs=[0.0, 0.5, 1.0, 0.25], info={"steps": 0, "distance": 1})
# name -> (answer to a step, expected error)
BAD_STEP_REPLIES = {
    "short": (frame(b"s" + bytes(10)), "malformed 'step' frame: expected 35 bytes, got 11"),
    "long": (frame(STEP_REPLY.pack(b"s", *[0.0] * 5, 0, 0, 1, 1) + b"\x00"), "got 36"),
    "flags": (step_reply(flags=(2, 0)), "flags must be 0 or 1, got 2 and 0"),
    "nan-obs": (step_reply(obs=(0.0, math.nan, 0.0, 0.0)), "must be finite"),
    "inf-obs": (step_reply(obs=(0.0, 0.0, -math.inf, 0.0)), "must be finite"),
    "inf-reward": (step_reply(reward=math.inf), "must be finite"),
    "json-step": (message(type="step", action=1), "unknown message type 'step'"),
    "reset-for-step": (GOOD_RESET, "expected a 'step' reply, got 'reset'"),
    "error": (message(type="error", message="no"), "replied with an error: no"),
    "not-json": (frame(b"\x00\x01"), "malformed frame: not valid UTF-8 JSON"),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", BAD_STEP_REPLIES)
@pytest.mark.parametrize("client", ["async", "blocking"])
async def test_client_checks_binary_step_replies(case, client, loop_errors):
    answer, expected = BAD_STEP_REPLIES[case]
    async with fake_server(GOOD_HELLO, GOOD_RESET, answer) as port:
        if client == "async":
            env: Any = GameClientEnv(port=port)
            await env.reset(seed=0)
            with pytest.raises(ProtocolError, match=expected):
                await env.step(1)
            with pytest.raises(ResetNeeded):  # the connection was dropped
                await env.step(0)
            await env.close()
        else:
            env = BlockingGameClientEnv(port=port)
            await asyncio.to_thread(env.reset, seed=0)
            with pytest.raises(ProtocolError, match=expected):
                await asyncio.to_thread(env.step, 1)
            with pytest.raises(ResetNeeded):
                env.step(0)
            env.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("client", ["async", "blocking"])
async def test_client_reads_a_binary_step_reply_exactly(client, loop_errors):
    obs = (0.1, 1 / 3, 0.0, 1.0)  # not float32 values: the client gets their float32 bits
    answer = step_reply(obs=obs, flags=(1, 0), reward=1.0, steps=7, distance=0)
    async with fake_server(GOOD_HELLO, GOOD_RESET, answer) as port:
        if client == "async":
            env: Any = GameClientEnv(port=port)
            await env.reset(seed=0)
            result = await env.step(1)
            await env.close()
        else:
            env = BlockingGameClientEnv(port=port)
            await asyncio.to_thread(env.reset, seed=0)
            result = await asyncio.to_thread(env.step, 1)
            env.close()
    want = np.array(obs, dtype=np.float32)
    assert_same(result, (want, 1.0, True, False, {"steps": 7, "distance": 0}))
    assert result[0].tobytes() == want.tobytes()


@pytest.mark.asyncio
@pytest.mark.parametrize("answer", [b"", b"\x00\x00", struct.pack(">I", 10) + b"{"])
async def test_client_reports_a_closed_connection_as_connection_error(answer, loop_errors):
    async with fake_server(answer, hang_up=True) as port:
        env = GameClientEnv(port=port)
        with pytest.raises(ConnectionResetError, match=r"closed the connection|middle") as info:
            await env.reset()
        assert not isinstance(info.value, ProtocolError)
        await env.close()


# --------------------------------------------------------------------------- latency


@pytest.mark.asyncio
async def test_latency_is_applied_to_each_reply(loop_errors):
    async with GameServer(latency=0.02) as server:
        env = GameClientEnv(port=server.port)
        assert await timed(env.reset(seed=0)) >= 0.02
        assert await timed(env.step(0)) >= 0.02
        await env.close()


@pytest.mark.asyncio
async def test_pipelined_requests_are_answered_in_order_despite_jitter(loop_errors):
    # Each reply draws its own jitter, so a later request's reply may fall due first.
    async with GameServer(latency=0.001, jitter=0.02) as server:
        reader, writer = await asyncio.open_connection(*server.address)
        steps = [step_request(a % 5) for a in range(12)]
        writer.write(b"".join([HELLO, RESET, *steps]))
        kinds = [(await read_message(reader))["type"] for _ in range(2)]
        replies = [await read_message(reader) for _ in steps]
        assert kinds == ["hello", "reset"]
        assert [reply["steps"] for reply in replies] == list(range(1, 13))
        assert 1 <= server.stats.wakeups <= 13  # the timer woke the loop, at most once a reply
        writer.close()
        await writer.wait_closed()


@pytest.mark.asyncio
async def test_replies_without_latency_need_no_timer(loop_errors):
    async with GameServer() as server:
        env = GameClientEnv(port=server.port)
        await env.reset(seed=0)
        await env.step(0)
        assert (server.stats.steps, server.stats.wakeups) == (1, 0)
        await env.close()


@pytest.mark.asyncio
async def test_many_remote_envs_wait_concurrently(loop_errors):
    num_envs, latency = 64, 0.02
    async with GameServer(latency=latency) as server:
        fns = [lambda: GameClientEnv(port=server.port)] * num_envs
        async with aiovec.AsyncioVectorEnv(fns) as venv:
            await venv.reset(seed=0)
            actions = np.zeros(num_envs, dtype=np.int64)
            elapsed = await timed(venv.step(actions))
        assert server.stats.steps == num_envs
    assert latency <= elapsed < 0.5 * num_envs * latency


@pytest.mark.asyncio
async def test_a_cancelled_round_trip_drops_the_connection(loop_errors):
    async with GameServer(latency=0.05) as server:
        env = GameClientEnv(port=server.port)
        await env.reset(seed=0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(env.step(0), 0.01)
        with pytest.raises(ResetNeeded):  # a late reply must never be read as the next one
            await env.step(0)
        await env.reset(seed=0)
        await env.step(0)
        await env.close()


# --------------------------------------------------------------------------- failures


@pytest.mark.asyncio
async def test_drop_all_fails_the_next_step(loop_errors):
    async with GameServer() as server:
        env = GameClientEnv(port=server.port)
        await env.reset(seed=0)
        assert server.drop_all() == 1
        with pytest.raises(ConnectionError):
            await env.step(0)
        with pytest.raises(ResetNeeded, match="call reset"):
            await env.step(0)
        await env.reset(seed=0)  # connects again
        await env.step(0)
        assert server.stats.connections == 2
        await env.close()


def test_drop_all_fails_the_next_blocking_step():
    with GameServer().start_in_thread() as server:
        env = BlockingGameClientEnv(port=server.port)
        env.reset(seed=0)
        assert server.drop_all() == 1
        with pytest.raises(ConnectionError):
            env.step(0)
        env.reset(seed=0)
        env.step(0)
        env.close()


@pytest.mark.asyncio
async def test_pause_accepting_holds_new_connections_until_resumed(loop_errors):
    async with GameServer() as server:
        connected = GameClientEnv(port=server.port)
        await connected.reset(seed=0)
        server.pause_accepting()
        env = GameClientEnv(port=server.port, connect_timeout=0.1)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"connect_timeout=0\.1"):
            await env.reset()
        assert time.monotonic() - start < 2.0
        await connected.step(0)  # open sessions keep playing
        server.resume_accepting()
        await env.reset()
        await env.step(0)
        await env.close()
        await connected.close()


@pytest.mark.asyncio
async def test_pause_accepting_can_refuse_at_once(loop_errors):
    async with GameServer() as server:
        server.pause_accepting(refuse=True)
        env = GameClientEnv(port=server.port, connect_timeout=5.0)
        with pytest.raises(ConnectionError):
            await env.reset()
        assert server.stats.refused == 1
        server.resume_accepting()
        await env.reset()
        await env.close()


def test_blocking_connect_times_out_while_paused():
    with GameServer().start_in_thread() as server:
        server.pause_accepting()
        env = BlockingGameClientEnv(port=server.port, connect_timeout=0.1)
        with pytest.raises(TimeoutError, match=r"connect_timeout=0\.1"):
            env.reset()
        server.resume_accepting()
        env.reset()
        env.close()


# --------------------------------------------------------------------------- leftovers


@pytest.mark.asyncio
async def test_stop_leaves_no_task_behind(loop_errors):
    server = GameServer()
    await server.start()
    idle = GameClientEnv(port=server.port)
    await idle.reset(seed=0)
    server.latency = 60.0
    mid_step = asyncio.create_task(idle.step(0))  # a session asleep in its latency
    server.pause_accepting()
    held_reader, held_writer = await asyncio.open_connection(*server.address)  # a held one
    while server.active_connections < 2:  # noqa: ASYNC110  (nothing to wait on)
        await asyncio.sleep(0.001)
    await server.stop()
    assert server.active_connections == 0
    with pytest.raises(ConnectionError):
        await mid_step
    assert await held_reader.read() == b""
    held_writer.close()
    await held_writer.wait_closed()
    await idle.close()
    await server.stop()  # idempotent
    assert other_tasks() == set()


def test_stopping_the_thread_joins_it():
    handle = GameServer().start_in_thread()
    env = BlockingGameClientEnv(port=handle.port)
    env.reset(seed=0)
    handle.stop()
    assert not any(t.name == "aiovec-game-server" for t in threading.enumerate())
    with pytest.raises(ConnectionError):
        env.step(0)
    env.close()
    handle.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        handle.drop_all()


def test_start_in_thread_reports_why_it_could_not_start():
    with GameServer().start_in_thread() as taken, pytest.raises(OSError, match="in use"):
        GameServer(port=taken.port).start_in_thread()


def test_server_checks_its_arguments():
    with pytest.raises(ValueError, match="latency >= 0"):
        GameServer(latency=-1)
    with pytest.raises(RuntimeError, match="not started"):
        _ = GameServer().port
