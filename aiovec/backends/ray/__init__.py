"""``backend="ray"``: envs in Ray actors, several envs per actor, on any Ray cluster.

Theory of operation.  The envs are split into W contiguous groups, one per Ray
actor.  What envs grouped on workers mean (who owns an env, cancel, a worker's
death, lost envs, rebuild, close) is the pool's (``backends/pool/``), as for
the process backend; this package is its transport (`RayTransport`): actors
and object refs.  An actor (`GroupActor`, ``actor.py``) starts empty; once
Ray has placed it (a wait bounded by ``placement_timeout``), its ``load`` call
builds its group from the cloudpickled factories into a `Worker`
(``pool/host/``), the very object a worker process serves, and hands every
request to the same dispatch: the per-env rules (autoreset, errors as values)
are written once, in the core, and driven there.  The actor is an async actor
that takes many calls at once: its sync envs still run one at a time (on its
event loop, which they hold while they run), and the calls of its async envs
run as tasks on that loop, so that a `GroupActor.cancel` (a timeout, a Ctrl-C,
``close()``) can cancel one env's call while the others go on.  Each call
carries the parent's request number: a cancel that overtakes its call is kept
until the call starts.  A whole step or a call is answered once, for all its
envs; a streamed step (``send()``), and a whole step under a
``step_timeout``, in parts, as they end (a whole step's parent holds its sync
envs' parts until the last: see `WorkTable.track`), so that a deadline
blames the env that did not answer and keeps the results of those that did.

``send`` makes one remote call per actor hosting some of the envs, and turns
each returned object ref into an asyncio future (``ObjectRef.future`` through
``asyncio.wrap_future``); its completion calls back on the event loop.  Nothing
here blocks on ``ray.get`` once the vector env is built (construction has no
loop, and waits for the actors to report their envs).

A step's reply is the worker's `StepReply` carrying the actor's step arrays
(``rows``): the group's observations, rewards and flags written in place
(``_core/layout.py``), as one numpy byte array.  The parent copies the rows of
the envs still waiting into a receive buffer of its own and hands them to the
batcher as one `StepBlock`.  Nothing is shared across nodes.

An actor that dies (killed, its process or its node lost) is seen as a Ray
error on a call's reply: `Pool.lose` does the rest, Ray's exception the cause
of the death.  Replacing an actor (`replace`) kills the old one and starts a
new one for the same group, waiting for its placement within
``placement_timeout``.

On ``aclose`` the actors are killed, or, with an `ActorPool`, those whose envs
all closed cleanly are kept idle for the next vector env to ``load`` its own
group into: a new actor costs a process start, a pooled one a remote call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, TypeVar

import cloudpickle
import ray
import ray.exceptions

from aiovec._core import validate
from aiovec._core.layout import StepArrays, StepLayout, copy_rows
from aiovec._core.ops import Op, StepOp
from aiovec._errors import WorkerDiedError
from aiovec.backends import _drive as drive
from aiovec.backends._base import EnvTraits
from aiovec.backends.pool.messages import (
    Failed,
    Ready,
    RebuildReply,
    StepReply,
    StepRequest,
)
from aiovec.backends.pool.pool import STUCK_GRACE, Pool
from aiovec.backends.pool.table import Request
from aiovec.backends.pool.transport import Part, close_op, ready_traits
from aiovec.backends.ray.actor import GroupActor

__all__ = ("ACTOR_OPTIONS", "ActorPool", "RayBackend", "RayTransport")

ACTOR_OPTIONS = frozenset(
    {
        "num_cpus",
        "num_gpus",
        "memory",
        "resources",
        "accelerator_type",
        "scheduling_strategy",
        "runtime_env",
        "label_selector",
    }
)
"""The Ray actor options ``backend_options`` may hold (passed to ``.options()``)."""
POOL_OPTION = "actor_pool"
"""A ``backend_options`` entry of aiovec's own: an `ActorPool` to take actors from."""
PLACEMENT_OPTION = "placement_timeout"
"""A ``backend_options`` entry of aiovec's own: seconds a new actor may take to be placed."""
PLACEMENT_TIMEOUT = 120.0
"""The default ``placement_timeout``: a new actor's wait for resources and a process."""

