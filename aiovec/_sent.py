"""The envs in flight from ``send()`` (or ``reset_async()``), and outcomes held for them.

Plain bookkeeping, no I/O: which envs were sent and not yet received, when
each was sent (its deadline never starts earlier), the mask and the lost envs
of a sent reset, and the outcomes of sent envs that came while a restart
collected only its own envs.  A restart amid sent envs (`recv` restarting a
failed env) collects its own resets and `keep`s every other outcome; `recv`
then `take_held` s them, so nothing that came is lost or seen twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from aiovec.backends._base import Outcomes

__all__ = ("Sent",)


class Sent:
    """Envs in flight from ``send()``, when each was sent, and outcomes held for ``recv()``.

    Args:
        num_envs: How many envs the vector env has.
    """

    __slots__ = ("at", "envs", "held", "reset_mask", "resets", "unbuilt")

    def __init__(self, num_envs: int) -> None:
        self.envs: set[int] = set()
        """Envs sent and not yet received."""
        self.at = [0.0] * num_envs
        """When each env was last sent (``time.perf_counter``)."""
        self.held: Outcomes = ({}, {})
        """Outcomes of sent envs that came while a restart waited for its own envs."""
        self.resets: set[int] = set()
        """The envs sent whose call is a reset (an autoreset, a collector's): their deadline
        is ``reset_timeout``."""
        self.reset_mask: np.ndarray | None = None
        """The ``reset_mask`` of the reset in flight (``RESET_SENT``)."""
        self.unbuilt: dict[int, BaseException] = {}
        """The lost envs that reset in flight could not rebuild, and why."""

    def start(self, ids: Sequence[int], now: float, resets: Sequence[int] = ()) -> None:
        """``ids`` are sent at ``now``; those of ``resets`` reset (instead of stepping)."""
        self.envs.update(ids)
        at = self.at
        for i in ids:
            at[i] = now
        if resets or self.resets:
            self.resets.difference_update(ids)
            self.resets.update(resets)

    def done(
        self, results: Iterable[int], errors: dict[int, BaseException], *, reset: bool = False
    ) -> None:
        """The envs of ``results`` and ``errors`` are received (their outcomes handed over).

        A sent ``reset`` adds to ``errors`` why the lost envs it could not
        rebuild are still lost (`unbuilt`).
        """
        if reset:
            errors.update(self.unbuilt)
        envs = self.envs
        envs.difference_update(results)
        envs.difference_update(errors)

    def clear(self) -> None:
        """Nothing is in flight any more (cancelled, drained or abandoned); nothing held."""
        self.envs.clear()
        self.resets.clear()
        self.held = ({}, {})

    def keep(self, outcomes: Outcomes, own: set[int] | None) -> Outcomes:
        """``outcomes`` of the envs ``own`` (all when ``None``); hold the others' for `recv`."""
        if own is None:
            return outcomes
        held_results, held_errors = self.held
        results, errors = outcomes
        for i in [i for i in results if i not in own]:
            held_results[i] = results.pop(i)
        for i in [i for i in errors if i not in own]:
            held_errors[i] = errors.pop(i)
        return results, errors

    def take_held(self, outcomes: Outcomes) -> Outcomes:
        """``outcomes`` with the held ones added (they came first); nothing is held after."""
        held_results, held_errors = self.held
        if not held_results and not held_errors:
            return outcomes
        self.held = ({}, {})
        results, errors = outcomes
        results.update(held_results)
        errors.update(held_errors)
        return results, errors
