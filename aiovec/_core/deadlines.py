"""Per-env deadlines: ``step_timeout``/``reset_timeout`` count from each env's own start.

Pure: the caller passes the start times and the time now.  An env that waits
for a ``max_concurrency`` slot has not started; its clock starts when it gets
the slot.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ("overdue",)


def overdue(
    starts: Iterable[tuple[int, float | None]], timeout: float, now: float
) -> tuple[list[int], float]:
    """The envs past their deadline, and the seconds until the next deadline at the latest.

    Args:
        starts: ``(env, start)`` for each env in flight; ``start`` is ``None``
            while the env waits for a concurrency slot.
        timeout: Seconds each env may take from its own start.
        now: The time now, on the clock of ``starts``.

    Returns:
        The late envs, and how long to wait before looking again: never more
        than ``timeout``, since an env that starts later is due later than that.
    """
    late: list[int] = []
    wait = timeout
    for i, start in starts:
        if start is None:
            continue
        left = start + timeout - now
        if left <= 0:
            late.append(i)
        elif left < wait:
            wait = left
    return late, wait