_DEFAULT_OPTIONS: dict[str, Any] = {
    # A token share of a CPU: actors that reserve nothing once placed (Ray's
    # default) all land on one node, whatever the strategy; this spreads them
    # without ever making one wait for a free CPU.
    "num_cpus": 0.01,
    "scheduling_strategy": "SPREAD",
}
_DEATHS = (ray.exceptions.RayError,)  # of the actor: killed, its process or node gone, ...
_RAISED = ray.exceptions.RayTaskError  # ... unless the call itself raised (not the envs)
T = TypeVar("T")


# Many calls at once (see `GroupActor.cancel`); an async actor's default is 1000.
_RemoteGroup = ray.remote(max_restarts=0, max_concurrency=1000)(GroupActor)


class ActorPool:
    """Idle Ray actors, kept when a vector env closes for the next one to host its envs in.

    Starting an actor starts a Python process that imports Ray, numpy, gymnasium
    and aiovec (about a second, most of it CPU, per actor); loading a new group of
    envs into an idle actor is one remote call.  Pass the pool to every vector env
    that should share it (``backend_options={"actor_pool": pool}``): on `close`,
    each actor whose envs all closed cleanly (no error, no call still running,
    alive) goes back to the pool instead of being killed, and a later vector env
    with the same actor options takes idle actors (spread over their nodes) before
    starting new ones.  An idle actor keeps the resources it reserved (``num_cpus``
    and so on) and its process: what the last envs left in it (module globals,
    threads they did not stop) stays, as in Ray's own reused task workers.

    Closing the pool kills its idle actors; actors given back to a closed pool are
    killed at once.  Use it as a context manager, or call `close`.

    Args:
        max_idle: The most idle actors kept; one more given back is killed.
    """

    def __init__(self, max_idle: int = 64) -> None:
        if isinstance(max_idle, bool) or not isinstance(max_idle, int):
            raise TypeError(f"max_idle must be an int, got {validate.describe(max_idle)}")
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[tuple[dict[str, Any], str, Any, str | None]] = []
        self._closed = False
        self.reused = 0
        """How many actors vector envs took from the pool so far."""

    def __len__(self) -> int:
        """How many idle actors the pool holds."""
        return len(self._idle)

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    def take(self, options: Mapping[str, Any], count: int) -> list[tuple[Any, str | None]]:
        """Up to ``count`` idle actors made with ``options``: (handle, node id), nodes spread."""
        job = _job_id()
        with self._lock:
            self._idle = [entry for entry in self._idle if entry[1] == job]  # others ended
            matching = [k for k, entry in enumerate(self._idle) if entry[0] == options]
            chosen: list[int] = []
            nodes: set[str | None] = set()
            for k in matching:  # one per node first, then any
                if len(chosen) < count and self._idle[k][3] not in nodes:
                    chosen.append(k)
                    nodes.add(self._idle[k][3])
            chosen += [k for k in matching if k not in chosen][: count - len(chosen)]
            taken = [(self._idle[k][2], self._idle[k][3]) for k in chosen]
            self._idle = [entry for k, entry in enumerate(self._idle) if k not in chosen]
            self.reused += len(taken)
        return taken

    def give(self, options: Mapping[str, Any], handle: Any, node_id: str | None) -> None:
        """Keep an actor made with ``options``, its envs closed; kill it if full or closed."""
        with self._lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append((dict(options), _job_id(), handle, node_id))
                return
        _kill(handle)

    def close(self) -> None:
        """Kill every idle actor; actors given back from now on are killed at once."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        if not ray.is_initialized():  # Ray shut down: the actors went with their job
            return
        job = _job_id()
        for _, made_in, handle, _ in idle:
            if made_in == job:  # else its job ended, and the actor with it
                _kill(handle)


class _Actor:
    """The parent's handle on one actor: its group of envs, its node, whether it lives."""

    __slots__ = ("alive", "group", "handle", "layout", "node_id", "placed", "reused")

    def __init__(self, handle: Any, group: range, reused: bool = False) -> None:
        self.handle, self.group, self.reused = handle, group, reused
        self.placed: Any = None  # a new actor's ref that answers once it runs
        self.alive = True
        self.node_id: str | None = None
        self.layout: StepLayout | None = None  # of its step arrays

    def describe(self) -> str:
        where = f" on node {self.node_id}" if self.node_id else ""
        return f"Ray actor hosting envs {self.group.start}-{self.group.stop - 1}{where}"

    def death(self, cause: BaseException) -> ChildProcessError:
        """How it died (``cause``: Ray's word), as the cause of its envs' `WorkerDiedError`."""
        died = ChildProcessError(f"{self.describe()} died ({type(cause).__name__})")
        died.__cause__ = cause
        return died


