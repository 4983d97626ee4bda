"""A loopback game server and the client envs that play on it.

Theory of operation
-------------------
This module is a real *network env* for tests, examples and benchmarks: the
game runs in a server, and each env is a client paying one round trip per
``reset``/``step``, like an env that talks to a remote simulator.  Four small
layers, the first two pure (no sockets, no event loop):

1. **The game** (`ChaseGame`).  A runner chases a wandering target on a
   grid.  Everything random comes from the generator handed to ``reset``, so
   the same seed and actions replay the same episodes anywhere.
   `LocalGameEnv` is the game as a plain ``gymnasium.Env``: the oracle
   that remote envs are checked against.
2. **The protocol** (version 2).  A frame is a 4-byte big-endian length, then
   its payload.  The length is checked against ``max_message_bytes`` as soon
   as the header is in: an oversized frame is refused before any of its body
   is waited for or kept.  A payload is either a UTF-8 JSON object with a
   ``"type"`` (``hello``, ``reset``, ``error``: rare messages, checked against
   a schema table, ``_REQUESTS`` on the server and ``_REPLIES`` on the
   clients), or a fixed-size binary ``step`` frame told apart by its first
   byte (``S`` request, ``s`` reply; ``{`` opens every JSON object).  Steps
   are the hot path: JSON with a field-by-field check cost ~8 us to encode
   and ~12 us to decode per message, against ~1-3 us for these frames.
   Anything wrong raises `ProtocolError` naming the problem::

       type   client -> server                    server -> client
       hello  JSON: version                       JSON: version, game (spaces, size, max_steps)
       reset  JSON: seed (int|null), options      JSON: obs, info
       step   binary, 2 bytes: "S", action (u8)   binary, 35 bytes (big-endian): "s",
                                                  obs (4 x float32), reward (float64),
                                                  terminated, truncated (u8, 0 or 1),
                                                  info steps, distance (u32 each)
       error  -                                   JSON: message; then the server hangs up

   A binary frame must have its exact size, flags of 0 or 1 and finite
   numbers (as JSON, which has no NaN).  Observations arrive bit-identical:
   as float32 bits in a ``step`` reply, and as JSON numbers in a ``reset``
   reply (Python writes the shortest repr that round-trips).  `_Frames`
   cuts a byte stream into payloads for the server and both clients, and
   bytes beyond the reply to the one request in flight are a `ProtocolError`
   on the clients.  A `_Session` (one connection's game and generator) turns
   a request payload into a reply frame, or raises `ProtocolError`.
3. **The server** (`GameServer`).  An ``asyncio.Protocol`` per
   connection on 127.0.0.1, each with its session; no task per connection.
   Each ``reset``/``step`` reply waits ``latency`` (+ seeded ``jitter``)
   seconds in one heap shared by every connection, under one loop timer.  Any protocol error gets an
   ``error`` reply and that connection closed; other sessions never notice.
   Tests make failures with `GameServer.drop_all` and
   `GameServer.pause_accepting`; `GameServer.start_in_thread` runs
   the server on its own thread and loop for synchronous code.
4. **The clients.**  `GameClientEnv` (an `aiovec.AsyncEnv` whose
   connection is an ``asyncio.Protocol``: frames are cut as bytes arrive and
   the one reply awaited resolves a future, with no stream reader or task in
   between) and `BlockingGameClientEnv` (a ``gymnasium.Env`` over a
   blocking socket, one ``recv`` per reply most often) build requests and
   read replies with the same functions; only the moving of bytes differs.
   Every side sets ``TCP_NODELAY`` (asyncio does on its own), so that a small
   frame is never held back by Nagle's algorithm.  Both connect on the first
   ``reset``.  Any failure in a round trip (an error, a timeout, a
   cancellation) drops the connection, because the stream may be out of step.
   The next ``reset`` reconnects.

Only loopback addresses are ever used: the server binds 127.0.0.1, and the
clients refuse any host that is not a loopback IP literal.

Example:
    >>> async with GameServer(latency=0.01) as server:  # doctest: +SKIP
    ...     fns = [lambda: GameClientEnv(port=server.port)] * 64
    ...     async with aiovec.AsyncioVectorEnv(fns) as venv:
    ...         obs, infos = await venv.reset(seed=0)  # one round trip, not 64
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import heapq
import ipaddress
import itertools
import json
import math
import operator
import random
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final, Self, SupportsIndex, TypeVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from gymnasium.utils import seeding
from numpy.typing import NDArray

from aiovec._env import AsyncEnv

__all__ = (
    "DEFAULT_MAX_MESSAGE_BYTES",
    "LOOPBACK",
    "PROTOCOL_VERSION",
    "BlockingGameClientEnv",
    "ChaseGame",
    "GameClientEnv",
    "GameServer",
    "LocalGameEnv",
    "ProtocolError",
    "ServerStats",
    "ServerThread",
    "game_spaces",
)

T = TypeVar("T")
Obs = NDArray[np.float32]
Message = dict[str, Any]
StepResult = tuple[Obs, float, bool, bool, dict[str, Any]]

PROTOCOL_VERSION: Final = 2
LOOPBACK: Final = "127.0.0.1"
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024
_HEADER: Final = struct.Struct(">I")
_RECV_BYTES: Final = 4096  # the blocking client reads at most this much at once


class ProtocolError(ConnectionError):
    """A peer broke the game protocol, or the server answered ``error``.

    The message says what was wrong (malformed frame, oversized frame, unknown
    message type, wrong fields, ...).  The connection is closed afterwards.
    """


# --------------------------------------------------------------------------- the game

_MOVES: Final = ((0, 0), (0, 1), (0, -1), (-1, 0), (1, 0))  # stay, up, down, left, right
_OBS_SIZE: Final = 4
_SPACES: Final = {
    "observation": {"low": 0.0, "high": 1.0, "shape": [_OBS_SIZE], "dtype": "float32"},
    "action": {"n": len(_MOVES)},
}
_MOVE_BATCH: Final = 64
CATCH_REWARD: Final = 1.0
STEP_REWARD: Final = -0.01


def game_spaces() -> tuple[spaces.Space[Obs], spaces.Discrete]:
    """Fresh copies of the game's spaces (the same for every grid size).

    Returns:
        ``Box(0, 1, (4,), float32)`` observations and ``Discrete(5)`` actions.
    """
    box: spaces.Space[Any] = spaces.Box(0.0, 1.0, (_OBS_SIZE,), np.float32)
    return box, spaces.Discrete(len(_MOVES))


def _action_index(action: SupportsIndex) -> int:
    """``action`` as a valid move index (accepts ``int`` and numpy integers)."""
    index = operator.index(action)
    if not 0 <= index < len(_MOVES):
        raise ValueError(f"action must be in [0, {len(_MOVES)}), got {index}")
    return index


class ChaseGame:
    """Catch a target that wanders on a ``size`` x ``size`` grid (pure logic, no I/O).

    Observation: ``[runner_x, runner_y, target_x, target_y] / (size - 1)`` as
    float32.  Actions: 0 stay, 1 up, 2 down, 3 left, 4 right; moves off the
    grid are clipped.  After the runner moves, an uncaught target makes a
    random move (staying is one of the five; the generator is asked for
    moves 64 at a time, from the first step after each reset).  Reward ``1.0`` on the catch,
    which terminates, ``-0.01`` otherwise; truncated after ``max_steps``
    steps.  Info: ``{"steps": int, "distance": int}`` (Manhattan distance).

    Args:
        size: Side of the grid (at least 2).
        max_steps: Steps before the episode is truncated (at least 1).
    """

    def __init__(self, size: int = 8, max_steps: int = 200) -> None:
        if size < 2 or max_steps < 1:
            raise ValueError(f"need size >= 2 and max_steps >= 1, got {size=}, {max_steps=}")
        self.size, self.max_steps = size, max_steps
        self.runner = self.target = (0, 0)
        self.steps = 0
        self._rng: np.random.Generator | None = None
        self._moves: list[int] = []  # the target's next moves, drawn _MOVE_BATCH at a time
        # Each coordinate / (size - 1) as float32 (held as Python floats): one lookup each.
        self._coords: list[float] = (
            np.arange(size, dtype=np.float32) / np.float32(size - 1)
        ).tolist()

    def reset(self, rng: np.random.Generator) -> tuple[Obs, dict[str, Any]]:
        """Start an episode; ``rng`` places the pieces and moves the target from now on."""
        self._rng = rng
        runner, target = rng.choice(self.size**2, size=2, replace=False)
        self.runner = divmod(int(runner), self.size)
        self.target = divmod(int(target), self.size)
        self.steps = 0
        self._moves = []
        return self._observe(), self._info()

    def step(self, action: SupportsIndex) -> StepResult:
        """Move the runner, then the target if it is not caught."""
        o0, o1, o2, o3, reward, caught, truncated, steps, distance = self.step_values(action)
        obs = np.array((o0, o1, o2, o3), dtype=np.float32)
        return obs, reward, caught, truncated, {"steps": steps, "distance": distance}

    def step_values(
        self, action: SupportsIndex
    ) -> tuple[float, float, float, float, float, bool, bool, int, int]:
        """`step` as flat values, in the order of a binary ``step`` reply.

        Returns:
            The 4 observation values, the reward, terminated, truncated and the
            info's ``steps`` and ``distance``: what the server packs into its
            reply, with no array or dict made on the way.
        """
        if self._rng is None:
            raise ResetNeeded("ChaseGame.step() called before reset()")
        self.runner = self._moved(self.runner, _action_index(action))
        caught = self.runner == self.target
        if not caught:
            if not self._moves:  # one generator call per _MOVE_BATCH moves, not per move
                self._moves = self._rng.integers(len(_MOVES), size=_MOVE_BATCH).tolist()[::-1]
            self.target = self._moved(self.target, self._moves.pop())
            caught = self.runner == self.target
        self.steps += 1
        truncated = not caught and self.steps >= self.max_steps
        reward = CATCH_REWARD if caught else STEP_REWARD
        coords, (rx, ry), (tx, ty) = self._coords, self.runner, self.target
        distance = abs(rx - tx) + abs(ry - ty)
        return (
            coords[rx],
            coords[ry],
            coords[tx],
            coords[ty],
            reward,
            caught,
            truncated,
            self.steps,
            distance,
        )

    def _moved(self, position: tuple[int, int], move: int) -> tuple[int, int]:
        (x, y), (dx, dy), last = position, _MOVES[move], self.size - 1
        return min(max(x + dx, 0), last), min(max(y + dy, 0), last)

    def _observe(self) -> Obs:
        coords, (rx, ry), (tx, ty) = self._coords, self.runner, self.target
        return np.array((coords[rx], coords[ry], coords[tx], coords[ty]), dtype=np.float32)

    def _info(self) -> dict[str, Any]:
        (rx, ry), (tx, ty) = self.runner, self.target
        return {"steps": self.steps, "distance": abs(rx - tx) + abs(ry - ty)}


class LocalGameEnv(gymnasium.Env[Obs, np.int64]):
    """`ChaseGame` as a plain ``gymnasium.Env``: the oracle for the remote envs.

    Args:
        size: Side of the grid.
        max_steps: Steps before truncation.
    """

    def __init__(self, size: int = 8, max_steps: int = 200) -> None:
        self.game = ChaseGame(size, max_steps)
        self.observation_space, self.action_space = game_spaces()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Start an episode (``options`` are accepted and ignored, as by the server)."""
        super().reset(seed=seed)
        return self.game.reset(self.np_random)

    def step(self, action: SupportsIndex) -> StepResult:
        """Play one move."""
        return self.game.step(action)


