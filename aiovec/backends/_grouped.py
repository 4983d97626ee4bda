"""Envs grouped on workers: the policy shared by ``backend="process"`` and ``backend="ray"``.

Theory of operation.  The envs are split into W contiguous groups, one per
worker (a process, or a Ray actor).  `GroupedBackend` keeps everything about
that arrangement that does not depend on how a worker is reached; a backend
adds only its transport (``process.py``: pipes and shared memory; ``ray.py``:
actor calls and object refs).

- **Who owns an env.**  ``owner[i]`` is the worker hosting env ``i``, for the
  vector env's whole life: a worker that is replaced hosts the same group.
  `parts` splits a call into one request per worker, by local index.
- **What is in flight.**  Each request is a `Request`: its worker, its envs,
  when it started.  ``waiting_on[i]`` is the request env ``i`` waits on; a
  reply is delivered only to the envs still waiting on it (`waiting`).
- **Cancel.**  A worker cannot be interrupted: `cancel` reports the envs as
  cancelled at once, marks their request *partial*, and keeps it in ``stuck``
  (the worker still runs it).  Its late reply is dropped.  A stuck worker is
  replaced, not reused, when its envs are rebuilt.
- **A worker dies** (killed, crashed, its node lost, or its reply unreadable):
  `lose` fails its envs in flight with one `WorkerDiedError` whose cause is a
  ``ChildProcessError`` saying which worker died and how, and leaves all its
  envs *lost*.  Any later call on a lost env fails at once with a
  `WorkerDiedError` too (`fail_lost`), until `rebuild` replaces the worker.
- **Replies to outcomes.**  `deliver_calls` and `deliver_step` turn a worker's
  typed reply (``_messages.py``) into one outcome per waiting env: a value,
  an error, or a row of the step block the transport builds.
- **Rebuild.**  `rebuild` rebuilds envs inside a healthy worker; a dead or
  stuck worker is replaced by a new one (logged as a warning on the
  ``aiovec`` logger), whose envs must have the spaces of the others
  (`check_rebuilt_spaces`).
- **Close.**  `close_live_envs` closes every env not lost within
  `CLOSE_TIMEOUT`; the transport then stops its workers.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio

from aiovec._core.calls import CLOSE
from aiovec._core.ops import CallOp, Op
from aiovec._core.rows import Rows, StepBlock
from aiovec._errors import EnvError, WorkerDiedError
from aiovec._log import logger
from aiovec.backends._base import Backend, EnvTraits, check_rebuilt_spaces
from aiovec.backends._messages import Failed, Outcome, Ready, StepReply

__all__ = (
    "GroupedBackend",
    "Request",
    "close_op",
    "join_traits",
    "ready_traits",
    "split",
)


def split(num_envs: int, count: int) -> list[range]:
    """``count`` contiguous groups of envs whose sizes differ by one at most."""
    size, extra = divmod(num_envs, count)
    bounds = [w * size + min(w, extra) for w in range(count + 1)]
    return [range(bounds[w], bounds[w + 1]) for w in range(count)]


def ready_traits(body: Ready | Failed) -> EnvTraits:
    """The traits a new worker reported, or the error its construction raised."""
    if isinstance(body, Failed):
        if body.by_factory:
            index = body.env_index
            raise EnvError({index: body.error}, f"env_fns[{index}]()") from body.error
        raise body.error
    return body.traits


def join_traits(parts: Sequence[EnvTraits]) -> EnvTraits:
    """The traits of all envs, from those of each group in order."""
    return EnvTraits(
        [space for t in parts for space in t.observation_spaces],
        [space for t in parts for space in t.action_spaces],
        parts[0].metadata,
        parts[0].render_mode,
    )


def close_op(count: int) -> CallOp:
    """The op that closes ``count`` envs."""
    return CallOp([CLOSE] * count, "close")


class Request:
    """A request in flight: its worker, its envs, when it started; or a control future."""

    __slots__ = ("envs", "future", "partial", "since", "worker")

    def __init__(
        self,
        worker: Any,
        envs: Sequence[int],
        since: float,
        future: asyncio.Future[Any] | None = None,
    ) -> None:
        self.worker, self.envs, self.since, self.future = worker, envs, since, future
        self.partial = False  # some of its envs were cancelled


class GroupedBackend(Backend):
    """A backend whose envs live in groups on workers; subclasses add the transport.

    A subclass sets the groups (`set_groups`) before any call, keeps its
    workers in ``workers`` (``workers[w]`` hosts ``groups[w]``; each has a
    ``group`` and a ``describe()``), and implements the transport: `request`,
    `step_arrays`, `rebuild_in_place` and `replace` (and may override
    `launch_whole` and `step_rows`).
    """

    workers: list[Any]

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Configure the transport, start one worker per group, learn the envs' traits."""
        super().__init__(env_fns, num_workers, limiter, options)
        self._fns = list(env_fns)
        self.workers = []
        count = self.configure(num_workers, dict(options or {}))
        self.set_groups(split(self.num_envs, min(count, self.num_envs)))
        try:
            self.traits = join_traits(self.start_workers())
            self.started()
        except BaseException:
            self.close_now()
            raise

    @abc.abstractmethod
    def configure(self, num_workers: int | None, options: dict[str, Any]) -> int:
        """Read the backend's options (nothing started yet); the default number of workers."""

    @abc.abstractmethod
    def start_workers(self) -> list[EnvTraits]:
        """Start a worker per group (`groups`) into `workers`; each group's traits, in order."""

    def started(self) -> None:
        """Every worker is up and `traits` known: finish setting up (e.g. share memory)."""

    def _new_results(self) -> Rows:
        return Rows()

    def set_groups(self, groups: list[range]) -> None:
        """Host ``groups[w]`` on worker ``w``."""
        self.groups = groups
        self.owner = [w for w, group in enumerate(groups) for _ in group]
        self.all = range(self.num_envs)
        self.waiting_on: list[Request | None] = [None] * self.num_envs
        self.stuck: dict[int, Request] = {}  # env -> its abandoned request still running
        self._lost: set[int] = set()  # envs whose worker died

    @property
    def lost(self) -> frozenset[int]:
        """Envs whose worker died, until `rebuild` starts a new one for them."""
        return frozenset(self._lost)

    @property
    def num_workers(self) -> int:
        """How many workers host the envs."""
        return len(self.workers)

    # -- calls -------------------------------------------------------------------------

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Make one request per worker hosting some of ``indices``; returns at once."""
        since = time.perf_counter()
        self.pending.update(indices)
        if indices == self.all and not self._lost:  # each worker gets its whole group
            if self.launch_whole(op, since):
                return
            self._started[:] = [since] * self.num_envs
            for worker in self.workers:
                self.request(worker, worker.group, op.subset(worker.group), since)
            return
        for i in indices:
            self._started[i] = since
        for w, envs, part in self.parts(indices, op):
            self.request(self.workers[w], envs, part, since)

    def launch_whole(self, op: Op, since: float) -> bool:
        """Start ``op`` on every env a way of the transport's own, if it has one for it."""
        return False

    @abc.abstractmethod
    def request(self, worker: Any, envs: Sequence[int], op: Op, since: float) -> None:
        """Send ``op`` for ``envs`` (all hosted by ``worker``); its reply comes to the loop."""

    def unsendable(self, envs: Sequence[int], op: Op, error: Exception) -> None:
        """``op`` cannot be sent to ``envs`` (e.g. an argument that does not pickle)."""
        for i in envs:
            self._finish(i, None, TypeError(f"cannot send {op.name}() to env {i}: {error}"))

    def parts(self, indices: Sequence[int], op: Op) -> Iterable[tuple[int, list[int], Op]]:
        """Each worker's part of ``op``: ``(w, envs, op part)`` (lost envs fail at once)."""
        by_worker: dict[int, list[int]] = {}
        owner, lost = self.owner, self._lost
        for k, i in enumerate(indices):
            by_worker.setdefault(owner[i], []).append(k)
        for w, given in by_worker.items():
            positions = given
            if lost:
                self.fail_lost(indices[k] for k in given)
                positions = [k for k in given if indices[k] not in lost]
                if not positions:
                    continue
            yield w, [indices[k] for k in positions], op.subset(positions)

    def fail_lost(self, envs: Iterable[int]) -> None:
        """Fail those of ``envs`` that are lost, as their worker's death did."""
        lost = [i for i in envs if i in self._lost]
        if not lost:
            return
        died = ChildProcessError(
            f"the worker hosting env(s) {lost} died; their envs are gone "
            "(reset() or on_error='restart' rebuilds them on a new worker)"
        )
        self._fail_gone(lost, died)

    def wait_on(self, request: Request, envs: Sequence[int]) -> None:
        """The envs ``envs`` now wait on ``request``."""
        if isinstance(envs, range):
            self.waiting_on[envs.start : envs.stop] = [request] * len(envs)
        else:
            for i in envs:
                self.waiting_on[i] = request

    def waiting(self, request: Request) -> Sequence[int]:
        """The envs of ``request`` still waiting on it (others were cancelled); now none."""
        waiting_on = self.waiting_on
        envs = request.envs
        if not request.partial:
            if isinstance(envs, range):
                waiting_on[envs.start : envs.stop] = [None] * len(envs)
            else:
                for i in envs:
                    waiting_on[i] = None
            return envs
        waiting = []
        for i in envs:
            if waiting_on[i] is request:
                waiting_on[i] = None
                waiting.append(i)
            elif self.stuck.get(i) is request:  # an abandoned call's late outcome: dropped
                del self.stuck[i]
        return waiting

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Abandon the calls in flight (of ``indices``, or all): workers run them to the end."""
        for i in list(self.pending if indices is None else self.pending.intersection(indices)):
            request, self.waiting_on[i] = self.waiting_on[i], None
            if request is not None:
                self.stuck[i] = request
                request.partial = True
            self._finish(i, None, asyncio.CancelledError(f"env {i}'s call was abandoned"))

    # -- replies -----------------------------------------------------------------------

    def deliver_calls(self, request: Request, outcomes: list[Outcome]) -> None:
        """A call's reply: each waiting env's outcome."""
        waiting = set(self.waiting(request))
        for i, (value, error) in zip(request.envs, outcomes, strict=True):
            if i in waiting:
                self._finish(i, value, error)

    def deliver_step(self, request: Request, reply: StepReply) -> None:
        """A step's reply: errors and odd transitions one by one, the rest as one block."""
        errors, infos, finals, odd, _ = reply
        waiting = self.waiting(request)
        first = request.worker.group.start
        if errors or odd or request.partial:
            waiting_set = set(waiting)
            for j, error in errors.items():
                if first + j in waiting_set:
                    self._finish(first + j, None, error)
            for j, transition in odd.items():
                if first + j in waiting_set:
                    self._finish(first + j, transition, None)
            waiting = [i for i in waiting if i - first not in errors and i - first not in odd]
        if not waiting:
            return
        block = StepBlock(
            self.step_rows(request, waiting, reply),
            self.step_arrays(),
            {first + j: info for j, info in infos.items()},
            {first + j: final for j, final in finals.items()},
        )
        self._finish_block(block, request.since)

    def step_rows(self, request: Request, rows: Sequence[int], reply: StepReply) -> Sequence[int]:
        """Make the step rows ``rows`` of ``reply`` readable in `step_arrays`; the block's envs."""
        return rows

    @abc.abstractmethod
    def step_arrays(self) -> Any:
        """The step arrays a step's block of rows is read from."""

    # -- deaths ------------------------------------------------------------------------

    def lose(self, worker: Any, cause: ChildProcessError) -> None:
        """``worker`` died (``cause`` says how): lose its envs, fail those in flight."""
        group = worker.group
        self._lost.update(group)
        for i in group:
            self.stuck.pop(i, None)
        self.fail_waiting(worker, cause)

    def fail_waiting(self, worker: Any, cause: ChildProcessError) -> None:
        """Fail the envs waiting on ``worker`` (not on a worker that replaced it)."""
        waiting_on = self.waiting_on
        waiting = [
            i for i in worker.group if (r := waiting_on[i]) is not None and r.worker is worker
        ]
        for i in waiting:
            waiting_on[i] = None
        if waiting:
            error = WorkerDiedError(dict.fromkeys(waiting, cause), worker.describe())
            for i in waiting:
                self._finish(i, None, error)

    # -- rebuilding ------------------------------------------------------------------

    def healthy(self, w: int) -> bool:
        """Whether worker ``w`` can rebuild envs itself (not dead, lost or stuck)."""
        return not any(i in self.stuck or i in self._lost for i in self.groups[w])

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Rebuild envs in their worker; a dead or stuck worker is replaced by a new one."""
        by_worker: dict[int, list[int]] = {}
        for i in indices:
            by_worker.setdefault(self.owner[i], []).append(i)
        calls = [self._rebuild_group(w, envs) for w, envs in by_worker.items()]
        errors: dict[int, BaseException] = {}
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        for envs, outcome in zip(by_worker.values(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                errors.update(dict.fromkeys(envs, outcome))
            else:
                errors.update(outcome)
        return errors

    async def _rebuild_group(self, w: int, envs: list[int]) -> dict[int, BaseException]:
        first = self.groups[w].start
        if self.healthy(w):
            failed = await self.rebuild_in_place(w, [i - first for i in envs])
            if failed is not None:
                return {first + j: error for j, error in failed.items()}
        logger.warning(
            "replacing the %s (envs %s): it died or is stuck in an abandoned call",
            self.workers[w].describe(),
            envs,
        )
        traits = await self.replace(w)
        want = (self.traits.observation_spaces[0], self.traits.action_spaces[0])
        for i in envs:
            j = i - first
            check_rebuilt_spaces(i, (traits.observation_spaces[j], traits.action_spaces[j]), want)
        self._lost.difference_update(envs)
        return {}

    @abc.abstractmethod
    async def rebuild_in_place(self, w: int, locals_: list[int]) -> dict[int, BaseException] | None:
        """Rebuild envs ``locals_`` inside worker ``w``: the failures, or ``None`` if it died."""

    @abc.abstractmethod
    async def replace(self, w: int) -> EnvTraits:
        """Stop worker ``w`` (if it still runs) and start a new one: its envs' traits."""

    # -- closing ---------------------------------------------------------------------

    async def close_live_envs(self) -> dict[int, BaseException]:
        """Close every env not lost (within `CLOSE_TIMEOUT`); errors by env."""
        alive = [i for i in range(self.num_envs) if i not in self._lost]
        return await self._close_envs(alive)
