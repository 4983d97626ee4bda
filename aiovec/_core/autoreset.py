"""Which envs an autoreset concerns, across vector steps (per-vector-env state).

The per-env part of the rule (what one env does within a step) is
`aiovec._core.calls.step_flow`; this module keeps what must be
remembered between steps: which envs ended on their last step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._errors import StateError

__all__ = ("AutoresetState",)


class AutoresetState:
    """Tracks, per env, whether it ended on its last step and was not reset since."""

    __slots__ = ("ended", "mode")

    def __init__(self, mode: AutoresetMode, num_envs: int) -> None:
        self.mode = mode
        self.ended: list[bool] = [False] * num_envs

    def plan(self, indices: Sequence[int] | None = None) -> list[bool]:
        """``reset_first`` for each env about to step (all envs when ``indices`` is None).

        Raises:
            StateError: In ``DISABLED`` mode, when an env that ended would be
                stepped without having been reset.
        """
        ended = self.ended if indices is None else [self.ended[i] for i in indices]
        if self.mode is AutoresetMode.NEXT_STEP:
            return ended
        if self.mode is AutoresetMode.DISABLED and any(ended):
            envs = [i for i, e in zip(indices or range(len(ended)), ended, strict=True) if e]
            raise StateError(
                f"env(s) {envs} ended on their last step and autoreset_mode is DISABLED: "
                "reset them first with reset(options={'reset_mask': mask})"
            )
        return [False] * len(ended)

    def stepped(
        self, indices: Sequence[int] | None, terminations: np.ndarray, truncations: np.ndarray
    ) -> None:
        """Record the envs' episode ends after a step (``SAME_STEP`` already reset them)."""
        if self.mode is AutoresetMode.SAME_STEP:
            return
        ended: list[bool] = (terminations | truncations).tolist()
        if indices is None:
            self.ended = ended
        else:
            for i, e in zip(indices, ended, strict=True):
                self.ended[i] = e

    def was_reset(self, mask: np.ndarray | None) -> None:
        """Record a reset of the masked envs (all when ``mask`` is None)."""
        if mask is None:
            self.ended = [False] * len(self.ended)
        else:
            for i in np.flatnonzero(mask).tolist():
                self.ended[i] = False
