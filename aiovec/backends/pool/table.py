"""Where every env of the pool stands: the state table (no loop, no transport).

The pool (`Pool`, process and Ray alike) keeps one `WorkTable`: which worker
hosts each env, which request each env waits on (the one in-flight registry),
which abandoned calls still run (*stuck*), which workers such a call blocks,
and which envs are *lost* with their worker.  Nothing here sends, waits or
reports an outcome: the table answers questions and records changes, and the
backend acts on the answers.

- **Waiting.**  ``waiting_on[i]`` is the request env ``i`` waits on;
  `waiting` says which envs of a request a reply still reaches.
- **Stuck and blocked.**  An abandoned call that its worker cannot cancel (a
  sync env's) is *stuck* until the worker's late outcome for it comes;
  meanwhile its worker is *blocked* (`block_workers`), and every env of that
  worker counts as lost.  `unblock` ends that once none of its sync envs is
  stuck.
- **Lost.**  A worker that died loses its whole group (`lose`) until it is
  rebuilt.
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from aiovec._core.ops import Op, StepOp
from aiovec._errors import LostWithWorkerError
from aiovec.backends.pool.messages import Ready, RebuildReply

__all__ = ("Request", "WorkTable")


class Request:
    """A request in flight: its worker, its envs, its call, when it started; or a control future.

    A whole step that a sync env may block (`WorkTable.track`) *holds*
    the parts its worker publishes early (``held``; their envs in ``done``)
    until its last part: should the worker be blocked before then, its
    finished envs are lost with it.
    """

    __slots__ = (
        "done",
        "envs",
        "future",
        "held",
        "left",
        "name",
        "partial",
        "seq",
        "since",
        "worker",
    )

    def __init__(
        self,
        worker: Any,
        envs: Sequence[int],
        since: float,
        future: Any = None,
        name: str = "step",
        *,
        seq: int = 0,
    ) -> None:
        self.worker, self.envs, self.since, self.future = worker, envs, since, future
        self.name = name
        self.seq = seq  # its number, where the transport numbers requests
        self.left = len(envs)  # envs the worker has not reported yet (where a transport counts)
        self.partial = False  # some of its envs were cancelled, or delivered apart
        self.held: list[Any] | None = None  # parts held back (None: delivered as they come)
        self.done: set[int] = set()  # the envs of the held parts


class WorkTable:
    """The state of every env and worker of the pool.

    Args:
        groups: ``groups[w]`` is the envs hosted by worker ``w``.
        interrupts: Whether a worker can cancel an async env's call in flight.
        on_unblocked: Called when a blocked worker is free again.
    """

    def __init__(
        self, groups: list[range], interrupts: bool, on_unblocked: Callable[[], None]
    ) -> None:
        num_envs = groups[-1].stop
        self.groups = groups
        self.owner = [w for w, group in enumerate(groups) for _ in group]
        self.interrupts = interrupts
        self.waiting_on: list[Any] = [None] * num_envs  # env -> the request it waits on
        self.stuck: dict[int, Any] = {}  # env -> its abandoned request still running
        self.lost: set[int] = set()  # envs whose worker died
        self.asyncs = [False] * num_envs  # which envs are async (`note_ready`)
        self.blocked: dict[int, str] = {}  # worker -> the abandoned sync call it runs
        self.requests: dict[int, Request] = {}  # by number, where a transport numbers them
        self._on_unblocked = on_unblocked

    # -- what workers report -----------------------------------------------------------

    def note_ready(self, w: int, body: Any) -> None:
        """Worker ``w`` reported its envs (`Ready`): which of them are async."""
        if isinstance(body, Ready) and body.asyncs:
            group = self.groups[w]
            self.asyncs[group.start : group.stop] = body.asyncs
            self.blocked.pop(w, None)

    def note_rebuilt(self, w: int, reply: RebuildReply) -> dict[int, BaseException]:
        """Worker ``w`` rebuilt envs in place: which are async now; the errors, by local index.

        A factory may make a sync env one time and an async one the next.
        """
        first = self.groups[w].start
        for j, is_async in (reply.asyncs or {}).items():
            self.asyncs[first + j] = is_async
        return reply.errors

    def cancellable(self, i: int) -> bool:
        """Whether env ``i``'s call can be cancelled in its worker (an async env's, if so)."""
        return self.interrupts and self.asyncs[i]

    # -- calls -------------------------------------------------------------------------

    def parts(
        self, indices: Sequence[int]
    ) -> tuple[list[tuple[int, Sequence[int], Sequence[int]]], dict[int, list[int]], list[int]]:
        """Split a call on ``indices`` by worker: what to send, and who cannot be reached.

        Returns each worker's part ``(w, envs, positions in indices)`` (a whole
        group, in order, is named by its ``range``), the envs of each blocked
        worker, and the envs that are lost.
        """
        owner, lost, blocked, groups = self.owner, self.lost, self.blocked, self.groups
        by_worker: dict[int, list[int]] = {}
        ordered = bool(indices) and all(map(operator.lt, indices, islice(indices, 1, None)))
        if ordered:
            for w in range(owner[indices[0]], owner[indices[-1]] + 1):
                group = groups[w]  # its envs in indices: those at lo..hi
                lo, hi = bisect_left(indices, group.start), bisect_left(indices, group.stop)
                if hi > lo:
                    by_worker[w] = list(range(lo, hi))
        else:
            for k, i in enumerate(indices):
                by_worker.setdefault(owner[i], []).append(k)
        sends: list[tuple[int, Sequence[int], Sequence[int]]] = []
        unreachable: dict[int, list[int]] = {}
        gone: list[int] = []
        for w, given in by_worker.items():
            if ordered and not lost and len(given) == len(groups[w]) and w not in blocked:
                sends.append((w, groups[w], given))  # its whole group, in order
            elif w in blocked:
                unreachable[w] = [indices[k] for k in given]
            else:
                positions = given
                if lost:
                    gone.extend(indices[k] for k in given if indices[k] in lost)
                    positions = [k for k in given if indices[k] not in lost]
                if positions:
                    sends.append((w, [indices[k] for k in positions], positions))
        return sends, unreachable, gone

    def track(
        self, worker: Any, envs: Sequence[int], since: float, op: Op, seq: int = 0
    ) -> Request:
        """A new request of ``op`` for ``envs`` on ``worker``; a whole step with a sync env holds.

        Its finished envs' results are held back until its last part
        (`Pool.deliver_step`): a sync env may yet block their worker,
        which would then be replaced, with them.
        """
        request = Request(worker, envs, since, name=op.name, seq=seq)
        if type(op) is StepOp and not op.stream:
            asyncs = self.asyncs
            if isinstance(envs, range):
                sync = False in asyncs[envs.start : envs.stop]
            else:
                sync = not all(asyncs[i] for i in envs)
            if sync:
                request.held = []
        return request

    def lost_error(self, lost: list[int]) -> ChildProcessError:
        """Why a call on the ``lost`` envs fails: their worker died (or was replaced)."""
        return ChildProcessError(
            f"the worker hosting env(s) {lost} died (or was replaced); their envs are gone "
            "(reset() or on_error='restart' rebuilds them on a new worker)"
        )

    def blocked_error(self, i: int, worker: Any) -> TimeoutError:
        """Why a call on env ``i`` fails: its blocked ``worker`` still runs an abandoned call."""
        return TimeoutError(
            f"env {i} cannot be reached: its {worker.describe()} still runs "
            f"{self.blocked[self.owner[i]]}, abandoned (a sync env cannot be interrupted); "
            "reset() or on_error='restart' replaces the worker"
        )

    def by_owner(self, indices: Sequence[int]) -> dict[int, list[int]]:
        """``indices`` by the worker hosting them."""
        by_worker: dict[int, list[int]] = {}
        for i in indices:
            by_worker.setdefault(self.owner[i], []).append(i)
        return by_worker

    def turns(self, indices: Sequence[int]) -> list[int]:
        """``indices`` in the order slots go to them: each worker's first env, then second, ...

        So K ``max_concurrency`` slots keep up to K workers busy.
        """
        turn: dict[int, int] = {}
        order = []
        for i in indices:
            w = self.owner[i]
            n = turn[w] = turn.get(w, -1) + 1
            order.append((n, w, i))
        order.sort()
        return [i for _, _, i in order]

    # -- requests in flight ------------------------------------------------------------

    def wait_on(self, request: Any, envs: Sequence[int]) -> None:
        """The envs ``envs`` now wait on ``request``."""
        if isinstance(envs, range):
            self.waiting_on[envs.start : envs.stop] = [request] * len(envs)
        else:
            for i in envs:
                self.waiting_on[i] = request

    def waiting(self, request: Any, envs: Sequence[int] | None = None) -> Sequence[int]:
        """The envs of ``request`` (or those of it in ``envs``) still waiting on it; now none.

        Envs of it that were cancelled are no longer stuck: the worker is done with them.
        """
        waiting_on = self.waiting_on
        if envs is None:
            envs = request.envs
        else:
            request.partial = True  # delivered in parts: look env by env from now on
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
                self.unblock(self.owner[i])
        return waiting

    def unhold(self, request: Request, reply: Any) -> list[Any] | None:
        """The parts of ``request`` to deliver now that ``reply`` (a `StepReply`) came.

        ``None``: the request does not hold; deliver ``reply`` as it is.  A
        request that holds keeps each part but its last (recording its envs as
        done), then gives back every part.
        """
        held = request.held
        if held is None:
            return None
        if reply.envs is not None:
            held.append(reply)
            first = request.worker.group.start
            request.done.update(first + j for j in reply.envs)
            return []
        request.held = None
        request.done = set()
        return [*held, reply]

    def forget(self, worker: Any) -> list[Request]:
        """The numbered requests of ``worker`` (it died), forgotten here."""
        gone = [(seq, r) for seq, r in self.requests.items() if r.worker is worker]
        for seq, _ in gone:
            del self.requests[seq]
        return [r for _, r in gone]

    def holding(self, worker: Any) -> list[Any]:
        """The requests in flight on ``worker`` that hold results back (`Request.held`)."""
        waiting_on = self.waiting_on
        found = {
            id(r): r
            for i in worker.group
            if (r := waiting_on[i]) is not None and r.held and r.worker is worker
        }
        return list(found.values())

    def take_waiting(self, worker: Any) -> list[int]:
        """The envs waiting on ``worker`` (not on one that replaced it); they wait no more."""
        waiting_on = self.waiting_on
        waiting = [
            i for i in worker.group if (r := waiting_on[i]) is not None and r.worker is worker
        ]
        for i in waiting:
            waiting_on[i] = None
        return waiting

    # -- abandoned calls ---------------------------------------------------------------

    def abandon(
        self, targets: list[int], workers: Sequence[Any]
    ) -> tuple[dict[int, BaseException], dict[int, list[int]]]:
        """Abandon the calls of ``targets``: envs lost with a blocked worker; what to cancel.

        Returns the errors of envs lost with their worker (`block_workers`), and
        the async envs to cancel in each worker, by local index.  Every other
        target is simply cancelled: its request, if it still runs, is stuck.
        """
        interrupt: dict[int, list[int]] = {}
        lost = self.block_workers(targets, workers)
        for i in targets:
            if i in lost:
                continue
            request, self.waiting_on[i] = self.waiting_on[i], None
            if request is not None and not (request.done and i in request.done):
                self.stuck[i] = request
                request.partial = True
                if self.cancellable(i):
                    w = self.owner[i]
                    interrupt.setdefault(w, []).append(i - self.groups[w].start)
        return lost, interrupt

    def block_workers(self, targets: list[int], workers: Sequence[Any]) -> dict[int, BaseException]:
        """Mark the workers that an abandoned sync call of ``targets`` blocks; the envs lost.

        The blocking env of a worker is the first of its sync envs abandoned
        in the order the worker runs them; every other env waiting on that
        worker (not an async one, which the worker interrupts) is lost with
        it: its call is abandoned too (its late outcome will be dropped), and
        a result held back is dropped now.
        """
        blockers: dict[int, tuple[tuple[float, int], int, Any]] = {}
        for i in targets:
            request = self.waiting_on[i]
            w = self.owner[i]
            if (
                request is None
                or (request.done and i in request.done)
                or self.cancellable(i)
                or w in self.blocked
            ):
                continue
            key = (request.since, request.envs.index(i))
            if w not in blockers or key < blockers[w][0]:
                blockers[w] = (key, i, request)
        lost: dict[int, BaseException] = {}
        for w, (_, b, request) in blockers.items():
            worker = workers[w]
            self.blocked[w] = f"the {request.name}() call of env {b}"
            for i in self.groups[w]:
                on = self.waiting_on[i]
                if i == b or on is None or on.worker is not worker:
                    continue
                held = bool(on.done) and i in on.done
                if not held and self.cancellable(i):
                    continue
                self.waiting_on[i] = None
                on.partial = True
                if not held:
                    self.stuck[i] = on
                lost[i] = LostWithWorkerError(
                    f"env {i} was lost with its worker, blocked by env {b}: the "
                    f"{worker.describe()} still runs env {b}'s {request.name}() call, "
                    "abandoned (a sync env cannot be interrupted); reset() or "
                    "on_error='restart' replaces the worker",
                    b,
                )
        return lost

    def unblock(self, w: int) -> None:
        """Worker ``w`` is no longer blocked if none of its sync envs is stuck."""
        if w in self.blocked and not any(
            i in self.stuck and not self.cancellable(i) for i in self.groups[w]
        ):
            del self.blocked[w]
            self._on_unblocked()

    # -- deaths and rebuilds -----------------------------------------------------------

    def lose(self, group: range) -> None:
        """The worker hosting ``group`` died: its envs are lost, none stuck any more."""
        self.lost.update(group)
        for i in group:
            self.stuck.pop(i, None)
        self.unblock(self.owner[group.start])

    def lost_envs(self) -> frozenset[int]:
        """Envs whose worker died or is blocked."""
        if not self.blocked:
            return frozenset(self.lost)
        return frozenset(self.lost.union(*(self.groups[w] for w in self.blocked)))

    def healthy(self, w: int, alive: bool) -> bool:
        """Whether worker ``w`` (``alive`` or not) can rebuild envs itself.

        Not if it is blocked or stuck.  A worker whose stuck envs are async only
        has cancelled their calls: it rebuilds them once those have ended.  A
        new worker that replaced a dead one rebuilds in place its envs still
        marked lost (not all of them: a worker whose every env is lost is dead,
        or failed to build them).
        """
        group = self.groups[w]
        if not alive or w in self.blocked or self.lost.issuperset(group):
            return False
        return self.interrupts or not any(i in self.stuck for i in group)
