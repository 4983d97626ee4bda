"""``aiovec.EpisodeCollector``: whole episodes, in groups of one task each.

Theory of operation.  The env and policy machinery is the `Collector`'s
(`aiovec._collector._Driver`: policy batching, the ``recv`` raced against
policy calls, the checks of the policy's output, leaving the loop); this
driver changes two things in it:

- the rows go to an `~aiovec._core.episodes.EpisodeBook`, which records each
  env's episode as it runs and turns it into an `Episode` when it ends;
- an env whose episode ended is not autoreset: it is *free*.  Before each
  wait, `_EpisodeDriver._launch` gives every free env the next member to run
  (`~aiovec._core.episodes.Groups`: the oldest group's first, or a new
  group's) and starts it with an explicit reset carrying the group's seed and
  task (`aiovec._sends.Sends.resets`, sent while other envs are in flight
  or a ``recv`` waits).  An env with nothing to run stays idle.

A batch is ready once ``batch_size`` groups finished (and were accepted), and
carries the groups set aside since the batch before (`Groups.discarded`); when
the tasks run out, the groups in flight finish and the last batch holds what
is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from aiovec._collector import _check_batching, _check_count, _Driver, _Front
from aiovec._core import validate
from aiovec._core.episodes import (
    ON_ERROR,
    Episode,
    EpisodeBatch,
    EpisodeBook,
    Groups,
    _Group,
    check_task,
    rewards_differ,
)
from aiovec._vector import AsyncioVectorEnv

__all__ = ("EpisodeCollector",)


class EpisodeCollector(_Front[EpisodeBatch]):
    """Collect whole episodes in groups: ``group_size`` runs of each task, no env waiting.

    Args:
        envs: An `aiovec.AsyncioVectorEnv` (iterate with ``async for``) or an
            `aiovec.BlockingVectorEnv` (iterate with ``for``), any backend.
        policy: As the `aiovec.Collector`'s: ``policy(obs, env_ids)`` ->
            ``actions`` or ``(actions, extras)``, plain or ``async def``.
        batch_size: Groups per batch.
        group_size: Episodes per group: each runs the group's task from the
            same reset (the group's seed), on whichever envs are free.
        tasks: An iterable of reset options (dicts, or ``None``), one per
            group; when it runs out, the groups in flight finish and the
            iteration ends (the last batch may be short).  ``None``: groups
            of one episode with no options, forever.
        max_in_flight: Groups under way at most.  Default: ``num_envs``, so
            that even while every env runs the slowest member of a different
            group, an env that is freed finds a member to run.  Members start
            oldest group first, so a group admitted early starts no sooner
            (and is no older when yielded) than it would otherwise.
        accept_group: ``accept_group(episodes) -> bool`` filters finished
            groups (e.g. `aiovec.rewards_differ`); a rejected group frees its
            place for the next task, is counted in ``rejected`` and handed
            back in the next batch's ``discarded``.
        on_error: What a member whose env failed means (its status is
            ``"error"`` or ``"timeout"``): ``"raise"``; ``"retry"`` it from
            its reset on a free env, up to ``max_retries`` more times, then
            raise; ``"drop"`` its group (counted in ``failed``, handed back
            in ``discarded``); ``"keep"`` it in its group with its status.
            All but ``"raise"`` need a vector env that restarts failed envs
            (``on_error="restart"`` or a `aiovec.RestartPolicy`): without
            one, an env's failure raises from the vector env itself.  The
            two budgets are apart: ``max_retries`` counts a member's tries;
            the vector env's restart limit counts an env's failures in a row
            (a crash loop).
        max_retries: ``on_error="retry"``: tries of a member after its first.
        max_batch: At most this many envs per policy call (``None``: all ready).
        max_wait: Seconds to wait for more ready envs before calling the policy.
        max_policy_calls: At most this many calls of an ``async def`` policy
            in flight (``None``: no limit); see `aiovec.Collector`.
        max_lag: Start no group unless it will be in one of the next
            ``max_lag + 1`` batches (one `update_policy` per batch: its
            actions are then at most ``max_lag`` versions old when yielded).
            Groups older than that anyway (rejections, retries, more updates
            per batch) are dropped when finished, counted in ``dropped`` and
            handed back in ``discarded``.
        seed: Group ``g`` (the ``g``-th task) is reset with seed ``seed + g``
            in every member (``None``: a base seed drawn at random, kept in
            `state_dict`).

    Example:
        >>> async with aiovec.EpisodeCollector(venv, policy, batch_size=8, group_size=4,
        ...                                    tasks=prompts) as collector:  # doctest: +SKIP
        ...     async for batch in collector:
        ...         learn(batch.groups)
        ...         collector.update_policy()
    """

    def __init__(
        self,
        envs: Any,
        policy: Callable[..., Any],
        *,
        batch_size: int,
        group_size: int = 1,
        tasks: Iterable[dict[str, Any] | None] | None = None,
        max_in_flight: int | None = None,
        accept_group: Callable[[list[Episode]], object] | None = None,
        on_error: str = "raise",
        max_retries: int = 2,
        max_batch: int | None = None,
        max_wait: float = 0.0,
        max_policy_calls: int | None = 1,
        max_lag: int | None = None,
        seed: int | None = None,
    ) -> None:
        venv = self._open(envs, policy)
        _check_count("batch_size", batch_size)
        _check_count("group_size", group_size)
        if group_size > 1 and tasks is None:
            raise ValueError(
                f"group_size={group_size} needs tasks: a group runs one task (reset options) "
                "several times; give tasks=..., or group_size=1"
            )
        if tasks is not None:
            tasks = _checked_tasks(tasks)
        if max_in_flight is not None:
            _check_count("max_in_flight", max_in_flight)
        if accept_group is rewards_differ and group_size == 1:
            raise ValueError(
                "accept_group=rewards_differ compares a group's members: it needs group_size > 1"
            )
        if accept_group is not None and not callable(accept_group):
            raise TypeError(
                f"accept_group must be callable or None, got {validate.describe(accept_group)}"
            )
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        _check_count("max_retries", max_retries, least=0)
        if on_error != "raise" and venv.restart_policy is None:
            raise ValueError(
                f"on_error={on_error!r} needs a vector env that restarts failed envs "
                "(built with on_error='restart'): without one, an env's failure stops "
                "every env, and the vector env raises it"
            )
        _check_batching(max_batch, max_wait, max_policy_calls, max_lag)
        base = validate._check_seed("seed", seed)
        if base is None:
            base = int(np.random.SeedSequence().generate_state(1)[0] >> 1)
        groups = Groups(
            tasks,
            group_size=group_size,
            batch_size=batch_size,
            max_in_flight=max_in_flight or venv.num_envs,
            max_lag=max_lag,
            seed=base,
            accept=accept_group,
            on_error=on_error,
            max_retries=max_retries,
        )
        driver = _EpisodeDriver(venv, policy, groups, batch_size)
        driver.max_lag = max_lag
        self._set_driver(driver, max_batch, max_wait, max_policy_calls)
        self._groups = groups

    @property
    def rejected(self) -> int:
        """How many finished groups ``accept_group`` rejected so far (`EpisodeBatch.discarded`)."""
        return self._groups.rejected

    @property
    def dropped(self) -> int:
        """How many finished groups ``max_lag`` dropped so far (`EpisodeBatch.discarded`)."""
        return self._groups.dropped

    @property
    def failed(self) -> int:
        """How many groups ``on_error="drop"`` dropped so far (`EpisodeBatch.discarded`)."""
        return self._groups.failed

    def state_dict(self) -> dict[str, Any]:
        """What resumes the run: the task cursor, the tasks not handed back, the episodes.

        Take it between batches; give it to `load_state_dict` of a new
        collector over the same ``tasks`` and ``seed`` to go on.  Across the
        two runs every task handed out comes back once: yielded in a batch's
        ``groups``, or set aside in a batch's ``discarded``; a task under way
        when the first run stopped runs again from its reset in the second.
        ``episode_id`` goes on counting.
        """
        return self._groups.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict`, before iterating: the pending tasks are given out first.

        The first ``cursor`` tasks of ``tasks`` are skipped (they were handed
        out); each pending task keeps its group number, so its seed too; the
        episodes started number on from the saved run's.
        """
        if self._driver.book is not None:
            raise ValueError("load_state_dict() must come before the iteration starts")
        self._groups.load_state_dict(state)


def _checked_tasks(tasks: object) -> Iterable[dict[str, Any] | None]:
    """``tasks``: an iterable of reset options; a sequence is checked whole, at once."""
    if isinstance(tasks, str | bytes | dict) or not isinstance(tasks, Iterable):
        raise TypeError(
            "tasks must be an iterable of reset options (dicts or None), "
            f"got {validate.describe(tasks)}"
        )
    if isinstance(tasks, Sequence):
        for k, task in enumerate(tasks):
            check_task(task, f"task {k}")
    return tasks


class _EpisodeDriver(_Driver):
    """The `EpisodeCollector`'s driver (see the module docstring)."""

    book: EpisodeBook | None
    keep_ended = True  # a free env is reset once, by `_launch`, with its next member's task

    def __init__(
        self,
        venv: AsyncioVectorEnv[Any, Any],
        policy: Callable[..., Any],
        groups: Groups,
        batch_size: int,
    ) -> None:
        super().__init__(venv, policy)
        self.groups, self.batch_size = groups, batch_size
        self.free: list[int] = []  # envs with no episode under way
        self.again: list[int] = []  # envs whose member's reset failed: to send again
        self.members: dict[int, tuple[_Group, int]] = {}  # env -> the member it runs

    def _drop_lagging(self, version: int) -> None:
        self.dropped += self.groups.drop_older_than(version)

    async def _next_batch(self) -> EpisodeBatch | None:
        if self.book is None:
            venv = self.venv
            spaces = venv.single_observation_space, venv.single_action_space
            self.book = EpisodeBook(*spaces, venv.num_envs)
            self.last_actions = self.book.action_rows()
            self.free = list(range(venv.num_envs))
        groups = self.groups
        while True:
            if self.max_lag is not None:
                self._drop_lagging(self.version - self.max_lag)
            if len(groups.queued) >= self.batch_size:
                break
            await self._launch()
            if not (self.out or self.calls or self.ready or self.receiving is not None):
                break  # nothing under way, nothing to start: the tasks ran out
            self._dispatch()
            await self._wait()
        if not groups.queued and not groups.discarded:
            return None
        return groups.take(self.batch_size)

    async def _launch(self) -> None:
        """Start the next members on the free envs: a reset with their group's seed and task."""
        book = self.book
        assert book is not None
        ids: list[int] = []
        seeds: list[int | None] = []
        options: list[dict[str, Any] | None] = []
        for env in self.again:  # the same member, from the same reset
            group, _ = self.members[env]
            ids.append(env)
            seeds.append(group.seed)
            options.append(group.task)
        self.again.clear()
        now = time.perf_counter()
        while self.free:
            member = self.groups.next_member()
            if member is None:
                break
            env = self.free.pop(0)
            group, index = self.members[env] = member
            episode_id = self.groups.new_episode()
            book.begin(env, episode_id, group.index, index, group.task, group.seed, now)
            ids.append(env)
            seeds.append(group.seed)
            options.append(group.task)
        if ids:
            await self._send_resets(ids, seeds, options)

    def _reset_rows(self, ids: np.ndarray, restarted: np.ndarray) -> None:
        """A member whose reset failed (its env restarted, reset its own way) is reset again.

        It has not started: nothing is lost.  The vector env's restart limit
        bounds the tries.
        """
        self._became_ready(ids[~restarted].tolist())
        self.again += ids[restarted].tolist()

    def _after_ends(self, ids: np.ndarray, ended: np.ndarray) -> None:
        """An env whose episode ended is free (`_launch` gives it its next member)."""
        book = self.book
        assert book is not None
        self._became_ready(ids[~ended].tolist())
        if not ended.any():
            return
        episodes, book.ended = book.ended, []
        for episode in episodes:
            group, index = self.members.pop(episode.env_id)
            self.free.append(episode.env_id)
            self.groups.ended(group, index, episode)

    def _forget(self) -> None:
        self.groups.requeue_in_flight()
        self.members.clear()
        self.free, self.again = [], []
