"""A connection's game on the server: request payload in, reply frame out (pure, no I/O)."""

from __future__ import annotations

import numpy as np
from gymnasium.utils import seeding

from aiovec.gameserver.game import SPACES, ChaseGame
from aiovec.gameserver.protocol import (
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode_request,
    encode,
    is_step_request,
    step_action,
    step_reply_frame,
)

__all__ = ("Session",)


class Session:
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
        if is_step_request(payload):
            return "step", self._step(payload)
        request = decode_request(payload)
        kind = request["type"]
        if self.greeted == (kind == "hello"):
            raise ProtocolError(f"'hello' must come first and once, got {kind!r}")
        handler = self._hello if kind == "hello" else self._reset
        return kind, encode(handler(request))

    def _hello(self, request: Message) -> Message:
        if request["version"] != PROTOCOL_VERSION:
            raise ProtocolError(
                f"unsupported protocol version {request['version']} "
                f"(this server speaks {PROTOCOL_VERSION})"
            )
        self.greeted = True
        game = {"size": self.game.size, "max_steps": self.game.max_steps, "spaces": SPACES}
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
        action = step_action(payload)
        if not self.greeted:
            raise ProtocolError("'hello' must come first and once, got 'step'")
        if self.rng is None:
            raise ProtocolError("'step' before the first 'reset'")
        try:
            values = self.game.step_values(action)
        except ValueError as exc:
            raise ProtocolError(f"bad 'step' message: {exc}") from None
        return step_reply_frame(values)