# --------------------------------------------------------------------------- the protocol

_Fields = Mapping[str, tuple[type, ...]]
_NUMBER: Final = (int, float)
_REQUESTS: Final[Mapping[str, _Fields]] = {
    "hello": {"version": (int,)},
    "reset": {"seed": (int, type(None)), "options": (dict, type(None))},
}
_REPLIES: Final[Mapping[str, _Fields]] = {
    "hello": {"version": (int,), "game": (dict,)},
    "reset": {"obs": (list,), "info": (dict,)},
    "error": {"message": (str,)},
}

# Binary step frames, header included: tag, action / tag, obs x 4 (float32), reward
# (float64), terminated, truncated (one byte each, 0 or 1), info steps and distance.
_STEP_REQUEST: Final = struct.Struct(">IcB")
_STEP_REPLY: Final = struct.Struct(">Ic4fdBBII")
_STEP_REPLY_BODY: Final = struct.Struct(">c4fdBBII")
_STEP_REQUEST_TAG: Final = b"S"
_STEP_REPLY_TAG: Final = b"s"
_STEP_REQUEST_SIZE: Final = _STEP_REQUEST.size - _HEADER.size  # payload bytes: 2
_STEP_REPLY_SIZE: Final = _STEP_REPLY_BODY.size  # payload bytes: 35
# Every step request there can be, made once.
_STEP_FRAMES: Final = tuple(
    _STEP_REQUEST.pack(_STEP_REQUEST_SIZE, _STEP_REQUEST_TAG, a) for a in range(len(_MOVES))
)


