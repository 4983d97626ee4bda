"""Whole episodes in groups: what `aiovec.EpisodeCollector` records and schedules.

Two pure parts, told what happens by the collector's driver:

- `EpisodeBook` records each env's episode as it runs, as `SegmentBook` does
  for segments (``observed``, ``acted``, ``stepped``), and turns an episode
  that ended into an `Episode`;
- `Groups` schedules: each task (a reset options dict) becomes a group of
  ``group_size`` members, all reset with the group's one seed; members go to
  free envs, oldest group first; a group that finished is filtered
  (``accept``), queued, and taken in batches; ``on_error`` decides what a
  failed member means; ``max_lag`` admits no group that could not be in a
  batch within that many versions.  A group set aside (rejected, dropped by
  ``max_lag``, failed under ``on_error="drop"``) becomes a `DiscardedGroup`,
  handed to the user with the next batch.  Its state (`Groups.state_dict`) is
  the task cursor, the tasks handed out but not yet handed back (in a batch's
  groups or its discarded), and how many episodes were started.
"""

from __future__ import annotations

import builtins
import collections
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from aiovec._core import validate
from aiovec._core.segments import Book, tree_map
from aiovec._errors import EnvError, EnvTimeoutError

__all__ = (
    "ON_ERROR",
    "DiscardedGroup",
    "Episode",
    "EpisodeBatch",
    "EpisodeBook",
    "Groups",
    "rewards_differ",
)

ON_ERROR = ("raise", "retry", "drop", "keep")
"""What a failed member (status ``"error"`` or ``"timeout"``) means to its group."""


@dataclass(frozen=True, slots=True, eq=False)
class Episode:
    """One env's episode, from its reset to its end, never cut.

    Arrays have one row per step (``T`` steps); observations and actions of a
    Dict/Tuple space are nested dicts/tuples of such arrays.

    Attributes:
        env_id: The env that ran it.
        episode_id: Its number among the episodes the collector started.
        group_id: Its group's number: the index of the group's task.
        index: Its place in the group (``0 .. group_size - 1``).
        task: The reset options it ran with (``None`` without tasks).
        seed: The seed of its reset: the group's one seed.
        obs: ``(T, ...)``: the observation each action was chosen for.
        actions: ``(T, ...)``: the actions taken.
        rewards: ``(T,)`` ``float64``.
        final_obs: The observation the last step gave (one, not batched).
        terminated: Whether the last step terminated the episode.
        truncated: Whether it was truncated (a failed env's is, too).
        status: ``"ok"``; ``"error"`` or ``"timeout"`` where the env failed
            and was restarted (its last step is then not the env's own:
            never read it as an honest outcome).
        versions: ``(T,)``: the policy version that chose each action.
        extras: The policy's extras by name, ``(T, ...)`` each.
        infos: The info dict of each step (``T`` of them).
        start_time: When its reset was sent (``time.perf_counter()``).
        end_time: When its last step came back.
    """

    env_id: int
    episode_id: int
    group_id: int
    index: int
    task: dict[str, Any] | None
    seed: int
    obs: Any
    actions: Any
    rewards: np.ndarray
    final_obs: Any
    terminated: bool
    truncated: bool
    status: str
    versions: np.ndarray
    extras: dict[str, np.ndarray]
    infos: list[dict[str, Any]]
    start_time: float
    end_time: float

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass(frozen=True, slots=True, eq=False)
class DiscardedGroup:
    """A group the `aiovec.EpisodeCollector` set aside instead of yielding it.

    Handed over in the next batch's `EpisodeBatch.discarded`, so that a
    trainer sees what each task came to (a curriculum that tracks pass rates,
    a task to try again later) without working it out by elimination.

    Attributes:
        reason: ``"rejected"``: ``accept_group`` returned false;
            ``"dropped"``: ``max_lag``: it held actions older than that when
            it finished; ``"failed"``: ``on_error="drop"``: a member's env
            failed.
        group_id: Its number: the index of its task.
        task: Its task (the reset options; ``None`` without tasks).
        seed: The seed its members were reset with.
        episodes: Its members that ended, in member order: every member of
            a rejected or dropped group; of a failed group, the failed member
            (its ``status`` says how) and those that ended besides it (its
            members that had not started are missing).
    """

    reason: str
    group_id: int
    task: dict[str, Any] | None
    seed: int
    episodes: list[Episode]