class RayTransport:
    """Carries a pool's requests to Ray actors; awaits their replies as asyncio futures.

    The program normally connects to its cluster first (``ray.init(address=...)``);
    if it has not, ``ray.init()`` runs with Ray's defaults (``RAY_ADDRESS``, or a
    new local instance), as Ray itself would on first use.

    Args:
        pool: The pool it carries requests for.
        options: Ray actor options for every actor (`ACTOR_OPTIONS`), and an
            `ActorPool` to take actors from and give them back to
            (``"actor_pool"``).
    """

    INTERRUPTS: ClassVar[bool] = True

    def __init__(self, pool: Pool, options: dict[str, Any]) -> None:
        """Connect to Ray, read the options; one actor per CPU of the cluster by default."""
        self.pool = pool
        self.workers: list[_Actor] = []
        if not ray.is_initialized():  # as Ray would on first use: RAY_ADDRESS, or a local one
            ray.init()
        self._pool: ActorPool | None = options.pop(POOL_OPTION, None)
        if self._pool is not None and not isinstance(self._pool, ActorPool):
            raise TypeError(
                f"backend_options[{POOL_OPTION!r}] must be an aiovec.backends.ray.ActorPool, "
                f"got {type(self._pool).__name__}"
            )
        self._placement_timeout = _check_timeout(options.pop(PLACEMENT_OPTION, PLACEMENT_TIMEOUT))
        self._options = {**_DEFAULT_OPTIONS, **options}
        self._remote = _RemoteGroup.options(**self._options)  # Ray checks the options
        self._receive: StepArrays | None = None  # step rows, copied out of the replies
        # streamed steps being received, and the request each answers
        self._streams: dict[asyncio.Task[None], Request] = {}
        self._seq = 0  # the number of the newest request (an actor cancels by it)
        self._finalizer = weakref.finalize(self, _kill_all, self.workers)
        self.default_workers = _cluster_cpus()

    def start(self) -> list[EnvTraits]:
        """An actor per group (idle ones from the pool first), each loading its envs."""
        groups = self.pool.groups
        idle = self._pool.take(self._options, len(groups)) if self._pool else []
        refs = []
        for k, group in enumerate(groups):
            actor, placed, loaded = self._start(group, idle[k] if k < len(idle) else None)
            self.workers.append(actor)
            refs.append((placed, loaded))
        traits = [self._await_ready(w, *pair) for w, pair in enumerate(refs)]
        self._spaces = (traits[0].observation_spaces[0], traits[0].action_spaces[0])
        layout = StepLayout.of(*self._spaces, self.pool.num_envs)
        if layout is not None:  # the step rows of each actor, and the buffer they go into
            self._receive = layout.arrays(bytearray(layout.nbytes))
            for actor in self.workers:
                actor.layout = StepLayout.of(*self._spaces, len(actor.group))
        return traits

    @property
    def node_ids(self) -> tuple[str | None, ...]:
        """The Ray node each actor runs on (for diagnostics and tests)."""
        return tuple(actor.node_id for actor in self.workers)

    @property
    def actors(self) -> tuple[Any, ...]:
        """The actor handles (for diagnostics and tests)."""
        return tuple(actor.handle for actor in self.workers)

    def _start(
        self, group: range, idle: tuple[Any, str | None] | None = None
    ) -> tuple[_Actor, Any, Any]:
        """An actor for ``group`` (``idle``: one from the pool) loading its envs.

        Returns the actor, the ref that answers once it is placed (``None`` for an
        idle one: placed long ago), and the ref of its `GroupActor.load` reply.
        """
        try:
            payload = cloudpickle.dumps([self.pool.fns[i] for i in group])
        except Exception as exc:
            raise TypeError(
                f"env_fns[{group.start}:{group.stop}] cannot be sent to a Ray actor "
                f"(they must pickle with cloudpickle): {exc}"
            ) from exc
        if idle is None:
            actor = _Actor(self._remote.remote(), group)
            actor.placed = actor.handle.placed.remote()
        else:
            actor = _Actor(idle[0], group, reused=True)
            actor.node_id = idle[1]
        return actor, actor.placed, actor.handle.load.remote(payload, group.start)

    def _await_ready(self, w: int, placed: Any, loaded: Any) -> EnvTraits:
        """The traits actor ``w`` reports (construction: no loop, this waits on Ray).

        A new actor must be placed within the placement timeout; an idle one found
        dead (its node lost, ...) is replaced by a new one.
        """
        actor = self.workers[w]
        if placed is not None:
            try:
                ray.get(placed, timeout=self._placement_timeout)
            except ray.exceptions.GetTimeoutError:
                raise self._not_placed(actor) from None
            except _DEATHS:  # its load fails the same way: reported below
                pass
        elif actor.reused:
            try:
                ray.get(loaded)
            except ray.exceptions.RayActorError:
                actor.alive = False
                actor, placed, loaded = self._start(actor.group)
                self.workers[w] = actor
                return self._await_ready(w, placed, loaded)
            except _DEATHS:  # reported below
                pass
        return self._check_ready(actor, _ready(actor, loaded))

    def _not_placed(self, actor: _Actor) -> TimeoutError:
        asks = {k: v for k, v in self._options.items() if k not in ("runtime_env",)}
        return TimeoutError(
            f"the {actor.describe()} was not placed within {self._placement_timeout} s: no "
            f"node of the Ray cluster can take an actor with {asks} (were the resources on a "
            f"lost node? is the cluster still scaling up? then raise "
            f"backend_options[{PLACEMENT_OPTION!r}])"
        )

    def _check_ready(self, actor: _Actor, reply: Ready | Failed) -> EnvTraits:
        """The traits a new actor reported (its node and async envs noted), or its error."""
        traits = ready_traits(reply)
        assert isinstance(reply, Ready)
        actor.node_id = reply.node_id
        self.pool.table.note_ready(self.workers.index(actor), reply)
        return traits

    # -- running ops -------------------------------------------------------------------

    def send(self, parts: list[Part], op: Op, since: float, whole: bool) -> None:
        """One remote call per part; each reply comes to the loop."""
        for w, envs, positions in parts:
            self._request(self.workers[w], envs, op.subset(positions), since)

    def _request(self, worker: _Actor, envs: Sequence[int], op: Op, since: float) -> None:
        """Call ``op`` for ``envs`` (all hosted by ``worker``); the reply comes to the loop."""
        first = worker.group.start
        locals_ = [i - first for i in envs]
        self._seq += 1
        seq = self._seq
        table = self.pool.table
        try:
            if isinstance(op, StepOp) and (op.stream or op.timed):  # its parts as envs finish
                message = StepRequest(
                    seq, locals_, op.mode.value, list(op.reset_first), list(op.actions), True
                )
                parts = worker.handle.step_stream.options(num_returns="streaming").remote(message)
                request = table.track(worker, envs, since, op, seq)
                table.wait_on(request, envs)
                task = asyncio.get_running_loop().create_task(self._stream(request, parts))
                self._streams[task] = request
                task.add_done_callback(self._stream_ended)
                return
            if isinstance(op, StepOp):
                message = StepRequest(
                    seq, locals_, op.mode.value, list(op.reset_first), list(op.actions)
                )
                ref = worker.handle.step.remote(message)
            else:
                ref = worker.handle.call.remote(seq, locals_, op)
        except Exception as exc:  # e.g. an argument that cannot be serialised
            self.pool.unsendable(envs, op, exc)
            return
        request = table.track(worker, envs, since, op, seq)
        table.wait_on(request, envs)
        future = _future(ref)
        future.add_done_callback(functools.partial(self._deliver, request))

    async def _stream(self, request: Request, parts: Any) -> None:
        """Deliver a streamed step's parts as the actor yields them."""
        try:
            async for ref in parts:
                self.pool.deliver_step(request, await ref)
        except _RAISED as exc:  # the call itself failed
            for i in self.pool.table.waiting(request):
                self.pool._finish(i, None, exc)
        except _DEATHS as exc:
            self._on_death(request.worker, exc)

    def _stream_ended(self, task: asyncio.Task[None]) -> None:
        del self._streams[task]

    def receive(self, need: Any, deadline: float | None) -> bool:
        """Replies come to the loop by themselves: nothing to take in, never waits here."""
        return False

    async def settle_cancelled(self) -> None:
        """Receive the streamed steps no env waits on to their end (`STUCK_GRACE` s at most).

        Their envs were all cancelled or answered, and are all async: an async env's
        call cancelled in its actor ends at once, the stream's last part follows, and no
        task of a call that already raised is left running.  (A sync env's call runs on
        to its end, blocking its actor: its stream is not waited for.)
        """
        table = self.pool.table
        waiting_on = table.waiting_on
        ended = [
            task
            for task, request in self._streams.items()
            if all(waiting_on[i] is not request and table.cancellable(i) for i in request.envs)
        ]
        if ended:
            await asyncio.wait(ended, timeout=STUCK_GRACE)

    def _deliver(self, request: Request, future: asyncio.Future[Any]) -> None:
        """On the loop: a remote call ended; hand its envs' outcomes over."""
        pool = self.pool
        try:
            reply = future.result()
        except _RAISED as exc:  # the call itself failed (e.g. a reply that did not serialise)
            for i in pool.table.waiting(request):
                pool._finish(i, None, exc)
            return
        except _DEATHS as exc:
            self._on_death(request.worker, exc)
            return
        except BaseException as exc:
            for i in pool.table.waiting(request):
                pool._finish(i, None, exc)
            return
        pool.deliver(request, reply)

    def rows_of(self, request: Request, rows: Sequence[int], reply: StepReply) -> Any:
        """Copy ``rows`` out of the actor's step arrays into the receive buffer."""
        actor = request.worker
        assert actor.layout is not None
        assert reply.rows is not None
        assert self._receive is not None  # else every env is odd
        _copy_step_rows(self._receive, actor.layout.arrays(reply.rows), rows, actor.group.start)
        return (actor.group if len(rows) == len(actor.group) else rows), self._receive

    def _on_death(self, actor: _Actor, cause: BaseException) -> None:
        """``actor`` died: fail its envs in flight, lose all its envs."""
        if not actor.alive:
            self.pool.fail_waiting(actor, actor.death(cause))
            return
        actor.alive = False
        with contextlib.suppress(Exception):  # if Ray only lost touch with it: it must go
            ray.kill(actor.handle, no_restart=True)
        self.pool.lose(actor, actor.death(cause))

    def interrupt(self, worker: _Actor, locals_: list[int]) -> None:
        """Ask ``worker`` to cancel the calls of its async envs ``locals_``, by request."""
        if not worker.alive:
            return
        first = worker.group.start
        by_request: dict[int, list[int]] = {}
        for j in locals_:
            by_request.setdefault(self.pool.table.stuck[first + j].seq, []).append(j)
        for seq, cancelled in by_request.items():
            with contextlib.suppress(Exception):  # a dead actor: its death is seen apart
                worker.handle.cancel.remote(seq, cancelled)

    def kill(self, w: int) -> None:
        """Kill actor ``w`` now (its envs are lost)."""
        actor = self.workers[w]
        if actor.alive:
            self._on_death(actor, RuntimeError("killed: it was blocked in an abandoned call"))

    # -- rebuilding ------------------------------------------------------------------

    async def rebuild_in_place(self, w: int, locals_: list[int]) -> dict[int, BaseException] | None:
        """Rebuild envs ``locals_`` in actor ``w``; ``None`` if it died meanwhile."""
        actor = self.workers[w]
        try:
            reply: RebuildReply = await _future(actor.handle.rebuild.remote(locals_))
        except _DEATHS as exc:
            self._on_death(actor, exc)
            return None
        return self.pool.table.note_rebuilt(w, reply)

    async def replace(self, w: int) -> EnvTraits:
        """Kill actor ``w`` (if it still runs) and start a new one for its group."""
        actor = self.workers[w]
        if actor.alive:
            ray.kill(actor.handle, no_restart=True)
            self._on_death(actor, RuntimeError("killed to be replaced"))
        new, placed, loaded = self._start(actor.group)
        self.workers[w] = new
        new.layout = actor.layout
        try:
            await asyncio.wait_for(_future(placed), self._placement_timeout)
        except TimeoutError:
            new.alive = False
            _kill(new.handle)
            raise self._not_placed(new) from None
        except _DEATHS:  # its load fails the same way: raised below
            pass
        return self._check_ready(new, await _future(loaded))

    # -- closing ---------------------------------------------------------------------

    async def aclose(self, errors: Mapping[int, BaseException] | None) -> None:
        """Kill every actor, or give those whose envs all closed cleanly (``errors``) back."""
        for task in self._streams:  # nothing waits on their parts any more
            task.cancel()
        if errors is not None and self._pool is not None:
            self._give_back(self._pool, errors)
        self._finalizer()

    def _give_back(self, pool: ActorPool, errors: Mapping[int, BaseException]) -> None:
        """Give the pool every live actor whose envs all closed cleanly (the rest are killed)."""
        for actor in self.workers:
            clean = not any(i in errors or i in self.pool.table.stuck for i in actor.group)
            if actor.alive and clean:
                actor.alive = False  # not the finalizer's to kill any more
                pool.give(self._options, actor.handle, actor.node_id)

    def close_now(self) -> None:
        """Without a loop (construction failed): close the envs (best effort), kill the actors."""
        closes = []
        for actor in self.workers:
            if actor.placed is not None and not ray.wait([actor.placed], timeout=0)[0]:
                continue  # not placed (yet): it hosts no env to close
            local = list(range(len(actor.group)))
            try:
                closes.append(actor.handle.call.remote(0, local, close_op(len(local))))
            except Exception:  # the construction error matters more
                continue
        if closes:
            ray.wait(closes, num_returns=len(closes), timeout=drive.CLOSE_TIMEOUT)
        self._finalizer()