def _encode(message: Message) -> bytes:
    """One JSON frame: the 4-byte big-endian length, then compact JSON."""
    payload = _ENCODER.encode(message).encode()
    return _HEADER.pack(len(payload)) + payload


def _oversized(length: int, max_bytes: int) -> ProtocolError:
    return ProtocolError(
        f"oversized frame: {length} bytes announced, max_message_bytes is {max_bytes}"
    )


def _cut_frame(got: int, size: int) -> ConnectionResetError:
    return ConnectionResetError(f"connection closed in the middle of a frame ({got}/{size} bytes)")


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


# Made once: json.dumps/loads with options build a new encoder/decoder per call.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER: Final = json.JSONDecoder(parse_constant=_no_constants)


class _Frames:
    """Cuts a byte stream into frame payloads, refusing an oversized one from its header.

    Bytes are fed as they arrive; a frame's body is buffered only once its length
    has passed the check, and a partial frame is kept until it is complete, with
    no copy of the buffer per arrival.

    Args:
        max_bytes: Longest payload accepted.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self._needed = _HEADER.size  # bytes the buffer must hold before it is parsed again

    @property
    def pending(self) -> int:
        """Bytes held of a frame not complete yet."""
        return len(self._buffer)

    @property
    def needed(self) -> int:
        """Bytes the frame being received needs, as far as known (its header, at first)."""
        return self._needed

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of every frame completed by ``data``, in order.

        Raises:
            ProtocolError: A header announced more than ``max_bytes``.
        """
        buffer = self._buffer
        if not buffer and len(data) >= _HEADER.size:  # the usual case: one whole frame
            (length,) = _HEADER.unpack_from(data)
            if len(data) == _HEADER.size + length and length <= self.max_bytes:
                return [data[_HEADER.size :]]
        if buffer:
            buffer += data
            if len(buffer) < self._needed:
                return []
            data = bytes(buffer)
            buffer.clear()
        payloads, start, end = [], 0, len(data)
        while end - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(data, start)
            if length > self.max_bytes:
                raise _oversized(length, self.max_bytes)
            stop = start + _HEADER.size + length
            if stop > end:
                self._needed = stop - start
                break
            payloads.append(data[start + _HEADER.size : stop])
            start = stop
        else:
            self._needed = _HEADER.size
        if start < end:
            buffer += memoryview(data)[start:]
        return payloads


