"""``aiovec.Collector``: partial stepping turned into trajectory segments.

Theory of operation.  One coroutine, `_Driver.next_batch`, drives the vector
env's public ``send``/``recv`` (so ``max_concurrency``, timeouts, restarts and
logging work as they do there) until ``batch_size`` segments are finished:

- the collection starts with a reset of every env sent at once
  (`aiovec._sends.Sends.resets`): each env's reset comes back on its own,
  and the env steps as soon as its own reset is done;
- an env whose observation is known is *ready*; `_dispatch` hands ready envs
  to the policy, up to ``max_batch`` at a time, waiting at most ``max_wait``
  seconds for more, with at most ``max_policy_calls`` calls in flight.  A
  plain policy is called there and its actions sent at once; an ``async
  def`` policy becomes a task, and its actions are sent when it is done
  (`_harvest`).  What the policy returns is checked first (`_answer`);
- `_wait` waits for whatever comes first: an env's step (``recv``; with
  ``max_wait``, as many as fill a policy call), a policy call, or the end of
  ``max_wait``.  While policy calls are out, the ``recv`` is a task of its
  own, raced against them: the vector env takes a ``send`` while a ``recv``
  waits, so a policy's answer reaches its envs as soon as it returns, and
  nothing wakes on a timer;
- `_received` sorts a ``recv``'s rows: a reset row (the start's, or
  ``NEXT_STEP``'s) is never a transition, it only makes its env ready; every
  other row is a transition, written into the env's segment
  (`~aiovec._core.segments.SegmentBook`).  An env whose episode ended is reset
  as the mode says: ``SAME_STEP`` did it within the step, ``NEXT_STEP`` gets
  the reset row at once (its action is the env's last one, ignored),
  ``DISABLED`` waits until no env is out, then the ended envs are reset
  together with ``reset_mask``.

The blocking front end runs the same coroutines through the vector env's
`~aiovec._runner.Runner`.  Leaving the loop (``break``, an error, Ctrl-C, a
cancelled consumer) stops the collection (`_Driver.stop`, one at a time):
the policy's calls, the ``recv`` and every env's call are cancelled, and the
vector env then needs a ``reset()``.  ``aclose()`` from another task first
has the consumer leave `_Driver.next_batch` as if the collection were over
(`_Driver.close`), then stops.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._core import validate
from aiovec._core.autoreset import ResetHook
from aiovec._core.segments import Book, SegmentBatch, SegmentBook, as_tree, row_infos, tree_map
from aiovec._sends import Sends
from aiovec._vector import AsyncioVectorEnv

__all__ = ("Collector", "SegmentBatch")

B = TypeVar("B")

_ACTIONS = "\x00actions\x00"
"""Where an action check's message names what it checked: the policy's call, once known."""


class _Front(Generic[B]):
    """The two front ends of a collector over a `_Driver` (written once for both collectors).

    ``async for`` over an `aiovec.AsyncioVectorEnv`, ``for`` over an
    `aiovec.BlockingVectorEnv` (through its `~aiovec._runner.Runner`); a
    driver's ``next_batch`` returns ``None`` when the collection is over.
    """

    _driver: _Driver

    def _open(self, envs: Any, policy: Callable[..., Any]) -> AsyncioVectorEnv[Any, Any]:
        """The vector env under ``envs``, once ``envs`` and ``policy`` are checked."""
        venv = getattr(envs, "vector_env", envs)
        if not isinstance(venv, AsyncioVectorEnv):
            raise TypeError(
                "envs must be an aiovec.AsyncioVectorEnv or aiovec.BlockingVectorEnv, "
                f"got {validate.describe(envs)}"
            )
        if not callable(policy):
            raise TypeError(f"policy must be callable, got {validate.describe(policy)}")
        self.envs = envs
        self._runner = getattr(envs, "_runner", None)  # BlockingVectorEnv's
        return venv

    def _set_driver(
        self,
        driver: _Driver,
        max_batch: int | None,
        max_wait: float,
        max_policy_calls: int | None,
    ) -> None:
        """Give ``driver`` the policy-batching knobs (checked by `_check_batching`)."""
        self._driver = driver
        driver.max_batch = max_batch or driver.venv.num_envs
        driver.max_wait = max_wait or 0.0
        driver.max_calls = max_policy_calls or driver.venv.num_envs

    @property
    def policy_version(self) -> int:
        """The current policy's version (0 at first; `update_policy` adds 1)."""
        return self._driver.version

    def update_policy(self, policy: Callable[..., Any] | None = None) -> int:
        """Start a new policy version (swapping in ``policy`` if given); returns it.

        Actions chosen from now on record the new version; policy calls
        already in flight keep the version they started with.
        """
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable, got {validate.describe(policy)}")
        return self._driver.new_version(policy)

    # -- await front end ------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[B]:
        self._check_front("async for", async_=True)
        return self._abatches()

    async def _abatches(self) -> AsyncIterator[B]:
        driver = self._driver
        closes = driver.closes  # an `aclose` from now on ends this iteration
        try:
            while closes == driver.closes and (batch := await driver.next_batch()) is not None:
                yield batch
        finally:
            await driver.stop()

    async def aclose(self) -> None:
        """End the iteration: cancel the policy's calls and every env's call in flight.

        From any task, the consuming one or another (a shutdown handler, a
        supervisor): a consumer waiting for a batch sees its ``async for``
        end as if the collection were over, and one inside the loop's body
        at its next turn.  Idempotent; the vector env needs a ``reset()``
        after, and iterating again starts a new collection.
        """
        await self._driver.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- blocking front end ------------------------------------------------------------

    def __iter__(self) -> Iterator[B]:
        self._check_front("for", async_=False)
        return self._batches()

    def _batches(self) -> Iterator[B]:
        runner, driver = self._runner, self._driver
        assert runner is not None
        closes = driver.closes
        try:
            while closes == driver.closes:
                batch = runner.run(driver.next_batch())
                if batch is None:
                    break
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        """The blocking front end's `aclose`."""
        if self._runner is not None and not self._runner._closed:
            self._runner.run(self._driver.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_front(self, how: str, *, async_: bool) -> None:
        if (self._runner is None) == async_:
            return
        other = "for" if async_ else "async for"
        over = "a BlockingVectorEnv" if async_ else "an AsyncioVectorEnv"
        name = type(self).__name__
        article = "an" if name[0] in "AEIOU" else "a"
        raise TypeError(f"{article} {name} over {over} is iterated with `{other}`, not `{how}`")


def _check_batching(
    max_batch: int | None,
    max_wait: float,
    max_policy_calls: int | None,
    max_lag: int | None,
) -> None:
    """The policy-batching knobs both collectors take (and ``max_lag``)."""
    if max_batch is not None:
        _check_count("max_batch", max_batch)
    if max_wait != 0:
        validate.check_timeout("max_wait", max_wait)
    if max_policy_calls is not None:
        _check_count("max_policy_calls", max_policy_calls)
    if max_lag is not None:
        _check_count("max_lag", max_lag, least=0)


class Collector(_Front[SegmentBatch]):
    """Collect trajectory segments from a vector env, no env waiting for another.

    Args:
        envs: An `aiovec.AsyncioVectorEnv` (iterate with ``async for``) or an
            `aiovec.BlockingVectorEnv` (iterate with ``for``), any backend.
            The collector resets it (with ``seed``) when iteration starts.
        policy: ``policy(obs, env_ids)`` -> ``actions`` or ``(actions,
            extras)``: ``obs`` holds the ready envs' observations (batched),
            ``env_ids`` says which envs; ``extras`` (a pair is told from a
            Tuple space's actions by its dict) is a dict of per-env arrays
            (log-probs, values) stored with each transition.  An
            ``async def`` policy may have several calls in flight.
        segment_length: Consecutive transitions of one env per segment.
        batch_size: Segments per batch.
        max_batch: At most this many envs per policy call (``None``: all ready).
        max_wait: Seconds to wait for more ready envs before calling the
            policy with fewer than ``max_batch`` (0: call it at once).
        max_policy_calls: At most this many calls of an ``async def``
            policy in flight (``None``: no limit).  Envs that become ready
            meanwhile wait, and go to the next call together: one call at a
            time (the default) suits a model server that serves one batched
            call at a time; raise it for a server that batches requests
            itself (docs/collector.md has the figures).
        reset_options: ``reset_options(env_id, episode) -> dict | None``,
            set as the vector env's hook (see `aiovec.AsyncioVectorEnv`).
        max_lag: Keep out of batches any segment with a transition from a
            policy more than this many versions older than the current one
            (such segments are dropped and counted in ``dropped``).
        seed: The seed of the reset that starts the collection (env ``i``
            gets ``seed + i``, as ``reset(seed=seed)``); each env steps as
            soon as its own reset is done.

    Example:
        >>> async with aiovec.Collector(venv, policy, segment_length=32,
        ...                             batch_size=16) as collector:  # doctest: +SKIP
        ...     async for batch in collector:
        ...         learn(batch)
        ...         collector.update_policy()
    """

    def __init__(
        self,
        envs: Any,
        policy: Callable[..., Any],
        *,
        segment_length: int,
        batch_size: int,
        max_batch: int | None = None,
        max_wait: float = 0.0,
        max_policy_calls: int | None = 1,
        reset_options: ResetHook | None = None,
        max_lag: int | None = None,
        seed: int | None = None,
    ) -> None:
        venv = self._open(envs, policy)
        _check_count("segment_length", segment_length)
        _check_count("batch_size", batch_size)
        _check_batching(max_batch, max_wait, max_policy_calls, max_lag)
        if reset_options is not None and venv.reset_options not in (None, reset_options):
            raise ValueError(
                "reset_options: the vector env has a reset_options hook already; "
                "give it to one of them only"
            )
        if reset_options is not None:
            venv.reset_options = reset_options
        driver = _SegmentDriver(venv, policy, segment_length, batch_size, seed)
        driver.max_lag = max_lag
        self._set_driver(driver, max_batch, max_wait, max_policy_calls)

    @property
    def dropped(self) -> int:
        """How many segments ``max_lag`` kept out of batches so far."""
        return self._driver.dropped


def _put_row(tree: Any, k: int, value: Any) -> None:
    """Write one row ``value`` (nested like ``tree``) at index ``k`` of ``tree``'s arrays."""
    if isinstance(tree, dict):
        for key, sub in tree.items():
            _put_row(sub, k, value[key])
    elif isinstance(tree, tuple):
        for sub, part in zip(tree, value, strict=True):
            _put_row(sub, k, part)
    else:
        tree[k] = value


def _check_count(name: str, value: object, *, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int >= {least}, got {validate.describe(value)}")
    if value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value}")


class _Driver:
    """The env and policy machinery of a collection (see the module docstring).

    Written once for both collectors; what differs is where the rows go
    (``book``: `SegmentBook`, or `~aiovec._core.episodes.EpisodeBook`) and what
    happens when an env's episode ends (`_after_ends`; by default the env is
    reset as the autoreset mode says).  A book is told what each env was
    shown (``observed``), what the policy chose (``acted``) and what the step
    gave (``stepped``); it shows the policy its input (``shown``).
    """

    book: Book | None  # None when no collection is running
    keep_ended = False  # True: the steps do not reset an env that ends (SAME_STEP); the driver does

    def __init__(self, venv: AsyncioVectorEnv[Any, Any], policy: Callable[..., Any]) -> None:
        self.venv, self.policy = venv, policy
        self.max_batch = venv.num_envs
        self.max_wait = 0.0
        self.max_calls = venv.num_envs  # policy calls in flight at most
        self.max_lag: int | None = None
        self.version = self.dropped = 0
        self.out = 0  # envs sent, not yet received
        self.book = None
        self.ready: list[int] = []  # envs whose observation waits for the policy
        self.ready_since = 0.0  # when the oldest of them became ready
        self.calls: dict[asyncio.Task[Any], tuple[np.ndarray, int]] = {}  # async policy calls
        self.receiving: asyncio.Task[Any] | None = None  # a recv raced against policy calls
        self.resetting = np.zeros(venv.num_envs, np.bool_)  # reset rows out (start, NEXT_STEP)
        self.parked: list[int] = []  # DISABLED: ended envs waiting for a reset
        self.reset_due: list[int] = []  # NEXT_STEP: ended envs whose reset row is not sent yet
        self.last_actions: Any = None
        self.mode = venv.autoreset_mode
        self.check_actions: dict[int, Callable[[object], None]] = {}  # by number of envs
        self._stopping: asyncio.Future[None] | None = None
        self.closes = 0  # how many times `close` was called: it ends the iterations before it
        self._consumer: asyncio.Task[Any] | None = None  # the task inside `next_batch`
        self._interrupted = False  # `close` cancelled the consumer, to be taken back
        self._left: asyncio.Future[None] | None = None  # set once the consumer has left

    def new_version(self, policy: Callable[..., Any] | None) -> int:
        if policy is not None:
            self.policy = policy
        self.version += 1
        if self.max_lag is not None and self.book is not None:
            self._drop_lagging(self.version - self.max_lag)
        return self.version

    def _drop_lagging(self, version: int) -> None:
        """Drop (and count) what holds an action of a policy before ``version``."""
        raise NotImplementedError

    async def _send_resets(
        self, ids: list[int], seeds: Any, options: list[dict[str, Any] | None] | None = None
    ) -> None:
        """Start resets of envs ``ids``: each is ready (and steps) once its own is done."""
        await Sends(self.venv).resets(seeds, env_ids=ids, options=options)
        self.resetting[ids] = True
        self.out += len(ids)

    async def next_batch(self) -> Any:
        """The next batch, or ``None`` once the collection is over (or `close` ended it).

        The task that calls it is its *consumer* until it returns: a `close`
        from another task interrupts it (`close` says how).
        """
        task = asyncio.current_task()  # None: a blocking runner drives this by hand
        self._consumer = task
        try:
            return await self._next_batch()
        except asyncio.CancelledError:
            if self._interrupted and task is not None:
                self._interrupted = False
                if task.uncancel() == 0:  # the cancellation was close()'s alone
                    return None
            raise
        finally:
            if self._interrupted and task is not None:  # close()'s never arrived: take it back
                self._interrupted = False
                task.uncancel()
            self._consumer = None
            if self._left is not None:
                self._left.set_result(None)
                self._left = None

    async def _next_batch(self) -> Any:
        """Collect until the next batch is whole (``None``: the collection is over)."""
        raise NotImplementedError

    async def close(self) -> None:
        """End the collection from any task (`_Front.aclose`), then `stop`.

        The collection's state belongs to its consumer while it is inside
        `next_batch`: a stop beside it would pull that state from under its
        feet.  So a `close` from another task cancels the consumer (its
        calls unwind as on any cancellation), waits until it has left
        `next_batch`, which then returns ``None`` as if the collection were
        over (the cancellation taken back with ``uncancel``: the consumer
        sees none of it unless someone else cancelled it too), and only then
        stops.  ``closes`` ends the iterations started before it.
        """
        self.closes += 1
        consumer = self._consumer
        if consumer is not None and consumer is not asyncio.current_task():
            if not self._interrupted:
                self._interrupted = True
                consumer.cancel()
            if self._left is None:
                self._left = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._left)
        await self.stop()

    # -- the policy -------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand ready envs to the policy, ``max_batch`` at a time (``max_wait`` permitting)."""
        while (
            self.ready
            and len(self.calls) < self.max_calls
            and (len(self.ready) >= self.max_batch or self._waited_enough())
        ):
            ids = np.array(self.ready[: self.max_batch], np.int64)
            del self.ready[: self.max_batch]
            self.ready_since = time.perf_counter()
            self._call_policy(ids)
        if self.reset_due:  # no policy call took them along
            self._send(np.zeros(0, np.int64), tree_map(lambda a: a[:0], self.last_actions))

    def _waited_enough(self) -> bool:
        if not self.max_wait or not (self.out or self.calls):
            return True  # nothing else can make an env ready
        return time.perf_counter() - self.ready_since >= self.max_wait

    def _call_policy(self, ids: np.ndarray) -> None:
        assert self.book is not None
        answer = self.policy(self.book.shown(ids), ids)
        if inspect.isawaitable(answer):
            task = asyncio.ensure_future(answer)
            self.calls[task] = (ids, self.version)
        else:
            self._act(ids, answer, self.version)

    def _act(self, ids: np.ndarray, answer: Any, version: int) -> None:
        """Record the policy's ``answer`` for ``ids`` and send the actions."""
        assert self.book is not None
        actions, extras = self._answer(ids, answer)
        self.book.acted(ids, actions, extras, version)
        tree_map(lambda buf, a: buf.__setitem__(ids, a), self.last_actions, actions)
        self._send(ids, actions)

    def _answer(self, ids: np.ndarray, answer: Any) -> tuple[Any, dict[str, Any]]:
        """The policy's ``answer`` as ``(actions, extras)``, checked against ``ids``.

        One action per env, of the action space's shape and dtype, and one
        row per env in each extra; an error names the policy, the envs and
        the extra.
        """
        pair = isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], dict)
        actions, extras = answer if pair else (answer, {})
        count = len(ids)
        check = self.check_actions.get(count)
        if check is None:  # one per batch size; the envs are named when one fails
            space = self.venv.single_action_space
            check = self.check_actions[count] = validate.action_checker(space, count, _ACTIONS)
        try:
            check(actions)
        except (TypeError, ValueError) as exc:
            said = str(exc).replace(_ACTIONS, f"the actions of {self._who(ids)}")
            raise type(exc)(said) from None
        actions = tree_map(np.asarray, actions)
        for name, values in extras.items():
            rows = np.shape(values)[:1]
            if rows != (count,):
                got = f"shape {np.shape(values)}" if np.ndim(values) else "a scalar"
                raise ValueError(
                    f"extra {name!r} of {self._who(ids)} must have one row per env ({count}), "
                    f"got {got}"
                )
        return actions, extras

    def _who(self, ids: np.ndarray) -> str:
        """The policy and the envs of its call, as an error about its answer names them."""
        return f"policy {_name(self.policy)} for env(s) {ids.tolist()}"

    def _send(self, ids: np.ndarray, actions: Any) -> None:
        """Send ``actions`` to ``ids``, and the reset rows due with them (one request)."""
        if self.reset_due:  # NEXT_STEP: an ended env's reset, its action ignored
            due = np.array(self.reset_due, np.int64)
            self.reset_due.clear()
            self.resetting[due] = True
            ids = np.concatenate([ids, due])
            actions = tree_map(
                lambda a, last: np.concatenate([a, last[due]]), actions, self.last_actions
            )
        self.venv._send(actions, ids, keep_ended=self.keep_ended, checked=True)  # by `_answer`
        self.out += len(ids)

    def _harvest(self) -> None:
        """Send the actions of the policy calls that are done (an error propagates)."""
        for task in [t for t in self.calls if t.done()]:
            ids, version = self.calls.pop(task)
            self._act(ids, task.result(), version)

    # -- waiting and receiving ----------------------------------------------------------

    async def _wait(self) -> None:
        """Wait for an env's step, a policy call or the end of ``max_wait``, what comes first."""
        limit = self._wait_limit()
        if limit is not None and limit <= 0:
            return  # max_wait is over: the ready envs go to the policy now
        if self.out and not self.calls and self.receiving is None:  # only envs are out
            self._received(await self.venv.recv(min_envs=self._wanted(), timeout=limit))
        elif self.calls or self.receiving is not None:
            if self.out and self.receiving is None:  # raced against the policy's calls
                recv = self.venv.recv(min_envs=self._wanted(), timeout=limit)
                self.receiving = asyncio.ensure_future(recv)
            waits = [*self.calls] if self.receiving is None else [*self.calls, self.receiving]
            await asyncio.wait(waits, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            receiving = self.receiving
            if receiving is not None and receiving.done():
                self.receiving = None
                self._received(receiving.result())
        elif self.parked:
            await self._reset_parked()
        self._harvest()

    def _wanted(self) -> int:
        """``recv``'s ``min_envs``: 1, or under ``max_wait`` what fills a policy call.

        ``max_wait`` counts from the first ready env: until one is, any env will do.
        """
        if not self.max_wait or not self.ready:
            return 1
        return max(1, min(self.out, self.max_batch - len(self.ready)))

    def _wait_limit(self) -> float | None:
        """How long to wait before ready envs must go to the policy (``max_wait``).

        No limit while the policy takes no more calls (``max_policy_calls``):
        the ready envs go with the next call that may start.
        """
        if not self.ready or not self.max_wait or len(self.calls) >= self.max_calls:
            return None
        return max(0.0, self.ready_since + self.max_wait - time.perf_counter())

    def _received(self, batch: Any) -> None:
        obs, rewards, terminations, truncations, infos, ids = batch
        if not len(ids):
            return
        self.out -= len(ids)
        obs = as_tree(self.venv.single_observation_space, obs)
        assert self.book is not None
        resets = self.resetting[ids]
        if resets.any():  # reset rows (a start's, NEXT_STEP's): a new episode's first obs
            self.resetting[ids[resets]] = False
            self.book.observed(ids[resets], tree_map(lambda a: a[resets], obs))
            self._reset_rows(ids[resets], truncations[resets])
        steps = ~resets
        if steps.any():
            self._transitions(ids, steps, obs, rewards, terminations, truncations, infos)

    def _transitions(  # noqa: PLR0917  (a recv's fields)
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        obs: Any,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        infos: dict[str, Any],
    ) -> None:
        assert self.book is not None
        every = bool(rows.all())

        def pick(a: Any) -> Any:
            return a if every else a[rows]

        ended = terminations | truncations
        infos_of = row_infos(infos, len(ids)) if infos else None
        if self.mode is AutoresetMode.SAME_STEP and ended.any():  # final_obs written in
            next_obs = tree_map(lambda a: pick(a).copy(), obs)
            self._final_obs(next_obs, ended, infos, rows, infos_of)
        else:
            next_obs = tree_map(pick, obs)  # the book copies it
        step_ids = ids if every else ids[rows]
        kept = [infos_of[k] for k in np.flatnonzero(rows)] if infos_of else None
        self.book.stepped(
            step_ids, pick(rewards), pick(terminations), pick(truncations), next_obs, kept
        )
        self.book.observed(step_ids, tree_map(pick, obs))
        self._after_ends(step_ids, ended[rows])

    def _final_obs(
        self,
        next_obs: Any,
        ended: np.ndarray,
        infos: dict[str, Any],
        rows: np.ndarray,
        infos_of: list[dict[str, Any]] | None,
    ) -> None:
        """``SAME_STEP``: an ended env's next observation is its final one, its info the last."""
        finals = infos.get("_final_obs")
        if finals is None:
            return  # restarted envs only: they have no final observation
        last_infos = row_infos(infos["final_info"], len(rows)) if "final_info" in infos else None
        picked = np.cumsum(rows) - 1  # each row's place among the picked ones
        for row in np.flatnonzero(ended & rows & finals).tolist():
            _put_row(next_obs, int(picked[row]), infos["final_obs"][row])
            if infos_of is not None and last_infos is not None:
                infos_of[row] = last_infos[row]

    def _reset_rows(self, ids: np.ndarray, restarted: np.ndarray) -> None:
        """Envs ``ids`` were reset: they are ready.

        ``restarted``: the reset failed and the vector env restarted the env
        (``on_error="restart"``), resetting it its own way; here that reset
        starts the env's episode as well.
        """
        self._became_ready(ids.tolist())

    def _after_ends(self, ids: np.ndarray, ended: np.ndarray) -> None:
        """Envs that ended reset as the mode says; the others are ready.

        The hook for what happens when an env's episode ends: the
        `EpisodeCollector`'s driver starts the env's next episode its own way.
        """
        if self.mode is AutoresetMode.SAME_STEP or not ended.any():
            self._became_ready(ids.tolist())
            return
        self._became_ready(ids[~ended].tolist())
        done = ids[ended]
        if self.mode is AutoresetMode.NEXT_STEP:  # sent with the next actions (`_send`)
            self.reset_due.extend(done.tolist())
        else:
            self.parked.extend(done.tolist())

    async def _reset_parked(self) -> None:
        """``DISABLED``: reset the ended envs together, once no env is out."""
        assert self.book is not None
        mask = np.zeros(self.venv.num_envs, np.bool_)
        mask[self.parked] = True
        self.parked.clear()
        obs, _ = await self.venv.reset(options={"reset_mask": mask})
        obs = as_tree(self.venv.single_observation_space, obs)
        ids = np.flatnonzero(mask)
        self.book.observed(ids, tree_map(lambda a: a[ids], obs))
        self._became_ready(ids.tolist())

    def _became_ready(self, ids: list[int]) -> None:
        if not self.ready:
            self.ready_since = time.perf_counter()
        self.ready.extend(ids)

    async def stop(self) -> None:
        """Cancel the policy's calls and the envs' calls in flight (once at a time).

        Several callers may stop at once: ``aclose()`` and the iterator's own
        end, which the loop runs as a task of its own when it finalizes an
        abandoned ``async for``.  The first does the work; the others wait
        for it, shielded, so that a cancelled caller never cuts it short.
        """
        stopping = self._stopping
        if stopping is None:
            stopping = self._stopping = asyncio.ensure_future(self._stop())
            stopping.add_done_callback(self._stopped)
        await asyncio.shield(stopping)

    def _stopped(self, stopping: asyncio.Future[None]) -> None:
        self._stopping = None
        if not stopping.cancelled():
            stopping.exception()  # retrieved: the callers that awaited it raised it

    async def _stop(self) -> None:
        waits = [*self.calls, *([self.receiving] if self.receiving is not None else [])]
        for task in waits:
            task.cancel()  # a recv cancelled cancels its envs' calls
        if waits:
            await asyncio.wait(waits)
        for task in waits:
            if not task.cancelled():
                task.exception()  # retrieved: the collection is over, its errors with it
        self.calls.clear()
        self.receiving = None
        await Sends(self.venv).stop("a Collector stopped with envs in flight")
        self.book, self.out, self.ready, self.parked = None, 0, [], []  # iterating resets
        self.reset_due = []
        self.resetting[:] = False
        self._forget()

    def _forget(self) -> None:
        """What the collection had under way is gone (`stop`): iterating starts again."""


class _SegmentDriver(_Driver):
    """The `Collector`'s driver: segments of ``length`` transitions, ``batch_size`` a batch."""

    book: SegmentBook | None

    def __init__(
        self,
        venv: AsyncioVectorEnv[Any, Any],
        policy: Callable[..., Any],
        length: int,
        batch_size: int,
        seed: int | None,
    ) -> None:
        super().__init__(venv, policy)
        self.length, self.batch_size, self.seed = length, batch_size, seed

    def _drop_lagging(self, version: int) -> None:
        assert self.book is not None
        self.dropped += self.book.drop_older_than(version)

    async def _next_batch(self) -> SegmentBatch:
        if self.book is None:
            await self._start()
        book = self.book
        assert book is not None
        while self._short(book):
            self._dispatch()
            await self._wait()
        return book.take(self.batch_size)

    def _short(self, book: SegmentBook) -> bool:
        """Whether a batch is still short, once ``max_lag`` dropped what it keeps out."""
        if self.max_lag is not None:
            self._drop_lagging(self.version - self.max_lag)
        return len(book.finished) < self.batch_size

    async def _start(self) -> None:
        """Send every env its reset; each is ready (and steps) once its own reset is done."""
        venv = self.venv
        spaces = venv.single_observation_space, venv.single_action_space
        book = SegmentBook(*spaces, venv.num_envs, self.length)
        await self._send_resets(list(range(venv.num_envs)), self.seed)
        self.book, self.last_actions = book, book.action_rows()


def _name(policy: Callable[..., Any]) -> str:
    """A policy's name for an error message."""
    return str(getattr(policy, "__qualname__", None) or type(policy).__qualname__)