@dataclass(frozen=True, slots=True)
class EpisodeBatch:
    """``batch_size`` groups of ``group_size`` episodes, in the order the groups finished.

    Attributes:
        groups: The groups; ``groups[g][k]`` is member ``k`` of group ``g``.
        discarded: The groups set aside (rejected, dropped, failed) since the
            batch before, in the order they were.  Each group handed out is
            either yielded in one batch's ``groups`` or set aside in one
            batch's ``discarded``: when the last groups of a run are all set
            aside, the last batch has no ``groups``, only ``discarded``.
    """

    groups: list[list[Episode]]
    discarded: list[DiscardedGroup] = field(default_factory=list)

    @property
    def episodes(self) -> list[Episode]:
        """Every episode, group after group."""
        return [episode for group in self.groups for episode in group]


def rewards_differ(group: Sequence[Episode]) -> bool:
    """An ``accept_group`` filter: keep a group unless every member's return is the same.

    A group whose members all scored the same carries no signal for a
    group-relative advantage (GRPO): each advantage is zero.
    """
    returns = [float(episode.rewards.sum()) for episode in group]
    return any(r != returns[0] for r in returns)


@dataclass(slots=True)
class _Running:
    """An env's episode under way: ``head``, the `Episode` fields it started with."""

    head: dict[str, Any]
    obs: list[Any] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    extras: dict[str, list[np.ndarray]] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)


def _rows(tree: Any, k: int) -> Any:
    """Row ``k`` of ``tree``'s arrays, kept as arrays of one row (copied)."""
    return tree_map(lambda a: np.array(a[k : k + 1], copy=True), tree)


def _concat(parts: list[Any]) -> Any:
    return tree_map(lambda *rows: np.concatenate(rows), *parts)


