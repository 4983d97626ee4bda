"""The messages of ``aiovec serve`` and how step data is laid out in them (pure: no I/O).

A *frame* is one binary WebSocket message: a msgpack array of messages, every
message of one loop turn in one frame.  Each message is a msgpack array whose
first item names its kind (msgspec's tagged ``array_like`` structs); the
fields follow in the order written below.  docs/serve.md is the description
a client in another language is built from; this module is the definition.

A *group* is the sessions of one client vector env (its envs, in order); a
*request* (``rid``: the group's call number, from 1, never reused) names some
of them by index (``envs``: little-endian ``uint32`` bytes) and is answered
once (``StepPart`` may come in parts, the last with ``done``), whatever the
connection goes through: the server keeps each answer until the client's
next request on the same envs, and answers a request it has seen with what it
has.  Step data are raw bytes: observations laid out as
`aiovec._core.layout.Layout` lays out a batch of the reply's envs (each leaf's
rows C-contiguous, starting on a 64-byte boundary), rewards ``float64``,
flags ``bool``, actions likewise by the action space.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from gymnasium import spaces

from aiovec._core.layout import Layout
from aiovec._serve.codec import ext_hook

__all__ = (
    "PROTOCOL",
    "BusyMsg",
    "CallMsg",
    "CallReplyMsg",
    "CancelMsg",
    "ClientMessage",
    "CloseMsg",
    "FailedMsg",
    "GoneMsg",
    "HelloMsg",
    "Layouts",
    "OpenMsg",
    "OpenedMsg",
    "PingMsg",
    "PongMsg",
    "RebuildMsg",
    "ServerMessage",
    "StepMsg",
    "StepPart",
    "WelcomeMsg",
    "decode_client",
    "decode_server",
    "encode",
    "envs_bytes",
    "envs_of",
)

PROTOCOL = 1
"""The protocol's version: a server refuses a client of another."""


class _Msg(msgspec.Struct, array_like=True, tag_field="kind", omit_defaults=False):
    pass


# --------------------------------------------------------------------------- client -> server


class HelloMsg(_Msg, tag="hello"):
    """The first message of a connection; ``resume`` lists ``[group, token]`` to take back."""

    version: int
    resume: list[tuple[int, str]] = []


class OpenMsg(_Msg, tag="open"):
    """Open ``count`` sessions as group ``group``; ``kwargs[k]``: session k's factory keywords."""

    rid: int
    group: int
    count: int
    kwargs: list[Any]


class StepMsg(_Msg, tag="step"):
    """Step ``envs`` (one request; docs/serve.md says what each field holds).

    ``resets`` (a bool per env: reset instead of stepping, NEXT_STEP),
    ``autoresets`` (``{k: [now, seed, options]}``: the k-th env's autoreset is that reset),
    the actions as ``actions`` (raw, laid out) or ``action_values`` (one value per env);
    ``stream``: answer as envs finish; ``deadline``: seconds the server may take.
    """

    rid: int
    group: int
    envs: bytes
    mode: str
    resets: bytes
    autoresets: dict[int, Any]
    actions: bytes | None
    action_values: list[Any] | None
    stream: bool
    timed: bool
    deadline: float | None


class CallMsg(_Msg, tag="call"):
    """One call per env of ``envs`` (``calls[k]``: ``[kind, ...]``, see `aiovec._serve.server`)."""

    rid: int
    group: int
    envs: bytes
    name: str
    calls: list[Any]
    deadline: float | None


class CancelMsg(_Msg, tag="cancel"):
    """Stop ``envs``' part of request ``rid`` (its answer for them is dropped by the client)."""

    group: int
    rid: int
    envs: bytes


class RebuildMsg(_Msg, tag="rebuild"):
    """Close and rebuild ``envs`` from the factory (answered by a `CallReply`)."""

    rid: int
    group: int
    envs: bytes


class CloseMsg(_Msg, tag="close"):
    """Close every session of the group (answered by a `CallReply` of close errors)."""

    rid: int
    group: int


class PingMsg(_Msg, tag="ping"):
    """A heartbeat; answered by a `Pong` with the same ``at``."""

    at: float


ClientMessage = HelloMsg | OpenMsg | StepMsg | CallMsg | CancelMsg | RebuildMsg | CloseMsg | PingMsg


# --------------------------------------------------------------------------- server -> client


class WelcomeMsg(_Msg, tag="welcome"):
    """The answer to `Hello`: limits, and for each group asked to resume ``""`` or why not."""

    version: int
    window: int
    max_frame: int
    max_sessions: int
    heartbeat: float
    resume_window: float
    resumed: dict[int, str]


