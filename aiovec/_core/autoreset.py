"""Which envs an autoreset concerns, across vector steps (per-vector-env state).

The per-env part of the rule (what one env does within a step) is
`aiovec._core.calls.step_flow`; this module keeps what must be
remembered between steps: which envs ended on their last step, and, with a
reset-options hook, each env's episode count and its next episode's options.

The hook, ``reset_options(env_id, episode) -> dict | None``, is asked once
per episode of each env (``episode`` counts from 0, the first reset), no
later than the call that may reset the env is sent: at ``reset()``, at a
restart's reset, at the
``NEXT_STEP`` step that autoresets the env, and, under ``SAME_STEP``, at the
first step of the episode before (the env resets inside a step, maybe in a
worker, so its options travel with every step until it ends).  An episode's
answer is kept until that episode starts, so a stateful curriculum is asked
once whatever fails or is retried.  With ``reset(options=...)``, the hook's
options come first and the explicit ones override them key by key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._core.calls import Autoreset, Reset
from aiovec._errors import StateError

__all__ = ("AutoresetState", "ResetHook")

# An enum member read off its class costs 0.1-0.2 us on Python 3.11 (``EnumType``
# has a ``__getattr__``, which keeps every read of a class attribute off CPython's
# fast path): what runs on every step reads module names instead.
_NEXT_STEP, _SAME_STEP, _DISABLED = (
    AutoresetMode.NEXT_STEP,
    AutoresetMode.SAME_STEP,
    AutoresetMode.DISABLED,
)

ResetHook = Callable[[int, int], dict[str, Any] | None]
"""``reset_options(env_id, episode) -> dict | None``: the options of an env's episode."""


class AutoresetState:
    """Tracks, per env, whether it ended on its last step and was not reset since."""

    __slots__ = ("_asked", "ended", "episodes", "hook", "mode")

    def __init__(self, mode: AutoresetMode, num_envs: int, hook: ResetHook | None = None) -> None:
        self.mode = mode
        self.ended: list[bool] = [False] * num_envs
        self.hook = hook
        self.episodes = [0] * num_envs  # resets done with the hook set, per env
        self._asked: dict[int, dict[str, Any] | None] = {}  # each env's next episode's options

    def plan(self, indices: Sequence[int] | None = None) -> list[Any]:
        """``reset_first`` for each env about to step (all envs when ``indices`` is None).

        An entry is a bool, or an `Autoreset` where the hook gave the
        autoreset this step may make options.

        Raises:
            StateError: In ``DISABLED`` mode, when an env that ended would be
                stepped without having been reset.
            TypeError: The hook returned something other than a dict or None.
        """
        ended = self.ended if indices is None else [self.ended[i] for i in indices]
        if self.mode is _NEXT_STEP:
            return (
                ended if self.hook is None or not any(ended) else self._with_options(indices, ended)
            )
        if self.mode is _DISABLED and any(ended):
            envs = [i for i, e in zip(indices or range(len(ended)), ended, strict=True) if e]
            raise StateError(
                f"env(s) {envs} ended on their last step and autoreset_mode is DISABLED: "
                "reset them first with reset(options={'reset_mask': mask})"
            )
        flags = [False] * len(ended)
        if self.hook is None or self.mode is _DISABLED:
            return flags
        return self._with_options(indices, [True] * len(ended), now=False)

    def _with_options(
        self, indices: Sequence[int] | None, due: list[bool], *, now: bool = True
    ) -> list[Any]:
        """``due`` flags, each due env's one an `Autoreset` where its next episode has options."""
        plan: list[Any] = [False] * len(due) if not now else list(due)
        for k, i in enumerate(range(len(due)) if indices is None else indices):
            if due[k] and (options := self.options(i)) is not None:
                plan[k] = Autoreset(Reset(options=options), now)
        return plan

    def options(self, i: int) -> dict[str, Any] | None:
        """The hook's options for env ``i``'s next episode (asked once per episode)."""
        if i not in self._asked:
            assert self.hook is not None
            episode = self.episodes[i]
            self._asked[i] = _checked(self.hook(i, episode), i, episode)
        return self._asked[i]

    def reset_options(self, i: int, explicit: dict[str, Any] | None) -> dict[str, Any] | None:
        """Env ``i``'s options at a ``reset()``: the hook's, overridden by ``explicit``.

        A reset that gives no options of its own (none, or only a
        ``reset_mask``) resets with the hook's answer, ``None`` included.
        """
        if self.hook is None:
            return explicit
        options = self.options(i)
        if not explicit:
            return options
        return explicit if options is None else {**options, **explicit}

    def stepped(
        self, indices: Sequence[int] | None, terminations: np.ndarray, truncations: np.ndarray
    ) -> None:
        """Record the envs' episode ends after a step (``SAME_STEP`` already reset them)."""
        same_step = self.mode is _SAME_STEP
        if self.hook is not None:  # the envs reset in this step started an episode
            reset = (terminations | truncations).tolist() if same_step else self.plan_was(indices)
            self._started(indices, reset)
        if same_step:
            return
        ended: list[bool] = (terminations | truncations).tolist()
        if indices is None:
            self.ended = ended
        else:
            for i, e in zip(indices, ended, strict=True):
                self.ended[i] = e

    def plan_was(self, indices: Sequence[int] | None) -> list[bool]:
        """Which of the envs were due to reset at the step just done (before `stepped`)."""
        return list(self.ended) if indices is None else [self.ended[i] for i in indices]

    def was_reset(self, mask: np.ndarray | None) -> None:
        """Record a reset of the masked envs (all when ``mask`` is None)."""
        indices = range(len(self.ended)) if mask is None else np.flatnonzero(mask).tolist()
        if self.hook is not None:
            self._started(indices, [True] * len(indices))
        if mask is None:
            self.ended = [False] * len(self.ended)
        else:
            for i in indices:
                self.ended[i] = False

    def _started(self, indices: Sequence[int] | None, reset: list[bool]) -> None:
        """A new episode started for the envs whose ``reset`` entry is true."""
        for k, i in enumerate(range(len(reset)) if indices is None else indices):
            if reset[k]:
                self.episodes[i] += 1
                self._asked.pop(i, None)


def _checked(options: object, i: int, episode: int) -> dict[str, Any] | None:
    """The hook's answer, if it is a dict (or None)."""
    if options is None or isinstance(options, dict):
        return options
    raise TypeError(
        f"reset_options(env_id={i}, episode={episode}) must return a dict or None, "
        f"got {type(options).__name__}: {options!r:.80}"
    )