class EpisodeBook(Book):
    """Each env's episode under way; those that ended wait in ``ended`` for the driver."""

    def __init__(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any], num_envs: int
    ) -> None:
        super().__init__(observation_space, action_space, num_envs)
        self.running: dict[int, _Running] = {}
        self.ended: list[Episode] = []

    def begin(  # noqa: PLR0917  (what an episode is started with)
        self,
        env_id: int,
        episode_id: int,
        group_id: int,
        index: int,
        task: Any,
        seed: int,
        now: float,
    ) -> None:
        """Env ``env_id`` starts episode ``episode_id`` (its reset is sent)."""
        head = {
            "env_id": env_id,
            "episode_id": episode_id,
            "group_id": group_id,
            "index": index,
            "task": task,
            "seed": seed,
            "start_time": now,
        }
        self.running[env_id] = _Running(head)

    def acted(self, ids: np.ndarray, actions: Any, extras: Mapping[str, Any], version: int) -> None:
        """The policy (``version``) chose ``actions`` (and ``extras``) for envs ``ids``."""
        for k, i in enumerate(ids.tolist()):
            run = self.running[i]
            run.obs.append(_rows(self.last_obs, i))
            run.actions.append(_rows(actions, k))
            run.versions.append(version)
            for name, values in extras.items():
                run.extras.setdefault(name, []).append(np.array(values[k : k + 1], copy=True))

    def stepped(  # noqa: PLR0917  (one transition's fields)
        self,
        ids: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        next_obs: Any,
        infos: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """The steps of envs ``ids`` ended; an episode that ended goes to ``ended``."""
        for k, i in enumerate(ids.tolist()):
            run = self.running[i]
            run.rewards.append(float(rewards[k]))
            info = infos[k] if infos else {}
            run.infos.append(info)
            if terminations[k] or truncations[k]:
                del self.running[i]
                self.ended.append(
                    Episode(
                        **run.head,
                        obs=_concat(run.obs),
                        actions=_concat(run.actions),
                        rewards=np.array(run.rewards, np.float64),
                        final_obs=tree_map(lambda a, k=k: a[k], next_obs),
                        terminated=bool(terminations[k]),
                        truncated=bool(truncations[k]),
                        status=_status(bool(truncations[k]), info),
                        versions=np.array(run.versions, np.int64),
                        extras={name: np.concatenate(v) for name, v in run.extras.items()},
                        infos=run.infos,
                        end_time=time.perf_counter(),
                    )
                )


def _status(truncated: bool, info: Mapping[str, Any]) -> str:
    """``"ok"``, or why the episode failed: a restarted env's row is truncated with an error."""
    error = info.get("error")
    if not truncated or not isinstance(error, str):
        return "ok"
    return "timeout" if error.split(":", 1)[0].endswith("TimeoutError") else "error"


@dataclass(slots=True)
class _Group:
    """A task's group under way: its members, those still to start, their failures."""

    index: int
    task: dict[str, Any] | None
    seed: int
    members: list[Episode | None]
    waiting: deque[int]
    tries: list[int]
    running: int = 0
    failed: bool = False  # on_error="drop": it is set aside once its members are out

    def oldest(self) -> int:
        return min(int(e.versions.min()) for e in self.members if e is not None and len(e))

    def discarded(self, reason: str) -> DiscardedGroup:
        episodes = [e for e in self.members if e is not None]
        return DiscardedGroup(reason, self.index, self.task, self.seed, episodes)


def check_task(task: object, where: str) -> dict[str, Any] | None:
    """A task is a reset's options: a dict or ``None``."""
    if task is not None and not isinstance(task, dict):
        raise TypeError(
            f"tasks must give reset options (a dict or None each), got {where}: "
            f"{validate.describe(task)}"
        )
    return task


class Groups:
    """Tasks turned into groups, scheduled onto envs and taken in batches (see the module).

    Args:
        tasks: Reset options, one per group (``None``: every group's are ``None``, forever).
        group_size: Members per group.
        batch_size: Groups per batch (``max_lag``'s admission counts in batches).
        max_in_flight: Groups under way at most.
        max_lag: Admit no group unless it would be in one of the next
            ``max_lag + 1`` batches (``None``: no limit).
        seed: Group ``g``'s members are reset with seed ``seed + g``.
        accept: Keeps a finished group (``None``: every group).
        on_error: What a failed member means (`ON_ERROR`).
        max_retries: ``on_error="retry"``: tries of a member after its first.
    """

    def __init__(
        self,
        tasks: Iterable[Any] | None,
        *,
        group_size: int,
        batch_size: int,
        max_in_flight: int,
        max_lag: int | None,
        seed: int,
        accept: Callable[[list[Episode]], object] | None,
        on_error: str,
        max_retries: int,
    ) -> None:
        self._tasks: Iterator[Any] = itertools.repeat(None) if tasks is None else iter(tasks)
        self.group_size, self.batch_size = group_size, batch_size
        self.max_in_flight, self.max_lag = max_in_flight, max_lag
        self.seed, self.accept = seed, accept
        self.on_error, self.max_retries = on_error, max_retries
        self.cursor = 0  # tasks drawn from ``tasks``
        self.again: deque[tuple[int, dict[str, Any] | None]] = deque()  # to give out first
        self.in_flight: dict[int, _Group] = {}
        self.queued: deque[_Group] = deque()  # finished and accepted, not taken yet
        self.exhausted = False
        self.rejected = self.dropped = self.failed = 0
        self.discarded: list[DiscardedGroup] = []  # set aside, not yet handed to the user
        self.episodes = 0  # episodes started: the next one's episode_id

    # -- scheduling ---------------------------------------------------------------------

    def next_member(self) -> tuple[_Group, int] | None:
        """The member to start on a free env: the oldest group's first, or a new group's."""
        for group in self.in_flight.values():
            if group.waiting:
                return self._started(group)
        new = self._admit()
        return None if new is None else self._started(new)

    def _started(self, group: _Group) -> tuple[_Group, int]:
        group.running += 1
        return group, group.waiting.popleft()

    def new_episode(self) -> int:
        """A new episode's ``episode_id``: unique across a run and the runs resumed from it."""
        self.episodes += 1
        return self.episodes - 1

    def _admit(self) -> _Group | None:
        if len(self.in_flight) >= self.max_in_flight:
            return None
        if self.max_lag is not None and (
            len(self.queued) + len(self.in_flight) >= (self.max_lag + 1) * self.batch_size
        ):
            return None  # it could not be in a batch before the policy moved on max_lag versions
        if self.again:
            index, task = self.again.popleft()
        else:
            if self.exhausted:
                return None
            try:
                task = check_task(next(self._tasks), f"task {self.cursor}")
            except StopIteration:
                self.exhausted = True
                return None
            index = self.cursor
            self.cursor += 1
        size = self.group_size
        members: list[Episode | None] = [None] * size
        group = _Group(index, task, self.seed + index, members, deque(range(size)), [0] * size)
        self.in_flight[index] = group
        return group

    def ended(self, group: _Group, index: int, episode: Episode) -> None:
        """Member ``index`` of ``group`` ended with ``episode``; ``on_error`` may raise."""
        group.running -= 1
        if episode.status != "ok" and not group.failed:
            self._failed(group, index, episode)
        else:
            group.members[index] = episode
        if group.running or group.waiting:
            return
        del self.in_flight[group.index]
        if group.failed:  # its last member is out: it is set aside
            self.failed += 1
            self.discarded.append(group.discarded("failed"))
            return
        members = [e for e in group.members if e is not None]
        if self.accept is not None and not self.accept(members):
            self.rejected += 1  # its place is free: the next task takes it
            self.discarded.append(group.discarded("rejected"))
            return
        self.queued.append(group)

    def _failed(self, group: _Group, index: int, episode: Episode) -> None:
        on_error = self.on_error
        if on_error == "keep":
            group.members[index] = episode
            return
        if on_error == "drop":
            group.failed = True
            group.waiting.clear()
            group.members[index] = episode
            return
        if on_error == "retry" and group.tries[index] < self.max_retries:
            group.tries[index] += 1
            group.waiting.appendleft(index)
            return
        where = f"episode {episode.episode_id} (member {index} of group {group.index}"
        if on_error == "retry":
            tries = group.tries[index] + 1
            where += (
                f", its try {tries} of {tries}: on_error='retry' with max_retries="
                f"{self.max_retries} gives up; raise max_retries, or pass on_error='drop' "
                "(its group is set aside) or 'keep' (kept with its status) to go on"
            )
        timeout = episode.status == "timeout"
        kind = EnvTimeoutError if timeout else EnvError
        raise kind({episode.env_id: _cause(episode.infos[-1]["error"], timeout)}, where + ")")

    @property
    def done(self) -> bool:
        """No group is under way and none can start: the tasks ran out."""
        return not self.in_flight and not self.again and self.exhausted

    def take(self, size: int) -> EpisodeBatch:
        """A batch: up to ``size`` finished groups, and those set aside since the last one.

        The first groups to finish come first.
        """
        taken = [self.queued.popleft() for _ in range(min(size, len(self.queued)))]
        groups = [[e for e in g.members if e is not None] for g in taken]
        discarded, self.discarded = self.discarded, []
        return EpisodeBatch(groups, discarded)

    def drop_older_than(self, version: int) -> int:
        """Drop finished groups with an action of a policy before ``version``; how many."""
        kept: deque[_Group] = deque()
        for group in self.queued:
            if group.oldest() >= version:
                kept.append(group)
            else:
                self.discarded.append(group.discarded("dropped"))
        dropped = len(self.queued) - len(kept)
        self.queued = kept
        self.dropped += dropped
        return dropped

    def requeue_in_flight(self) -> None:
        """The collection stopped: the groups under way start again from their reset."""
        for group in reversed(self.in_flight.values()):
            self.again.appendleft((group.index, group.task))
        self.in_flight.clear()

    # -- resuming -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The task cursor, the tasks not handed back (to give out again), the counts.

        Also the episodes started: the next ``episode_id``.
        """
        pending = [*self.again]
        pending += [(g.index, g.task) for g in self.in_flight.values()]
        pending += [(g.index, g.task) for g in self.queued]
        pending += [(g.group_id, g.task) for g in self.discarded]
        unsaid = collections.Counter(g.reason for g in self.discarded)  # run again: not counted
        return {
            "cursor": self.cursor,
            "pending": sorted(pending, key=lambda p: p[0]),
            "seed": self.seed,
            "rejected": self.rejected - unsaid["rejected"],
            "dropped": self.dropped - unsaid["dropped"],
            "failed": self.failed - unsaid["failed"],
            "episodes": self.episodes,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict`: skip ``cursor`` tasks, give the pending ones out first."""
        if not isinstance(state, Mapping):
            raise TypeError(
                f"state must be a dict from state_dict(), got {validate.describe(state)}"
            )
        missing = {"cursor", "pending", "seed", "rejected", "dropped", "failed", "episodes"}
        missing -= set(state)
        if missing:
            raise ValueError(f"state lacks {sorted(missing)}: give what state_dict() returned")
        if self.cursor or self.in_flight or self.queued or self.again:
            raise ValueError("load_state_dict() needs an EpisodeCollector that has not run yet")
        pending = [(int(i), check_task(t, f"pending task {i}")) for i, t in state["pending"]]
        for skipped in range(int(state["cursor"])):
            try:
                next(self._tasks)
            except StopIteration:
                raise ValueError(
                    f"state's cursor is {state['cursor']} but tasks ran out after {skipped}: "
                    "give the tasks the state was saved with"
                ) from None
        self.cursor = int(state["cursor"])
        self.again = deque(pending)
        self.seed = int(state["seed"])
        self.rejected, self.dropped = int(state["rejected"]), int(state["dropped"])
        self.failed = int(state["failed"])
        self.episodes = int(state["episodes"])


def _cause(text: str, timeout: bool) -> Exception:
    """The exception a failed member's ``infos["error"]`` (``"Type: message (in ...)"``) says.

    The env's own exception stayed in the vector env; its built-in type (a
    ``ConnectionResetError``, a ``TimeoutError``) is made again with its message,
    any other comes back as a ``RuntimeError`` (``TimeoutError``) with the whole text.
    """
    name, colon, message = text.partition(": ")
    kind = getattr(builtins, name, None)
    if colon and isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except Exception:
            pass
    return (TimeoutError if timeout else RuntimeError)(text)
