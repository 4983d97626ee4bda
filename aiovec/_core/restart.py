"""``on_error="restart"``: the policy, and the bookkeeping that enforces its limits.

Pure: the caller passes the time in.  The vector env asks `RestartBook`
whether an env may be restarted once more, and asks
`RestartPolicy.wait_before` how long to wait before each attempt to rebuild
and reset it (or whether to give up).

The limit tells a crash loop from a fault rate, as a crash-loop backoff does:
an env restarted ``max_restarts`` times *in a row* (never ``clean_steps``
clean steps between two of its failures) is crash-looping, and its next
failure raises instead; a run of ``clean_steps`` clean steps starts its count
again, so an env that fails now and then and works in between is restarted
as often as it fails.  Each env has its own count.  When several envs fail in
one step and one of them is over its limit, the step raises and restarts none
of them, so none of them should be charged: check every env with
`RestartBook.may_restart` first, then `RestartBook.record` the restarts that
really happen.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiovec._core.calls import Transition
from aiovec._errors import describe_error

__all__ = (
    "CALM_STEPS",
    "FREQUENT",
    "SAY_EVERY",
    "SUMMARY_EVERY",
    "Outage",
    "OutageLog",
    "RestartBook",
    "RestartPolicy",
    "describe_failure",
    "restarted_row",
)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How ``on_error="restart"`` rebuilds a failed env.

    A failed env is closed (best effort), rebuilt from its factory and reset;
    if that fails too (a server that refuses connections, say), it is tried
    again after ``backoff`` seconds, doubling up to ``max_backoff``.  Two
    limits end the retries, whichever is reached first:

    - ``attempts``: at most this many tries in all;
    - ``max_downtime``: no try starts later than this many seconds after the
      failure was seen (the wait before the last try is shortened so that it
      starts exactly then).

    With neither given, ``attempts`` is 3; with ``max_downtime`` alone, the
    env is tried as often as the backoff allows within ``max_downtime``.  The
    last failure is then raised as `aiovec.EnvError`.

    One env is restarted at most ``max_restarts`` times in a row, without a
    run of ``clean_steps`` clean steps between two of its failures: a failure
    that would need one more is taken for a crash loop, and the step raises
    `aiovec.EnvError` instead (naming the env and the limit), so a dead
    server fails loudly.  A run of ``clean_steps`` clean steps starts the
    env's count again: a fleet whose envs fail now and then (a sandbox's
    fault rate) is restarted as often as it fails.  Each env has a count of
    its own; ``reset()`` does not start it again.

    Attributes:
        attempts: Most tries to rebuild and reset a failed env (``None``: 3,
            or no limit of its own when ``max_downtime`` is given).
        backoff: Seconds to wait before the second try.
        max_backoff: Upper bound of the wait between tries.
        max_restarts: Restarts of one env in a row (fewer than
            ``clean_steps`` clean steps between its failures) before its next
            failure raises.
        clean_steps: Clean steps of an env in a row that start its count of
            restarts again.
        max_downtime: Seconds after the failure during which tries may start
            (``None``: no limit of time, only ``attempts``).

    Example:
        A server that may be away for 30 s::

            aiovec.RestartPolicy(max_downtime=30.0, max_backoff=2.0)
    """

    attempts: int | None = None
    backoff: float = 0.1
    max_backoff: float = 5.0
    max_restarts: int = 10
    clean_steps: int = 5
    max_downtime: float | None = None

    def __post_init__(self) -> None:
        for name in ("attempts", "max_restarts", "clean_steps"):
            value = getattr(self, name)
            if value is None and name == "attempts":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RestartPolicy.{name} must be an int >= 1, got {value!r}")
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"RestartPolicy.{name} must be a number >= 0, got {value!r}")
            if math.isnan(value):
                raise ValueError(f"RestartPolicy.{name} must be a number >= 0, got nan")
        value = self.max_downtime
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(
                "RestartPolicy.max_downtime must be None or a finite number of seconds > 0, "
                f"got {value!r}"
            )

    @property
    def max_attempts(self) -> float:
        """The limit of tries that applies (``math.inf``: only ``max_downtime`` limits them)."""
        if self.attempts is not None:
            return self.attempts
        return 3 if self.max_downtime is None else math.inf

    def wait_before(self, tried: int, elapsed: float) -> float | None:
        """Seconds to wait before the next try, or ``None`` to give up.

        Args:
            tried: Tries made so far (0 before the first, which starts at once).
            elapsed: Seconds since the failure was seen.
        """
        if tried == 0:
            return 0.0
        if tried >= self.max_attempts:
            return None
        wait = min(self.backoff * 2.0 ** (tried - 1), self.max_backoff)
        if self.max_downtime is None:
            return wait
        left = self.max_downtime - elapsed
        return None if left <= 0 else min(wait, left)