class RayBackend(Pool):
    """Hosts envs in Ray actors (the pool over `RayTransport`).

    ``backend_options``: Ray actor options for every actor (`ACTOR_OPTIONS`),
    an `ActorPool` to take actors from and give them back to
    (``"actor_pool"``), and ``"placement_timeout"``.
    """

    OPTIONS: ClassVar[frozenset[str]] = ACTOR_OPTIONS | {POOL_OPTION, PLACEMENT_OPTION}
    TRANSPORT = RayTransport

    @property
    def node_ids(self) -> tuple[str | None, ...]:
        """The Ray node each actor runs on (for diagnostics and tests)."""
        return self.transport.node_ids  # type: ignore[attr-defined,no-any-return]

    @property
    def actors(self) -> tuple[Any, ...]:
        """The actor handles (for diagnostics and tests)."""
        return self.transport.actors  # type: ignore[attr-defined,no-any-return]


def _ready(actor: _Actor, ref: Any) -> Ready | Failed:
    """An actor's reply to ``load`` (construction has no loop: this waits on Ray)."""
    try:
        reply: Ready | Failed = ray.get(ref)
    except _DEATHS as exc:
        died = RuntimeError(
            f"the {actor.describe()} failed as it started: {exc}; can it unpickle the env "
            "factories? (aiovec and the code that defines them must be importable on every "
            "node: installed there, or shipped with runtime_env)"
        )
        raise WorkerDiedError(dict.fromkeys(actor.group, died), "env_fns[...]()") from exc
    return reply


