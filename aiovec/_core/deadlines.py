"""Per-env deadlines: ``step_timeout``/``reset_timeout`` count from each env's own start.

Pure: the caller passes the start times and the time now.  An env that waits
for a ``max_concurrency`` slot has not started; its clock starts when it gets
the slot.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ("overdue",)


def overdue(
    starts: Iterable[tuple[int, float | None, float | None]], now: float
) -> tuple[list[int], float | None]:
    """The envs past their deadline, and the seconds until the next deadline at the latest.

    Args:
        starts: ``(env, start, timeout)`` for each env in flight: ``start`` is
            ``None`` while the env waits for a concurrency slot; ``timeout`` is
            the seconds it may take from its own start (``None``: no limit).
        now: The time now, on the clock of ``starts``.

    Returns:
        The late envs, and how long to wait before looking again: never more
        than an env's timeout, since an env that starts later is due later
        than that (``None``: no env has a deadline).
    """
    late: list[int] = []
    wait: float | None = None
    for i, start, timeout in starts:
        if timeout is None:
            continue
        if start is None:
            left = timeout
        else:
            left = start + timeout - now
            if left <= 0:
                late.append(i)
                continue
        if wait is None or left < wait:
            wait = left
    return late, wait