def _decode(payload: bytes, schema: Mapping[str, _Fields]) -> Message:
    """Parse and check one JSON payload against ``schema`` (type -> field types)."""
    try:
        message = _DECODER.decode(payload.decode())
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8 and NaN errors are ValueErrors
        raise ProtocolError(f"malformed frame: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("malformed frame: expected a JSON object with a string 'type'")
    fields = schema.get(message["type"])
    if fields is None:
        raise ProtocolError(
            f"unknown message type {message['type']!r:.40} (expected one of {sorted(schema)})"
        )
    _check_fields(message, fields)
    return message


def _check_fields(message: Message, fields: _Fields) -> None:
    kind, got = message["type"], sorted(set(message) - {"type"})
    if got != sorted(fields):
        raise ProtocolError(
            f"wrong fields in {kind!r} message: expected {sorted(fields)}, got {got}"
        )
    for name, types in fields.items():
        value = message[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join(t.__name__ for t in types)
            raise ProtocolError(
                f"wrong field in {kind!r} message: {name!r} must be {expected}, got {value!r:.40}"
            )


def _wrong_size(kind: str, expected: int, got: int) -> ProtocolError:
    return ProtocolError(f"malformed {kind!r} frame: expected {expected} bytes, got {got}")


class _Session:
    """One connection's game: request payload in, reply frame out (no I/O).

    Raises:
        ProtocolError: For a request that is malformed, not allowed now or has bad values.
    """

    def __init__(self, size: int, max_steps: int) -> None:
        self.game = ChaseGame(size, max_steps)
        self.rng: np.random.Generator | None = None
        self.greeted = False

    def handle(self, payload: bytes) -> tuple[str, bytes]:
        """The reply's type and frame."""
        if payload[:1] == _STEP_REQUEST_TAG:
            return "step", self._step(payload)
        request = _decode(payload, _REQUESTS)
        kind = request["type"]
        if self.greeted == (kind == "hello"):
            raise ProtocolError(f"'hello' must come first and once, got {kind!r}")
        handler = self._hello if kind == "hello" else self._reset
        return kind, _encode(handler(request))

    def _hello(self, request: Message) -> Message:
        if request["version"] != PROTOCOL_VERSION:
            raise ProtocolError(
                f"unsupported protocol version {request['version']} "
                f"(this server speaks {PROTOCOL_VERSION})"
            )
        self.greeted = True
        game = {"size": self.game.size, "max_steps": self.game.max_steps, "spaces": _SPACES}
        return {"type": "hello", "version": PROTOCOL_VERSION, "game": game}

    def _reset(self, request: Message) -> Message:
        seed = request["seed"]
        if seed is not None and seed < 0:
            raise ProtocolError(f"seed must be a non-negative int, got {seed}")
        if seed is not None or self.rng is None:  # as gymnasium.Env.reset seeds np_random
            self.rng, _ = seeding.np_random(seed)
        obs, info = self.game.reset(self.rng)
        return {"type": "reset", "obs": obs.tolist(), "info": info}

    def _step(self, payload: bytes) -> bytes:
        if len(payload) != _STEP_REQUEST_SIZE:
            raise _wrong_size("step", _STEP_REQUEST_SIZE, len(payload))
        if not self.greeted:
            raise ProtocolError("'hello' must come first and once, got 'step'")
        if self.rng is None:
            raise ProtocolError("'step' before the first 'reset'")
        try:
            values = self.game.step_values(payload[1])
        except ValueError as exc:
            raise ProtocolError(f"bad 'step' message: {exc}") from None
        return _STEP_REPLY.pack(_STEP_REPLY_SIZE, _STEP_REPLY_TAG, *values)


# Client side: building requests and reading replies, shared by both clients.


def _hello_request() -> bytes:
    return _encode({"type": "hello", "version": PROTOCOL_VERSION})


def _reset_request(seed: int | None, options: dict[str, Any] | None) -> bytes:
    seed = None if seed is None else operator.index(seed)
    return _encode({"type": "reset", "seed": seed, "options": options})


def _step_request(action: SupportsIndex) -> bytes:
    return _STEP_FRAMES[_action_index(action)]


def _reply(payload: bytes, expected: str, where: str) -> Message:
    """The checked JSON reply of type ``expected``; raises `ProtocolError` for anything else."""
    if payload[:1] == _STEP_REPLY_TAG:
        raise _wrong_reply(expected, "step")
    message = _decode(payload, _REPLIES)
    if message["type"] == "error":
        raise _error_reply(message, where)
    if message["type"] != expected:
        raise _wrong_reply(expected, message["type"])
    return message


def _wrong_reply(expected: str, got: str) -> ProtocolError:
    return ProtocolError(f"expected a {expected!r} reply, got {got!r}")


def _error_reply(message: Message, where: str) -> ProtocolError:
    return ProtocolError(f"game server at {where} replied with an error: {message['message']}")


def _check_hello(reply: Message) -> dict[str, Any]:
    """The server's game parameters, once its version and spaces match ours."""
    if reply["version"] != PROTOCOL_VERSION:
        raise ProtocolError(
            f"server speaks protocol version {reply['version']}, this client {PROTOCOL_VERSION}"
        )
    game: dict[str, Any] = reply["game"]
    if game.get("spaces") != _SPACES:
        raise ProtocolError(f"server's spaces {game.get('spaces')!r:.80} differ from {_SPACES}")
    return game


def _hello_result(payload: bytes, where: str) -> dict[str, Any]:
    return _check_hello(_reply(payload, "hello", where))


def _reset_result(payload: bytes, where: str) -> tuple[Obs, dict[str, Any]]:
    reply = _reply(payload, "reset", where)
    values = reply["obs"]
    numbers = all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in values)
    if len(values) != _OBS_SIZE or not numbers:
        raise ProtocolError(
            f"malformed observation: expected {_OBS_SIZE} numbers, got {values!r:.60}"
        )
    return np.array(values, dtype=np.float32), reply["info"]


def _step_result(payload: bytes, where: str) -> StepResult:
    """A binary ``step`` reply, checked; anything else raises `ProtocolError`."""
    if payload[:1] != _STEP_REPLY_TAG:
        message = _decode(payload, _REPLIES)  # a JSON reply instead: say which
        if message["type"] == "error":
            raise _error_reply(message, where)
        raise _wrong_reply("step", message["type"])
    if len(payload) != _STEP_REPLY_SIZE:
        raise _wrong_size("step", _STEP_REPLY_SIZE, len(payload))
    _, o0, o1, o2, o3, reward, terminated, truncated, steps, distance = _STEP_REPLY_BODY.unpack(
        payload
    )
    if terminated > 1 or truncated > 1:
        raise ProtocolError(
            f"malformed 'step' frame: flags must be 0 or 1, got {terminated} and {truncated}"
        )
    if not math.isfinite(o0 + o1 + o2 + o3 + reward):  # NaN or infinity in any of them
        raise ProtocolError(
            f"malformed 'step' frame: observation {[o0, o1, o2, o3]} and reward {reward} "
            "must be finite"
        )
    obs = np.array((o0, o1, o2, o3), dtype=np.float32)  # float32 -> float -> float32: exact
    return obs, reward, terminated == 1, truncated == 1, {"steps": steps, "distance": distance}


def _connect_timeout(host: str, port: int, timeout: float) -> TimeoutError:
    return TimeoutError(
        f"game server at {host}:{port} did not answer within connect_timeout={timeout} s"
    )


def _loopback_address(host: str, port: int | None, owner: str) -> tuple[str, int]:
    """``(host, port)`` once checked: a loopback IP literal and a valid port."""
    if port is None:
        raise TypeError(f"{owner} needs the game server's port, e.g. {owner}(port=server.port)")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{owner} only connects to loopback IP addresses, got host={host!r}")
    if not 0 < port < 2**16:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return host, port


# --------------------------------------------------------------------------- the server


@dataclasses.dataclass
class ServerStats:
    """Counters of a `GameServer` (updated on the server's loop).

    Attributes:
        connections: Connections admitted (refused ones not included).
        refused: Connections closed at once while ``pause_accepting(refuse=True)``.
        resets: ``reset`` requests answered.
        steps: ``step`` requests answered.
        errors: ``error`` replies sent (each closed its connection).
        wakeups: Times the reply timer woke the server's loop.  Replies that
            fall due together are sent in one wakeup, so under load this is
            far below ``resets + steps``.
    """

    connections: int = 0
    refused: int = 0
    resets: int = 0
    steps: int = 0
    errors: int = 0
    wakeups: int = 0


class GameServer:
    """Host one `ChaseGame` session per TCP connection, on 127.0.0.1 only.

    Each connection is an ``asyncio.Protocol``: requests are parsed as bytes
    arrive, and every delayed reply waits in one heap shared by all
    connections, under one loop timer set for the earliest (one timer per
    request would cost a timer handle and a wakeup each).  A connection's
    replies leave in the order of its requests.

    Args:
        port: Port to listen on; ``0`` picks a free one (read ``.port`` after start).
        size: Grid side of every session's game.
        max_steps: Steps before truncation in every session's game.
        latency: Seconds each ``reset``/``step`` reply waits before it is sent.
        jitter: Up to this many extra seconds per reply, uniformly at random.
        jitter_seed: Seed of the jitter generator.
        max_message_bytes: Longest request payload accepted; longer ones are
            refused from their length prefix, before the body is read.

    Example:
        >>> async with GameServer(latency=0.001) as server:  # doctest: +SKIP
        ...     env = GameClientEnv(port=server.port)
    """

    def __init__(
        self,
        *,
        port: int = 0,
        size: int = 8,
        max_steps: int = 200,
        latency: float = 0.0,
        jitter: float = 0.0,
        jitter_seed: int | None = 0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        ChaseGame(size, max_steps)  # validates the game's parameters
        if latency < 0 or jitter < 0 or max_message_bytes < 1:
            raise ValueError(
                f"need latency >= 0, jitter >= 0, max_message_bytes >= 1, got "
                f"{latency=}, {jitter=}, {max_message_bytes=}"
            )
        self.size, self.max_steps = size, max_steps
        self.latency, self.jitter = latency, jitter
        self.max_message_bytes = max_message_bytes
        self.stats = ServerStats()
        self._requested_port = port
        self._port: int | None = None
        self._jitter = random.Random(jitter_seed)
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[_Connection] = set()
        self._held: list[_Connection] = []  # connected while pause_accepting() held them
        self._holding = False
        self._refusing = False
        self._replies = _ReplyTimer(self.stats)

    @property
    def port(self) -> int:
        """The port listened on (known once started)."""
        if self._port is None:
            raise RuntimeError("GameServer is not started: use `async with GameServer()`")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the server."""
        return LOOPBACK, self.port

    @property
    def active_connections(self) -> int:
        """Connections open right now (held ones included)."""
        return len(self._connections)

    async def start(self) -> None:
        """Start listening (``async with`` does this for you)."""
        if self._server is not None:
            raise RuntimeError("GameServer is already started")
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Connection(self), LOOPBACK, self._requested_port
        )
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, drop every connection and wait until each is closed (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        self._replies.clear()
        while self._connections:
            closed = [c.closed for c in self._connections]
            for connection in self._connections:
                connection.transport.abort()
            await asyncio.wait(closed)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def start_in_thread(self) -> ServerThread:
        """Run this server on a new thread with its own event loop (for sync code).

        Returns:
            The started `ServerThread`; call its ``stop()`` (or use it in
            a ``with`` block) to stop the server and join the thread.
        """
        thread = ServerThread(self)
        thread.start()
        return thread

    def drop_all(self) -> int:
        """Abort every open connection at once, as a crashing server would.

        Returns:
            How many connections were dropped.
        """
        open_ = [c for c in self._connections if not c.transport.is_closing()]
        for connection in open_:
            connection.transport.abort()
        return len(open_)

    def pause_accepting(self, *, refuse: bool = False) -> None:
        """Stop admitting new connections until `resume_accepting`.

        Args:
            refuse: ``False`` holds new connections unanswered (clients time
                out, as with a stalled accept loop); ``True`` closes them at
                once (clients fail immediately with a ``ConnectionError``).
        """
        self._refusing = refuse
        self._holding = not refuse

    def resume_accepting(self) -> None:
        """Admit connections again, held ones included."""
        self._refusing = self._holding = False
        held, self._held = self._held, []
        for connection in held:
            if not connection.transport.is_closing():
                self._admit(connection)

    def _connected(self, connection: _Connection) -> bool:
        """A new connection: admitted, held or refused; ``False`` if it was refused."""
        if self._refusing or self._server is None:
            self.stats.refused += 1
            connection.transport.abort()
            return False
        self._connections.add(connection)
        if self._holding:
            connection.transport.pause_reading()
            self._held.append(connection)
        else:
            self._admit(connection)
        return True

    def _admit(self, connection: _Connection) -> None:
        self.stats.connections += 1
        connection.admitted = True
        connection.resume_reading()

    def _delay(self) -> float:
        return self.latency + (self._jitter.uniform(0, self.jitter) if self.jitter else 0.0)


class _Connection(asyncio.Protocol):
    """One client's session on a `GameServer`: frames in, replies out (in order)."""

    transport: asyncio.Transport

    def __init__(self, server: GameServer) -> None:
        self.server = server
        self.session = _Session(server.size, server.max_steps)
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self.admitted = False
        self.last_due = 0.0  # loop time at which this connection's last queued reply leaves
        self._frames = _Frames(server.max_message_bytes)
        self._writing_paused = False
        self._done = False  # an error reply is on its way: read nothing more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport
        if not self.server._connected(self):
            self.closed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:  # the client does not read: stop reading it too
        self._writing_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.resume_reading()

    def resume_reading(self) -> None:
        if self.admitted and not self._writing_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        session = self.session
        try:
            for payload in self._frames.feed(data):
                kind, reply = session.handle(payload)
                self._send(kind, reply)
        except ProtocolError as exc:
            self.server.stats.errors += 1
            self._done = True
            self._send("error", _encode({"type": "error", "message": str(exc)}))

    def _send(self, kind: str, reply: bytes) -> None:
        """Send ``reply`` after the server's latency, after this connection's earlier replies."""
        delay = 0.0 if kind in ("hello", "error") else self.server._delay()
        now = self._loop.time()
        due = max(now + delay, self.last_due)
        self.last_due = due
        if due <= now:
            self.write(kind, reply)
        else:
            self.server._replies.add(self._loop, due, self, kind, reply)

    def write(self, kind: str, data: bytes) -> None:
        """Write a reply now (dropped if the connection is gone); an error closes it."""
        if self.transport.is_closing():
            return
        stats = self.server.stats  # counted first: the client may read them once it has the reply
        if kind == "step":
            stats.steps += 1
        elif kind == "reset":
            stats.resets += 1
        self.transport.write(data)
        if kind == "error":
            self.transport.close()  # after the reply has been flushed


class _ReplyTimer:
    """Replies waiting for their time, for every connection, under one loop timer."""

    def __init__(self, stats: ServerStats) -> None:
        self._stats = stats
        self._heap: list[tuple[float, int, _Connection, str, bytes]] = []
        self._order = itertools.count()  # keeps equal times in the order they came
        self._timer: asyncio.TimerHandle | None = None

    def add(
        self, loop: asyncio.AbstractEventLoop, due: float, to: _Connection, kind: str, data: bytes
    ) -> None:
        heapq.heappush(self._heap, (due, next(self._order), to, kind, data))
        timer = self._timer
        if timer is None or due < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(due, self._fire, loop)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._stats.wakeups += 1
        self._timer = None
        heap, now = self._heap, loop.time()
        while heap and heap[0][0] <= now:
            _, _, to, kind, data = heapq.heappop(heap)
            to.write(kind, data)
        if heap:
            self._timer = loop.call_at(heap[0][0], self._fire, loop)


class ServerThread:
    """A `GameServer` running on a thread of its own, with its own event loop.

    Made by `GameServer.start_in_thread`.  Its methods may be called
    from any other thread; ``stop()`` stops the server and joins the thread.

    Args:
        server: The server to run (not started yet).
    """

    def __init__(self, server: GameServer) -> None:
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="aiovec-game-server", daemon=True)

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self.server.port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` of the server."""
        return self.server.address

    def start(self) -> None:
        """Start the thread and wait until the server listens (or raise why it could not)."""
        self._thread.start()
        try:
            self._ready.result()
        except BaseException:
            self._thread.join()
            raise

    def stop(self) -> None:
        """Stop the server, let its loop finish and join the thread (idempotent)."""
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread.ident is not None:
            self._thread.join()

    def drop_all(self) -> int:
        """`GameServer.drop_all`, run on the server's loop."""
        return self._call(self.server.drop_all)

    def pause_accepting(self, *, refuse: bool = False) -> None:
        """`GameServer.pause_accepting`, run on the server's loop."""
        self._call(lambda: self.server.pause_accepting(refuse=refuse))

    def resume_accepting(self) -> None:
        """`GameServer.resume_accepting`, run on the server's loop."""
        self._call(self.server.resume_accepting)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _call(self, fn: Callable[[], T]) -> T:
        if self._loop is None or not self._thread.is_alive():
            raise RuntimeError("the server thread is not running")

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        try:
            await self.server.start()
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._loop = asyncio.get_running_loop()
        self._ready.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await self.server.stop()


# --------------------------------------------------------------------------- the clients


class _ClientSettings:
    """What both clients share: a loopback address and limits."""

    host: str
    port: int
    connect_timeout: float
    max_message_bytes: int
    _where: str  # "host:port", for messages

    def _configure(
        self, host: str, port: int | None, connect_timeout: float, max_message_bytes: int
    ) -> None:
        self.host, self.port = _loopback_address(host, port, type(self).__name__)
        self._where = f"{host}:{port}"
        self.connect_timeout = connect_timeout
        self.max_message_bytes = max_message_bytes


class GameClientEnv(_ClientSettings, AsyncEnv[Obs, np.int64]):
    """An `aiovec.AsyncEnv` that plays `ChaseGame` on a `GameServer`.

    The spaces are known at construction, so a vector env can be built before
    any connection.  The first ``reset`` connects and greets the server; then
    each ``reset``/``step`` is one round trip.  A failed round trip closes the
    connection (a later ``reset`` reconnects).

    Args:
        host: The server's loopback IP address.
        port: The server's port (required).
        connect_timeout: Seconds allowed to connect and greet the server.
        max_message_bytes: Longest reply payload accepted.

    Raises:
        ProtocolError: (from ``reset``/``step``) the server broke the protocol
            or replied with an error.
        ConnectionError: (from ``reset``/``step``) the connection failed or closed.
        TimeoutError: (from the first ``reset``) no handshake within ``connect_timeout``.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (as gymnasium.Env)

    def __init__(
        self,
        host: str = LOOPBACK,
        port: int | None = None,
        *,
        connect_timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._configure(host, port, connect_timeout, max_message_bytes)
        self.observation_space, self.action_space = game_spaces()
        self.game: dict[str, Any] | None = None  # the server's game parameters, once greeted
        self._connection: _ClientConnection | None = None

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Start an episode on the server, connecting first if needed."""
        await super().reset(seed=seed)
        request = _reset_request(seed, options)
        if self._connection is None:
            await self._connect()
        return await self._round_trip(request, _reset_result)

    async def step(self, action: SupportsIndex) -> StepResult:
        """Play one move on the server."""
        request = _step_request(action)
        connection = self._connection
        if connection is None:
            raise ResetNeeded("GameClientEnv is not connected: call reset() first")
        try:  # _round_trip, inlined on this hot path (one coroutine less per step)
            return _step_result(await connection.request(request), self._where)
        except BaseException:
            self._drop()
            raise

    async def close(self) -> None:
        """Close the connection, if any, and wait until it is closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.transport.close()
            await connection.closed

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, self._connection = await loop.create_connection(
                    lambda: _ClientConnection(self.max_message_bytes, self._where),
                    self.host,
                    self.port,
                )
                self.game = await self._round_trip(_hello_request(), _hello_result)
        except TimeoutError:
            self._drop()
            raise _connect_timeout(self.host, self.port, self.connect_timeout) from None
        except BaseException:
            self._drop()  # e.g. a server of another version: never left half-connected
            raise

    async def _round_trip(self, request: bytes, read: Callable[[bytes, str], T]) -> T:
        """Send ``request`` and ``read`` its reply's payload (``read(payload, where)``)."""
        connection = self._connection
        if connection is None:
            raise ConnectionResetError(f"connection to {self._where} was dropped")
        try:
            return read(await connection.request(request), self._where)
        except BaseException:
            self._drop()  # out of step with the server (or gone): never reuse it
            raise

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.transport.abort()


class _ClientConnection(asyncio.Protocol):
    """A `GameClientEnv`'s connection: frames cut as bytes arrive, one reply awaited at a time.

    `request` writes a frame and returns a future for the next frame's payload.
    No write waits for the buffer to drain: only one request is ever in flight,
    and its reply cannot come before the request was delivered.  Bytes that
    arrive with no request in flight, or after the reply to it, are a protocol
    error; once failed, the connection fails every later request.

    Args:
        max_bytes: Longest reply payload accepted.
        where: ``host:port``, for messages.
    """

    transport: asyncio.Transport

    def __init__(self, max_bytes: int, where: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._where = where
        self._frames = _Frames(max_bytes)
        self._waiter: asyncio.Future[bytes] | None = None
        self._failure: Exception | None = None

    def request(self, frame: bytes) -> asyncio.Future[bytes]:
        """Send ``frame``; the future gets the reply's payload (or the connection's failure)."""
        if self._failure is not None:
            raise self._failure
        waiter = self._loop.create_future()
        self._waiter = waiter
        self.transport.write(frame)
        return waiter

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport

    def data_received(self, data: bytes) -> None:
        if self._failure is not None:
            return
        try:
            payloads = self._frames.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        waiter = self._waiter
        if not payloads:  # the reply is not complete yet
            if waiter is None:
                self._fail(_unexpected_data(self._where))
            return
        self._waiter = None
        if waiter is None or len(payloads) > 1 or self._frames.pending:
            self._fail(_unexpected_data(self._where))  # fails the next request, not this reply
        if waiter is not None and not waiter.done():
            waiter.set_result(payloads[0])

    def eof_received(self) -> bool:
        self._fail(_closed_error(self._frames, self._where))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._failure is None:
            error = ConnectionResetError(f"connection to game server at {self._where} was lost")
            error.__cause__ = exc
            self._fail(error)
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, exc: Exception) -> None:
        """Fail the request in flight, if any, and every later one."""
        if self._failure is None:
            self._failure = exc
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class BlockingGameClientEnv(_ClientSettings, gymnasium.Env[Obs, np.int64]):
    """`GameClientEnv` over a blocking socket: a plain ``gymnasium.Env``.

    Same protocol and results; for thread pools and ``gymnasium`` vector envs.

    Args:
        host: The server's loopback IP address.
        port: The server's port (required).
        connect_timeout: Seconds allowed for each blocking operation of the
            connection and handshake.
        max_message_bytes: Longest reply payload accepted.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012  (as gymnasium.Env)

    def __init__(
        self,
        host: str = LOOPBACK,
        port: int | None = None,
        *,
        connect_timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._configure(host, port, connect_timeout, max_message_bytes)
        self.observation_space, self.action_space = game_spaces()
        self.game: dict[str, Any] | None = None
        self._sock: socket.socket | None = None
        self._frames = _Frames(max_message_bytes)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Obs, dict[str, Any]]:
        """Start an episode on the server, connecting first if needed."""
        super().reset(seed=seed)
        request = _reset_request(seed, options)
        if self._sock is None:
            self._connect()
        return self._round_trip(request, _reset_result)

    def step(self, action: SupportsIndex) -> StepResult:
        """Play one move on the server."""
        request = _step_request(action)
        if self._sock is None:
            raise ResetNeeded("BlockingGameClientEnv is not connected: call reset() first")
        return self._round_trip(request, _step_result)

    def close(self) -> None:
        """Close the connection, if any."""
        sock, self._sock = self._sock, None
        self._frames = _Frames(self.max_message_bytes)
        if sock is not None:
            sock.close()

    def _connect(self) -> None:
        try:
            self._sock = socket.create_connection((self.host, self.port), self.connect_timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.game = self._round_trip(_hello_request(), _hello_result)
            self._sock.settimeout(None)
        except TimeoutError:
            self.close()
            raise _connect_timeout(self.host, self.port, self.connect_timeout) from None
        except BaseException:
            self.close()
            raise

    def _round_trip(self, request: bytes, read: Callable[[bytes, str], T]) -> T:
        """Send ``request`` and ``read`` its reply's payload (``read(payload, where)``)."""
        sock = self._sock
        if sock is None:
            raise ConnectionResetError(f"connection to {self._where} was dropped")
        try:
            sock.sendall(request)
            return read(self._receive(sock), self._where)
        except BaseException:
            self.close()  # out of step with the server (or gone): never reuse it
            raise

    def _receive(self, sock: socket.socket) -> bytes:
        """The reply's payload; bytes that came with it beyond it are a protocol error."""
        frames = self._frames
        payloads: list[bytes] = []
        while not payloads:
            data = sock.recv(_RECV_BYTES)
            if not data:
                raise _closed_error(frames, self._where)
            payloads = frames.feed(data)
        if len(payloads) > 1 or frames.pending:
            raise _unexpected_data(self._where)
        return payloads[0]


def _unexpected_data(where: str) -> ProtocolError:
    """The error for bytes a client got beyond the one reply it waited for."""
    return ProtocolError(f"game server at {where} sent data with no request in flight")


def _closed_error(frames: _Frames, where: str) -> ConnectionResetError:
    """The error for a connection the server closed (in the middle of a frame or not)."""
    if frames.pending:
        return _cut_frame(frames.pending, frames.needed)
    return ConnectionResetError(f"game server at {where} closed the connection")
