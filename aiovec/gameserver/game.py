"""The game: `ChaseGame`'s rules and `LocalGameEnv`, the game as a plain env (pure, no I/O).

A runner chases a wandering target on a grid.  Everything random comes from the
generator handed to ``reset``, so the same seed and actions replay the same
episodes anywhere: `LocalGameEnv` is the oracle that remote envs are checked
against.
"""

from __future__ import annotations

import operator
from typing import Any, Final, SupportsIndex

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from numpy.typing import NDArray

__all__ = (
    "CATCH_REWARD",
    "MOVES",
    "OBS_SIZE",
    "SPACES",
    "STEP_REWARD",
    "ChaseGame",
    "LocalGameEnv",
    "Obs",
    "StepResult",
    "action_index",
    "game_spaces",
)

Obs = NDArray[np.float32]
StepResult = tuple[Obs, float, bool, bool, dict[str, Any]]

MOVES: Final = ((0, 0), (0, 1), (0, -1), (-1, 0), (1, 0))
"""The moves, by action: stay, up, down, left, right."""
OBS_SIZE: Final = 4
SPACES: Final = {
    "observation": {"low": 0.0, "high": 1.0, "shape": [OBS_SIZE], "dtype": "float32"},
    "action": {"n": len(MOVES)},
}
"""The spaces as the server describes them in its ``hello`` reply."""
_MOVE_BATCH: Final = 64
CATCH_REWARD: Final = 1.0
STEP_REWARD: Final = -0.01


def game_spaces() -> tuple[spaces.Space[Obs], spaces.Discrete]:
    """Fresh copies of the game's spaces (the same for every grid size).

    Returns:
        ``Box(0, 1, (4,), float32)`` observations and ``Discrete(5)`` actions.
    """
    box: spaces.Space[Any] = spaces.Box(0.0, 1.0, (OBS_SIZE,), np.float32)
    return box, spaces.Discrete(len(MOVES))


def action_index(action: SupportsIndex) -> int:
    """``action`` as a valid move index (accepts ``int`` and numpy integers)."""
    index = operator.index(action)
    if not 0 <= index < len(MOVES):
        raise ValueError(f"action must be in [0, {len(MOVES)}), got {index}")
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
        self.runner = self._moved(self.runner, action_index(action))
        caught = self.runner == self.target
        if not caught:
            if not self._moves:  # one generator call per _MOVE_BATCH moves, not per move
                self._moves = self._rng.integers(len(MOVES), size=_MOVE_BATCH).tolist()[::-1]
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
        (x, y), (dx, dy), last = position, MOVES[move], self.size - 1
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