class RestartBook:
    """How many times each env was restarted in a row, and its clean steps since.

    Only envs restarted lately have entries (a per-env structure would cost
    memory at 100,000 envs): an env leaves the book once ``clean_steps``
    clean steps in a row have started its count again.
    """

    def __init__(self, policy: RestartPolicy, num_envs: int) -> None:
        del num_envs  # envs 0..num_envs-1 get their entry when restarted
        self.policy = policy
        self._in_a_row: dict[int, int] = {}
        self._clean: dict[int, int] = {}  # clean steps since its last restart

    @property
    def watching(self) -> bool:
        """Whether some env's clean steps are counted (it was restarted lately)."""
        return bool(self._clean)

    def may_restart(self, i: int) -> bool:
        """Whether env ``i`` may be restarted once more (nothing is recorded)."""
        return self._in_a_row.get(i, 0) < self.policy.max_restarts

    def in_a_row(self, i: int) -> int:
        """Env ``i``'s restarts in a row so far."""
        return self._in_a_row.get(i, 0)

    def record(self, indices: Iterable[int]) -> None:
        """Charge a restart to each env of ``indices``."""
        in_a_row, clean = self._in_a_row, self._clean
        for i in indices:
            in_a_row[i] = in_a_row.get(i, 0) + 1
            clean[i] = 0

    def stepped(self, clean_envs: Container[int]) -> None:
        """A step (or ``recv``) in which the envs of ``clean_envs`` stepped cleanly."""
        clean, enough = self._clean, self.policy.clean_steps
        for i in [i for i in clean if i in clean_envs]:
            clean[i] += 1
            if clean[i] >= enough:  # a run of clean steps: its count starts again
                del clean[i], self._in_a_row[i]


SAY_EVERY = 10.0
"""While an outage lasts, at most one line says how it goes every this many seconds."""

CALM_STEPS = 2
"""An outage is over after this many steps in a row in which no env failed.

Two, because under ``NEXT_STEP`` a restarted env's next step is its autoreset,
which proves nothing about the env's steps."""


@dataclass(slots=True)
class Outage:
    """One outage of a vector env: from a step's failures to `CALM_STEPS` steps without any.

    Its start and its end are said, one line each, with the counts kept here
    (failures by exception type, restarts); while it lasts, at most one line
    every `SAY_EVERY` seconds (`due`).  Times are the caller's clock.

    The same counts serve an `OutageLog`'s summary of many outages (``outages``).

    Attributes:
        since: When its first failure was seen.
        said: When a line about it was said last.
        envs: Every env that failed during it.
        causes: How many failures of each exception type.
        restarts: Rebuilds tried (each env counts once per try).
        back: When its last restart succeeded (``None``: none yet).
        calm: Steps in a row, since its last failure, in which no env failed.
        own: Its start and end are said in lines of their own (else an
            `OutageLog` counts it in a summary).
        outages: How many outages the counts cover (a summary's: 0 or more).
    """

    since: float
    said: float
    envs: set[int] = field(default_factory=set)
    causes: collections.Counter[str] = field(default_factory=collections.Counter)
    restarts: int = 0
    back: float | None = None
    calm: int = 0
    own: bool = True
    outages: int = 1

    def failed(self, errors: Iterable[tuple[int, BaseException]]) -> None:
        """Count the failures of a step: env index and exception."""
        self.calm = 0
        for i, error in errors:
            self.envs.add(i)
            self.causes[type(error).__name__] += 1

    def calmed(self) -> bool:
        """A step in which no env failed; whether the outage is over now."""
        self.calm += 1
        return self.calm >= CALM_STEPS

    def due(self, now: float) -> bool:
        """Whether a line may be said at ``now``; if so, it counts as said."""
        if now - self.said < SAY_EVERY:
            return False
        self.said = now
        return True

    def counts(self) -> str:
        """``15 restarts; 3 failures: ConnectionResetError x3``."""
        causes = ", ".join(f"{kind} x{count}" for kind, count in self.causes.most_common())
        failures = self.causes.total()
        return f"{self.restarts} restarts; {failures} failures: {causes}"

    def add(self, other: Outage) -> None:
        """Count ``other``'s envs, failures, restarts and outages in these counts."""
        self.envs |= other.envs
        self.causes.update(other.causes)
        self.restarts += other.restarts
        self.outages += other.outages