class OpenedMsg(_Msg, tag="opened"):
    """Group ``group`` is open: its resume ``token`` and its envs' traits.

    ``observation_spaces``/``action_spaces`` hold only the envs whose space is not
    the first one's (``{k: space}``).
    """

    rid: int
    group: int
    token: str
    observation_space: Any
    action_space: Any
    observation_spaces: dict[int, Any]
    action_spaces: dict[int, Any]
    metadata: Any
    render_mode: str | None


class StepPart(_Msg, tag="part"):
    """Results of some envs of a step.

    ``envs`` (rows), laid out in ``obs``/``rewards``/...,
    ``infos``/``finals`` by env index (only those not empty), ``singles`` (whole transitions
    as values: what the rows cannot hold) and ``errors`` (error data) by env index.
    """

    rid: int
    group: int
    done: bool
    envs: bytes
    obs: bytes
    rewards: bytes
    terminations: bytes
    truncations: bytes
    infos: dict[int, Any]
    finals: dict[int, Any]
    singles: dict[int, Any]
    errors: dict[int, Any]


class CallReplyMsg(_Msg, tag="reply"):
    """Results (values) and errors (error data) by env index of a call, rebuild or close."""

    rid: int
    group: int
    values: dict[int, Any]
    errors: dict[int, Any]


class FailedMsg(_Msg, tag="failed"):
    """Request ``rid`` (``0``: the frame) was refused as a whole; ``error`` says why."""

    rid: int
    group: int
    error: Any


class BusyMsg(_Msg, tag="busy"):
    """Request ``rid`` was not taken (the connection's window is full): send it again later."""

    rid: int
    group: int


class PongMsg(_Msg, tag="pong"):
    """The answer to a `Ping`."""

    at: float


class GoneMsg(_Msg, tag="gone"):
    """The server closed group ``group``'s sessions; ``reason`` says why."""

    group: int
    reason: str


ServerMessage = (
    WelcomeMsg | OpenedMsg | StepPart | CallReplyMsg | FailedMsg | BusyMsg | PongMsg | GoneMsg
)

_ENCODER = msgspec.msgpack.Encoder()
_CLIENT = msgspec.msgpack.Decoder(list[ClientMessage], ext_hook=ext_hook())
_SERVER = msgspec.msgpack.Decoder(list[ServerMessage], ext_hook=ext_hook())


def encode(messages: list[Any]) -> bytes:
    """One frame of ``messages``."""
    return _ENCODER.encode(messages)


def decode_client(frame: bytes) -> list[ClientMessage]:
    """The messages of a client's frame.

    Raises:
        ValueError: The frame is not a list of well-formed client messages.
    """
    try:
        return _CLIENT.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
        raise ValueError(f"a malformed frame: {exc}") from exc


def decode_server(frame: bytes) -> list[ServerMessage]:
    """The messages of a server's frame.

    Raises:
        ValueError: The frame is not a list of well-formed server messages.
    """
    try:
        return _SERVER.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
        raise ValueError(f"a malformed frame: {exc}") from exc


_ENVS = np.dtype("<u4")


def envs_bytes(envs: Any) -> bytes:
    """Env indices as the wire holds them (little-endian ``uint32``)."""
    if type(envs) is range and envs.start == 0 and envs.step == 1:
        return _every(envs.stop)
    return np.asarray(envs, dtype=_ENVS).tobytes()


@functools.lru_cache(maxsize=64)
def _every(count: int) -> bytes:
    """Envs ``0..count-1``, as the wire holds them (made once per count)."""
    return np.arange(count, dtype=_ENVS).tobytes()


def envs_of(data: bytes, limit: int) -> Sequence[int]:
    """Env indices from the wire, each below ``limit`` and each once (``range``: all, in order).

    Raises:
        ValueError: Not a whole number of indices, an index out of range, or twice.
    """
    if len(data) == 4 * limit and data == envs_bytes(range(limit)):
        return range(limit)  # the whole group, in order: the usual step
    if len(data) % 4:
        raise ValueError("envs: not a whole number of uint32 indices")
    envs = np.frombuffer(data, _ENVS)
    if len(envs) and int(envs.max()) >= limit:
        raise ValueError(f"envs: index {int(envs.max())} out of range (the group has {limit})")
    listed: list[int] = envs.tolist()
    if len(set(listed)) != len(listed):
        raise ValueError("envs: an index named twice")
    return listed


class Layouts:
    """The layouts of batches of one space, by count (made once each)."""

    __slots__ = ("_made", "space")

    def __init__(self, space: spaces.Space[Any]) -> None:
        self.space = space
        self._made: dict[int, Layout | None] = {}

    def __call__(self, count: int) -> Layout | None:
        """The layout of ``count`` values (``None``: values travel one by one)."""
        try:
            return self._made[count]
        except KeyError:
            layout = self._made[count] = Layout.of(self.space, count)
            return layout
