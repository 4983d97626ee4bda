"""A loopback game server and the client envs that play on it.

This package is a real *network env* for tests, examples and benchmarks: the
game runs in a server, and each env is a client paying one round trip per
``reset``/``step``, like an env that talks to a remote simulator.  One idea
per module, the first three pure (no sockets, no event loop):

- ``game``: `ChaseGame`, a runner chasing a wandering target on a grid, and
  `LocalGameEnv`, the game as a plain ``gymnasium.Env`` (the oracle).
- ``protocol``: the wire format, with its one framer (`Framer`) and the
  functions each side builds and reads messages with; `ProtocolError`.
- ``session``: one connection's game on the server (request in, reply out).
- ``server``: `GameServer`, an ``asyncio.Protocol`` per connection on
  127.0.0.1, replies delayed by ``latency`` on one timer.
- ``thread``: `ServerThread`, the server on a thread of its own.
- ``clients``: `GameClientEnv` (an `aiovec.AsyncEnv`) and
  `BlockingGameClientEnv` (a ``gymnasium.Env`` over a blocking socket).

Only loopback addresses are ever used: the server binds 127.0.0.1, and the
clients refuse any host that is not a loopback IP literal.

Example:
    >>> async with GameServer(latency=0.01) as server:  # doctest: +SKIP
    ...     fns = [lambda: GameClientEnv(port=server.port)] * 64
    ...     async with aiovec.AsyncioVectorEnv(fns) as venv:
    ...         obs, infos = await venv.reset(seed=0)  # one round trip, not 64
"""

from __future__ import annotations

from aiovec.gameserver.clients import BlockingGameClientEnv, GameClientEnv
from aiovec.gameserver.game import ChaseGame, LocalGameEnv, game_spaces
from aiovec.gameserver.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    LOOPBACK,
    PROTOCOL_VERSION,
    ProtocolError,
)
from aiovec.gameserver.server import GameServer, ServerStats
from aiovec.gameserver.thread import ServerThread

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