FREQUENT = 3
"""More outages than this starting within `SUMMARY_EVERY` seconds are said together."""

SUMMARY_EVERY = 60.0
"""While outages are frequent, one line every this many seconds sums them up."""


@dataclass(slots=True)
class OutageLog:
    """Which lines a vector env's outages get: each its own, or a summary while frequent.

    An outage says its start and its end, one line each, until more than
    `FREQUENT` outages start within `SUMMARY_EVERY` seconds (a fault rate
    of a fleet of envs, say: two lines per fault would bury the log).  From
    then on an outage is *summed*: its start and end say nothing, its counts
    go into ``tally``, and one line every `SUMMARY_EVERY` seconds says the
    tally (outages, envs, restarts, failures by cause), at the end of an
    outage (`ended`).  An outage that starts with `FREQUENT` or fewer
    within the window behind it (itself included) says its own lines again,
    after the last tally.  What an outage says while it lasts (`Outage.due`)
    and giving up are said either way.  Times are the caller's clock.

    Attributes:
        starts: When the outages of the last `SUMMARY_EVERY` seconds started.
        tally: While outages are summed, the counts not yet said (else ``None``).
    """

    starts: collections.deque[float] = field(default_factory=collections.deque)
    tally: Outage | None = None

    def start(self, now: float) -> tuple[Outage, bool, Outage | None]:
        """An outage starts at ``now``.

        Returns:
            The outage (its ``own`` says whether its end is said); whether its
            start is said (its own, or the first summed one, which says that
            summing starts); the tally to say before it (summing ends), if any.
        """
        starts = self.starts
        starts.append(now)
        while starts[0] <= now - SUMMARY_EVERY:
            starts.popleft()
        frequent = len(starts) > FREQUENT
        outage = Outage(since=now, said=now, own=not frequent)
        if not frequent:
            last, self.tally = self.tally, None
            return outage, True, last
        if self.tally is None:
            self.tally = Outage(since=now, said=now, outages=0)
            return outage, True, None
        return outage, False, None

    def ended(self, outage: Outage, now: float) -> Outage | None:
        """``outage`` ended at ``now``: the tally to say now, if its line is due."""
        tally = self.tally
        if outage.own or tally is None:
            return None
        tally.add(outage)
        if now - tally.since < SUMMARY_EVERY:
            return None
        self.tally = Outage(since=now, said=now, outages=0)
        return tally


def describe_failure(error: BaseException, operation: str) -> str:
    """The text a restarted env's ``infos["error"]`` carries."""
    return f"{describe_error(error)} (in {operation}; the env was rebuilt and reset)"


def restarted_row(reset_result: tuple[Any, dict[str, Any]], message: str) -> Transition:
    """A restarted env's row: its reset observation, reward 0, truncated, the error in info."""
    obs, info = reset_result
    return obs, 0.0, False, True, {**info, "error": message}, None