def _check_timeout(value: Any) -> float | None:
    """``placement_timeout``: ``None`` (wait as long as Ray does) or positive seconds."""
    return validate.check_timeout(f"backend_options[{PLACEMENT_OPTION!r}]", value)


def _cluster_cpus() -> int:
    """How many CPUs the Ray cluster has (one actor each, by default)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _future_of(ref: Any) -> Future[Any]:
    future: Future[Any] = ref.future()
    return future


def _future(ref: Any) -> asyncio.Future[Any]:
    """An object ref as an asyncio future of the running loop."""
    return asyncio.wrap_future(_future_of(ref))


def _copy_step_rows(
    target: StepArrays, source: StepArrays, rows: Sequence[int], first: int
) -> None:
    """Copy env rows ``rows`` (global) of a group's step arrays (rows from ``first``) into place."""
    if rows[-1] - rows[0] == len(rows) - 1:  # contiguous: slices, no fancy indexing
        into: slice | list[int] = slice(rows[0], rows[-1] + 1)
        out: slice | list[int] = slice(rows[0] - first, rows[-1] + 1 - first)
    else:
        into, out = list(rows), [i - first for i in rows]
    copy_rows(target.observations, source.observations, into, out)
    for name in ("rewards", "terminations", "truncations"):
        getattr(target, name)[into] = getattr(source, name)[out]


def _kill_all(actors: list[_Actor]) -> None:
    """Kill every actor still alive (their envs are closed, or abandoned)."""
    for actor in actors:
        if actor.alive:
            actor.alive = False
            _kill(actor.handle)


def _kill(handle: Any) -> None:
    """Kill an actor (it is not restarted)."""
    with contextlib.suppress(Exception):  # Ray already shut down: the actor went with it
        ray.kill(handle, no_restart=True)


def _job_id() -> str:
    """The Ray job this driver runs (actors of an earlier job are gone with it)."""
    job: str = ray.get_runtime_context().get_job_id()
    return job
