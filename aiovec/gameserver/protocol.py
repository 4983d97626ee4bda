"""The game protocol (version 2): frames, messages, and how each side reads them (no I/O).

A frame is a 4-byte big-endian length, then its payload.  `Framer` cuts a
byte stream into payloads for the server and both clients, and checks the
length against ``max_message_bytes`` as soon as the header is in: an
oversized frame is refused before any of its body is waited for or kept.

A payload is either a UTF-8 JSON object with a ``"type"`` (``hello``,
``reset``, ``error``: rare messages, checked against a schema table,
``_REQUESTS`` for the server and ``_REPLIES`` for the clients), or a
fixed-size binary ``step`` frame told apart by its first byte (``S`` request,
``s`` reply; ``{`` opens every JSON object).  Steps are the hot path, so they
skip JSON and its field-by-field check, which cost several times as much a message.
Anything wrong raises `ProtocolError` naming the problem::

    type   client -> server                    server -> client
    hello  JSON: version                       JSON: version, game (spaces, size, max_steps)
    reset  JSON: seed (int|null), options      JSON: obs, info
    step   binary, 2 bytes: "S", action (u8)   binary, 35 bytes (big-endian): "s",
                                               obs (4 x float32), reward (float64),
                                               terminated, truncated (u8, 0 or 1),
                                               info steps, distance (u32 each)
    error  -                                   JSON: message; then the server hangs up

A binary frame must have its exact size, flags of 0 or 1 and finite numbers
(as JSON, which has no NaN).  Observations arrive bit-identical: as float32
bits in a ``step`` reply, and as JSON numbers in a ``reset`` reply (Python
writes the shortest repr that round-trips).  The server's side is
`is_step_request`, `decode_request`, `step_action`, `step_reply_frame` and
`error_frame`; the
clients' side builds requests (`hello_request`, ...) and reads replies
(`hello_result`, ...).
"""

from __future__ import annotations

import json
import math
import operator
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, SupportsIndex

import numpy as np

from aiovec.gameserver.game import MOVES, OBS_SIZE, SPACES, Obs, StepResult, action_index

__all__ = (
    "DEFAULT_MAX_MESSAGE_BYTES",
    "LOOPBACK",
    "PROTOCOL_VERSION",
    "Framer",
    "Message",
    "ProtocolError",
    "closed_error",
    "decode_request",
    "encode",
    "error_frame",
    "hello_request",
    "hello_result",
    "is_step_request",
    "reset_request",
    "reset_result",
    "step_action",
    "step_reply_frame",
    "step_request",
    "step_result",
)

Message = dict[str, Any]

PROTOCOL_VERSION: Final = 2
LOOPBACK: Final = "127.0.0.1"
"""The only address the server binds; clients refuse any host that is not a loopback IP."""
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024
_HEADER: Final = struct.Struct(">I")


class ProtocolError(ConnectionError):
    """A peer broke the game protocol, or the server answered ``error``.

    The message says what was wrong (malformed frame, oversized frame, unknown
    message type, wrong fields, ...).  The connection is closed afterwards.
    """


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
    _STEP_REQUEST.pack(_STEP_REQUEST_SIZE, _STEP_REQUEST_TAG, a) for a in range(len(MOVES))
)


def encode(message: Message) -> bytes:
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


class Framer:
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


# The server's side: reading requests, writing replies.


def is_step_request(payload: bytes) -> bool:
    """Whether ``payload`` is a binary ``step`` request (else it is JSON)."""
    return payload[:1] == _STEP_REQUEST_TAG


def decode_request(payload: bytes) -> Message:
    """A JSON request, checked against the request schemas."""
    return _decode(payload, _REQUESTS)


def step_action(payload: bytes) -> int:
    """The action byte of a binary ``step`` request of the right size."""
    if len(payload) != _STEP_REQUEST_SIZE:
        raise _wrong_size("step", _STEP_REQUEST_SIZE, len(payload))
    return payload[1]


def step_reply_frame(values: Sequence[Any]) -> bytes:
    """The binary ``step`` reply frame of `ChaseGame.step_values`'s values."""
    return _STEP_REPLY.pack(_STEP_REPLY_SIZE, _STEP_REPLY_TAG, *values)


def error_frame(message: str) -> bytes:
    """The ``error`` frame the server sends before it hangs up."""
    return encode({"type": "error", "message": message})


# The clients' side: building requests, reading replies.


def hello_request() -> bytes:
    """The ``hello`` request frame a client opens with."""
    return encode({"type": "hello", "version": PROTOCOL_VERSION})


def reset_request(seed: int | None, options: dict[str, Any] | None) -> bytes:
    """The ``reset`` request frame."""
    seed = None if seed is None else operator.index(seed)
    return encode({"type": "reset", "seed": seed, "options": options})


def step_request(action: SupportsIndex) -> bytes:
    """The binary ``step`` request frame of ``action`` (each one is made once)."""
    return _STEP_FRAMES[action_index(action)]


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
    if game.get("spaces") != SPACES:
        raise ProtocolError(f"server's spaces {game.get('spaces')!r:.80} differ from {SPACES}")
    return game


def hello_result(payload: bytes, where: str) -> dict[str, Any]:
    """The server's game parameters from its ``hello`` reply (from the server at ``where``)."""
    return _check_hello(_reply(payload, "hello", where))


def reset_result(payload: bytes, where: str) -> tuple[Obs, dict[str, Any]]:
    """The observation and info of a ``reset`` reply, checked."""
    reply = _reply(payload, "reset", where)
    values = reply["obs"]
    numbers = all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in values)
    if len(values) != OBS_SIZE or not numbers:
        raise ProtocolError(
            f"malformed observation: expected {OBS_SIZE} numbers, got {values!r:.60}"
        )
    return np.array(values, dtype=np.float32), reply["info"]


def step_result(payload: bytes, where: str) -> StepResult:
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


def closed_error(frames: Framer, where: str) -> ConnectionResetError:
    """The error for a connection the server closed (in the middle of a frame or not)."""
    if frames.pending:
        return _cut_frame(frames.pending, frames.needed)
    return ConnectionResetError(f"game server at {where} closed the connection")
