"""A group: the sessions of one client vector env, on a backend of the server's.

Theory of operation.  A client's vector env opens its envs as one *group*,
hosted by one of aiovec's own backends (``inline``, ``thread``, ``process``),
so the server steps them as a vector env of its own would: each env's
``step_flow`` (autoreset) runs here, and ``SAME_STEP`` costs no second round
trip.  A group outlives connections: a connection that ends leaves it
*detached* (`detach`) until a new one takes it back by its token (`attach`), or
until the resume window closes it.

- **Requests in order.**  A group runs its requests in the order of their ids;
  one that names an env still in flight waits for it (`run_queue`).  Launched,
  a request owns its envs; while it is the only one running (a lock-step
  step is), every outcome is its own and is taken as a whole (`deliver`), else
  each goes to the request launched last that named its env (`_request_of`).
- **Answered once, whatever happens.**  A whole step is answered once every
  env has an outcome (one `StepPart`); a streamed one (``send()``, and a step
  under a ``step_timeout``, whose finished envs must not look late) as envs
  finish.  Every answer is kept (`GroupRequest.parts`) until the client has
  named all of the request's envs in later requests (``last``: the id that
  last named each env, ``_uniform`` while one request named them all; then it
  has the answer).  An id the group has seen is
  never run again: it gets what was answered so far (`again`), the rest when
  it comes.  So a client that lost its connection sends its requests in flight
  again, and no step is lost or run twice.
- **Deadlines.**  A request may carry the seconds it may take; envs still out
  then are cancelled and answered with ``TimeoutError`` (`_expire_late`).
- **Outcomes.**  Sync envs answer inside the launch; the others through one
  task per group (``pump``: `_collect`), which waits for every env in flight
  (for one, while a streamed request runs) or the next deadline.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from aiovec._core.ops import CallOp, StepOp
from aiovec._log import logger
from aiovec._serve import codec
from aiovec._serve.calls import call_of
from aiovec._serve.protocol import CallReplyMsg, FailedMsg, Layouts
from aiovec._serve.steps import AnswerRows, actions_of, mode_of, resets_of
from aiovec.backends import Backend

if TYPE_CHECKING:
    from aiovec._serve.connection import Connection
    from aiovec._serve.server import Server

__all__ = ("Group", "GroupRequest")


@dataclass(eq=False, slots=True)
class GroupRequest:
    """A request of a group: its envs, how many are still out, what was answered."""

    rid: int
    envs: Sequence[int]
    kind: str  # "step", "call", "rebuild", "close"
    message: Any
    stream: bool = False  # answered as envs finish
    deadline: float | None = None  # on the server's clock (time.monotonic)
    left: int = 0  # envs launched without an outcome yet
    order: int = 0  # when it was launched (the later launch naming an env owns it)
    started: bool = False
    done: bool = False
    parts: list[Any] = field(default_factory=list)
    late: set[int] = field(default_factory=set)  # cancelled at the deadline
    unacked: int = 0  # envs not yet named by a later request
    values: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, Any] = field(default_factory=dict)


class Group:
    """The sessions of one client vector env, on a backend of the server's (see the module)."""

    def __init__(self, server: Server, gid: int, backend: Backend, conn: Connection) -> None:
        self.server = server
        self.gid = gid
        self.token = secrets.token_urlsafe(24)
        self.backend = backend
        self.count = backend.num_envs
        traits = backend.traits
        self.action_layouts = Layouts(traits.action_spaces[0])
        self.rows = AnswerRows(traits.observation_spaces[0], traits.action_spaces[0], self.count)
        self.conn: Connection | None = conn
        self.seen = 0
        self.requests: dict[int, GroupRequest] = {}  # answers kept until acknowledged
        self.queue: deque[GroupRequest] = deque()
        self.running: dict[int, GroupRequest] = {}
        # each env's last partial request launched, and the last whole one: of the two,
        # the one launched later is the request an env's outcome goes to
        self._owner: dict[int, GroupRequest] = {}
        self._whole: GroupRequest | None = None
        self._launches = 0
        self.last = np.zeros(self.count, dtype=np.int64)  # the last request naming each env
        self._uniform: int | None = 0  # the request that named every env last (``last`` stale)
        self.busy = False  # an async request (rebuild, close) is running
        self.pump: asyncio.Task[None] | None = None
        self.expiry: asyncio.TimerHandle | None = None
        self.closed = False

    # -- requests in -------------------------------------------------------------------

    def take(self, request: GroupRequest) -> None:
        """A new request: remember it, let the answers it supersedes go, run it when it can."""
        self.seen = request.rid
        self.requests[request.rid] = request
        envs = request.envs
        request.unacked = len(envs)
        for rid, count in self._named(envs, request.rid).items():
            acked = self.requests.get(rid)
            if acked is not None:
                acked.unacked -= count
                self._forget_if_acked(acked)
        self.queue.append(request)
        self.run_queue()

    def _named(self, envs: Sequence[int], rid: int) -> dict[int, int]:
        """Request ``rid`` names ``envs``: how many of them each earlier request named last."""
        uniform = self._uniform
        if len(envs) == self.count:  # the usual step: every env
            self._uniform = rid
            if uniform is not None:  # every env was named last by one request
                return {uniform: self.count}
            return Counter(self.last.tolist())
        if uniform is not None:  # ``last`` was left stale meanwhile: bring it up to date
            self.last[:] = uniform
            self._uniform = None
        named = list(envs)
        before = Counter(self.last[named].tolist())
        self.last[named] = rid
        return before

    def _forget_if_acked(self, request: GroupRequest) -> None:
        if request.done and request.unacked <= 0:
            self.requests.pop(request.rid, None)

    def in_the_works(self) -> int:
        """Requests taken and not answered in full yet."""
        return len(self.queue) + len(self.running) + self.busy

    def again(self, rid: int, conn: Connection) -> None:
        """Request ``rid`` came again (after a reconnect): what was answered, the rest later."""
        request = self.requests.get(rid)
        if request is None:
            error = RuntimeError(f"request {rid} was answered and acknowledged already")
            conn.send(FailedMsg(rid, self.gid, codec.error_to_data(error)))
            return
        for part in request.parts:
            conn.send(part)

    def run_queue(self) -> None:
        """Start the requests at the head of the queue whose envs are free."""
        pending = self.backend.pending
        while self.queue and not self.busy and not self.closed:
            request = self.queue[0]
            if pending and not pending.isdisjoint(request.envs):
                return  # an env is still busy with a cancelled call: wait for it
            self.queue.popleft()
            request.started = True
            if request.kind in {"rebuild", "close"}:
                self.busy = True
                self.server.spawn(self._run_async(request))
                return
            self._launch(request)

    def _launch(self, request: GroupRequest) -> None:
        try:
            op = self._op(request)
        except (ValueError, TypeError) as exc:
            self._refuse(request, exc)
            return
        envs = request.envs
        request.left = len(envs)
        self.running[request.rid] = request
        self._launches += 1
        request.order = self._launches
        if len(envs) == self.count:
            self._whole = request
        else:
            self._owner.update(dict.fromkeys(envs, request))
        backend = self.backend
        try:
            backend.launch(envs, op)
        except BaseException as exc:  # an env raised SystemExit or KeyboardInterrupt
            for i in envs:
                if i not in backend.pending:
                    backend._errors.setdefault(i, exc)
            if not isinstance(exc, Exception):
                logger.warning("an env of group %s raised %r; reported as its error", self.gid, exc)
        self.deliver(*backend.take(), launched=request)
        if backend.pending and self.pump is None:
            self.pump = self.server.spawn(self._collect())

    def _op(self, request: GroupRequest) -> StepOp | CallOp:
        message = request.message
        count = len(request.envs)
        if request.kind == "step":
            actions, batch = actions_of(message, count, self.action_layouts)
            return StepOp(
                mode_of(message.mode),
                actions,
                resets_of(message, count),
                "step",
                batch=batch if not message.autoresets else None,
                stream=message.stream,
                timed=message.timed,
            )
        if len(message.calls) != count:
            raise ValueError(f"calls: expected {count}, got {len(message.calls)}")
        return CallOp([call_of(c) for c in message.calls], message.name)

    def _refuse(self, request: GroupRequest, error: Exception) -> None:
        request.done = True
        failed = FailedMsg(request.rid, self.gid, codec.error_to_data(error))
        request.parts.append(failed)
        self.send(failed)
        self._forget_if_acked(request)
        self.run_queue()

    async def _run_async(self, request: GroupRequest) -> None:
        backend = self.backend
        try:
            if request.kind == "rebuild":
                errors = await backend.rebuild(request.envs)
            else:
                errors = await self.server.close_group(self, "closed by the client")
            reply = CallReplyMsg(
                request.rid, self.gid, {}, {i: codec.error_to_data(e) for i, e in errors.items()}
            )
        except Exception as exc:
            reply = CallReplyMsg(
                request.rid, self.gid, {}, {i: codec.error_to_data(exc) for i in request.envs}
            )
        request.done = True
        request.parts.append(reply)
        self.send(reply)
        self._forget_if_acked(request)
        self.busy = False
        self.run_queue()

    def cancel(self, rid: int, envs: Iterable[int]) -> None:
        """The client gave up on ``envs`` of request ``rid``."""
        request = self.running.get(rid)
        if request is None:
            return
        # (a pending env is its running request's alone: requests that share envs run in turn)
        out = self.backend.pending.intersection(envs).intersection(request.envs)
        if out:
            self.backend.cancel(out)
            self.deliver(*self.backend.take())

    # -- outcomes out ------------------------------------------------------------------

    async def _collect(self) -> None:
        backend = self.backend
        try:
            while backend.pending and not self.closed:
                streamed = any(r.stream for r in self.running.values())
                wanted = 1 if streamed else len(backend.pending)
                self.deliver(*await backend.collect(wanted, self._next_deadline()))
                self._expire_late()
        finally:
            self.pump = None
        if not self.closed:
            self.run_queue()

    def _next_deadline(self) -> float | None:
        deadlines = [r.deadline for r in self.running.values() if r.deadline is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _expire_late(self) -> None:
        now = time.monotonic()
        late: list[int] = []
        for request in self.running.values():
            if request.deadline is not None and request.deadline <= now:
                out = self.backend.pending.intersection(request.envs)
                request.late.update(out)
                late.extend(out)
        if late:
            self.backend.cancel(late)
            self.deliver(*self.backend.take())

    def deliver(
        self,
        results: Any,
        errors: dict[int, BaseException],
        launched: GroupRequest | None = None,
    ) -> None:
        """Hand each env's outcome to its request; answer the requests that are due.

        ``launched``: the request just launched, whose envs' outcomes these
        usually are (sync envs answer inside the launch).
        """
        if not results and not errors:
            return
        running = self.running
        request = next(iter(running.values())) if len(running) == 1 else launched
        if request is not None and (
            len(running) == 1 or _within(request.envs, results.keys(), errors.keys())
        ):  # every outcome is this request's: taken as a whole
            request.values.update(results)
            if errors:
                self._errors_of(request, errors)
            request.left -= len(results) + len(errors)
            touched: Iterable[GroupRequest] = (request,)
        else:
            touched = self._route(results, errors)
        finished = False
        for request in touched:
            if request.stream or not request.left:
                self._answer(request)
                finished = finished or request.done
        if finished and self.queue:
            self.run_queue()

    def _route(self, results: Any, errors: dict[int, BaseException]) -> list[GroupRequest]:
        """Outcomes of envs of several running requests, each to its own."""
        touched: dict[int, GroupRequest] = {}
        for i in results:
            request = self._request_of(i)
            if request is None:
                continue  # (no request waits on it: nothing to answer)
            request.values[i] = results[i]
            request.left -= 1
            touched[request.rid] = request
        for i, error in errors.items():
            request = self._request_of(i)
            if request is None:
                continue
            self._errors_of(request, {i: error})
            request.left -= 1
            touched[request.rid] = request
        return list(touched.values())

    def _request_of(self, i: int) -> GroupRequest | None:
        """The running request env ``i``'s outcome belongs to: the last launched that named it."""
        request, whole = self._owner.get(i), self._whole
        if request is None or (whole is not None and whole.order > request.order):
            request = whole
        if request is None or request.rid not in self.running:
            return None
        return request

    @staticmethod
    def _errors_of(request: GroupRequest, errors: dict[int, BaseException]) -> None:
        for i, error in errors.items():
            late = i in request.late and isinstance(error, asyncio.CancelledError)
            request.errors[i] = (
                TimeoutError(f"env {i} did not answer within the request's deadline")
                if late
                else error
            )

    def _answer(self, request: GroupRequest) -> None:
        done = not request.left
        values, errors = request.values, request.errors
        request.values, request.errors = {}, {}
        if request.kind == "step":
            message: Any = self.rows.pack(request.rid, self.gid, done, values, errors)
        else:
            message = _call_reply(request.rid, self.gid, values, errors)
        request.parts.append(message)
        if done:
            request.done = True
            del self.running[request.rid]
            self._forget_if_acked(request)
        self.send(message)

    def send(self, message: Any) -> None:
        """Send ``message`` on the group's connection, if it has one (else it waits in parts)."""
        conn = self.conn
        if conn is not None:
            conn.send(message)

    # -- attach, detach ----------------------------------------------------------------

    def detach(self) -> None:
        """The connection ended: keep the sessions for the resume window."""
        self.conn = None
        if self.closed:
            return
        window = self.server.resume_window
        self.expiry = asyncio.get_running_loop().call_later(window, self._expire)
        logger.info(
            "aiovec serve: group %s (%d sessions) detached; kept %g s for a resume",
            self.gid,
            self.count,
            window,
        )

    def attach(self, conn: Connection) -> None:
        """A new connection resumed the group."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        self.conn = conn
        logger.info("aiovec serve: group %s (%d sessions) resumed", self.gid, self.count)

    def _expire(self) -> None:
        self.expiry = None
        reason = f"not resumed within {self.server.resume_window:g} s"
        self.server.spawn(self.server.close_group(self, reason))


def _within(envs: Sequence[int], *keys: Any) -> bool:
    """Whether every key of ``keys`` (env indices) is one of ``envs``."""
    named = set(envs)
    return all(named.issuperset(some) for some in keys)


def _call_reply(rid: int, gid: int, values: dict[int, Any], errors: dict[int, Any]) -> CallReplyMsg:
    packed: dict[int, Any] = {}
    error_data = {i: codec.error_to_data(e) for i, e in errors.items()}
    for i, value in values.items():
        try:
            packed[i] = codec.pack(value)
        except TypeError as exc:
            error_data[i] = codec.error_to_data(exc)
    return CallReplyMsg(rid, gid, packed, error_data)
