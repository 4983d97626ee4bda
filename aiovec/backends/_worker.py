"""The child side of ``backend="process"``: one worker process hosting a group of envs.

Theory of operation.  The parent starts the worker with two pipes (requests
in, replies out; framed by ``_wire.py``), the shared step file (a descriptor,
not yet sized), the group's factories (cloudpickled) and the global index of
its first env.  The worker builds the envs and answers ``Reply(0, Ready(...))``
or ``Reply(0, Failed(...))``.  Then it serves requests, in order, one reply per
request; every message is a typed value of ``_messages.py``, which says what
each carries.  A step runs each env through its own `step_flow` (kept here, so
``SAME_STEP`` autoreset costs no extra round trip); each transition goes into
the shared buffer when it fits it exactly, and the `StepReply` carries only
what did not.  Without a shared buffer, every transition is ``odd``.  The lean
step (`LeanStep`, not a pickle) is the same step of the whole group, its
actions and reset flags read from the shared buffer; when the reply would say
nothing, it is the fixed-size `LeanReply`.

Async envs run on the worker's own event loop, each call a task of its own,
while the worker reads the next requests: a `Cancel` cancels an env's task, and
the worker's other envs go on.  Sync envs run one after another, never
interrupted.  A request whose envs are all sync and whose results are wanted
together is answered once, as before; others are *jobs* (`_Job`) answered as
their envs end: a streamed step (``send()``), and a whole step under a
``step_timeout`` (*timed*), publishes each env's result as soon as it is done
(envs done together share a message; a run of sync envs publishes at its end,
or every `FLUSH_AFTER` seconds by a timer), so that the parent can tell, at a
deadline, which env its worker still runs.  Errors
travel as values; one that does not survive pickling is replaced by a
``RuntimeError`` carrying its repr.  The worker ignores SIGINT (Ctrl-C is the
parent's to handle, and the parent reaps its workers) and exits when its
request pipe closes: the parent is gone (under ``fork``, workers started later
hold copies of earlier workers' pipes; they exit too, so the closing cascades).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import mmap
import os
import pickle
import signal
import traceback
from collections.abc import Callable, Coroutine, Generator, Iterator, Sequence
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any, TypeVar

import cloudpickle
import numpy as np

from aiovec._core import validate
from aiovec._core.calls import CLOSE, Transition, flow_at
from aiovec._core.layout import StepArrays, StepLayout, take_rows
from aiovec._core.ops import CallOp
from aiovec._env import is_async_env
from aiovec.backends._base import (
    EnvTraits,
    check_env,
    check_rebuilt,
    make_env,
)
from aiovec.backends._drive import (
    StepFlow,
    close_quietly,
    perform_async,
    perform_sync,
    step_async,
    step_sync,
)
from aiovec.backends._messages import (
    LEAN,
    Attach,
    AttachReply,
    Call,
    CallReply,
    Cancel,
    Failed,
    LeanReply,
    LeanStep,
    Outcome,
    Ready,
    Rebuild,
    RebuildReply,
    Reply,
    StepReply,
    StepRequest,
)
from aiovec.backends._wire import READ_SIZE, Frames, SharedFile, frame, write_all

__all__ = ("FLUSH_AFTER", "Group", "GroupFlow", "build_flow", "main")

T = TypeVar("T")
GroupFlow = Generator[list[Coroutine[Any, Any, Any]], list[Any], T]
"""A request of a group, as a flow: it yields the coroutines of its async envs
(once, or not at all) and is sent their results (exceptions as values); it
returns the reply.  A worker process runs them on its own loop, a Ray actor
awaits them on the actor's loop."""

# Values written to the shared buffer as they are: exactly the types the parent's
# step-result check (`validate.step_result_checker`) takes at once.  Anything else
# travels by message, and the parent checks and batches it with the usual rules.
_NUMBERS = validate.REWARD_TYPES
_FLAGS = validate.FLAG_TYPES
_DICTS = validate.DICT_TYPES
_ARRAYS = frozenset({np.ndarray})

FLUSH_AFTER = 0.001
"""Seconds a finished env's result may wait to share a message with others.

Async envs' results that finish within this of each other go in one message.
In a streamed or timed request a worker publishes its sync envs' results
at the end of each run of sync envs, in one message; if that run goes on for
longer than this, a timer (``SIGALRM``) publishes what has finished so far,
so that a slow env never holds back the results before it for long.  A
request's last result is published at once, with what is left."""


def main(
    requests: Connection, replies: Connection, shared: SharedFile, factories: bytes, first: int
) -> None:
    """Entry point of a worker process (``multiprocessing.Process`` target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = replies.fileno()
    try:
        group = Group(cloudpickle.loads(factories), first, shared.fd)
    except _BuildFailed as failed:
        _send(out, Reply(0, failed.reply()))
        return
    signal.signal(signal.SIGALRM, group.on_alarm)
    signal.siginterrupt(signal.SIGALRM, False)  # a sync env's system calls go on
    group.timed = True
    try:
        _send(out, Reply(0, Ready(group.traits(), asyncs=group.asyncs())))
        group.serve(requests.fileno(), out)
    finally:
        group.close()


class _BuildFailed(Exception):
    def __init__(self, index: int, error: BaseException, by_factory: bool) -> None:
        super().__init__(index, error)
        self.index, self.error, self.by_factory = index, error, by_factory

    def reply(self) -> Failed:
        """What the worker answers (its first word) for this failure."""
        return Failed(self.index, _portable(self.error), self.by_factory)


class Group:
    """The envs of one worker, their flows, the shared step buffer and an event loop.

    Its requests are written as `GroupFlow` s (``step_flow``, ``call_flow``,
    ``rebuild_flow``); ``step``, ``call`` and ``rebuild`` run them on the group's own
    loop, and a Ray actor (``ray.py``) awaits the same flows on its loop.
    """

    def __init__(
        self,
        fns: Sequence[Callable[[], Any]],
        first: int,
        shared_fd: int = -1,
        envs: list[Any] | None = None,
    ) -> None:
        """Build the envs ``fns`` on the group's own loop, unless ``envs`` were built already.

        A Ray actor builds them on its running loop (awaiting `build_flow`) and passes them.
        """
        self.fns, self.first, self.shared_fd = list(fns), first, shared_fd
        self.loop: asyncio.AbstractEventLoop | None = None
        # A worker process's requests that run on its loop (`_Job`), and each
        # async env's call in flight there.
        self.out = -1  # the reply pipe
        self.jobs: set[_Job] = set()
        self.tasks: list[asyncio.Task[Any] | None] = [None] * len(fns)
        self._changed: asyncio.Future[None] | None = None  # a job ended
        # Where a job's replies go: the reply pipe (``out``), or a Ray actor's stream.
        self.emit: Callable[[int, StepReply | CallReply], None] | None = None
        self.timed = False  # SIGALRM runs `on_alarm` (a worker process's main thread)
        self._burst: _Job | None = None  # the streamed job whose sync envs run now
        self._armed = False  # the flush timer is set
        self._writing = False  # a reply is being written (the timer must not cut in)
        if envs is None:
            try:
                envs = self._run(build_flow(self.fns, first))
            except BaseException:
                self.close()
                raise
        self.envs: list[Any] = envs
        self.is_async = [is_async_env(env) for env in self.envs]
        if not any(self.is_async):  # sync envs run off the loop: release it until needed
            self.close()
            self.loop = None
        self.flows: list[StepFlow | None] = [None] * len(self.envs)
        self.spaces = (self.envs[0].observation_space, self.envs[0].action_space)
        self.layout: StepLayout | None = None
        self.buffer: Any = None
        self.arrays: StepArrays | None = None
        self.write_obs: Callable[[int, Any], bool] = lambda i, value: False
        # (observation rows, row shape, dtype) when observations are one array
        self._bulk: tuple[np.ndarray, tuple[int, ...], np.dtype[Any]] | None = None
        self.first_row = first  # the row of the group's first env in ``arrays``

    def traits(self) -> EnvTraits:
        return EnvTraits.of(self.envs)

    def asyncs(self) -> tuple[bool, ...]:
        """Whether each env is async (its calls can be cancelled in the worker)."""
        return tuple(self.is_async)

    def serve(self, requests: int, replies: int) -> None:
        """Answer requests until told to stop or the request pipe closes.

        While no call runs on the loop, the worker waits in a plain ``read``;
        otherwise it runs its loop until a request comes.
        """
        self.out = replies
        frames = Frames()
        while True:
            data = self._next(requests)
            if not data:  # the parent is gone
                return
            for payload in frames.feed(data):
                if payload[0] == LEAN:
                    seq, mode, stream, timed = LeanStep.parse(payload)
                    self._step(
                        seq, range(len(self.envs)), mode, None, None, stream, timed, lean=True
                    )
                    continue
                request = pickle.loads(payload)
                kind = type(request)
                if kind is StepRequest:
                    self._step(*request, lean=False)
                elif kind is Call:
                    self._call(request.seq, request.locals, request.op)
                elif kind is Cancel:
                    self.cancel(request.locals)
                elif kind is Rebuild:
                    self._settle(request.locals)
                    errors = self.rebuild(request.locals)
                    asyncs = {j: self.is_async[j] for j in request.locals}
                    _send(replies, Reply(request.seq, RebuildReply(errors, asyncs)))
                elif kind is Attach:
                    _send(replies, Reply(request.seq, AttachReply(self.attach(request.layout))))
                else:  # Stop
                    return

    def _next(self, requests: int) -> bytes:
        """The next bytes of requests; meanwhile the loop runs the calls in flight."""
        if self.jobs:
            loop = self._loop()
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(requests, _resolve, readable)
            try:
                loop.run_until_complete(self._until(readable))
            finally:
                loop.remove_reader(requests)
                os.set_blocking(requests, True)  # uvloop's add_reader made it non-blocking
        return os.read(requests, READ_SIZE)

    async def _until(self, readable: asyncio.Future[None]) -> None:
        """Run until a request is readable or no call is in flight."""
        loop = self._loop()
        while self.jobs and not readable.done():
            changed = self._changed = loop.create_future()
            await asyncio.wait([readable, changed], return_when=asyncio.FIRST_COMPLETED)

    def _loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = _new_loop()
        return self.loop

    # -- requests on the loop: async envs as tasks, results streamed ------------------

    def _step(self, *request: Any, lean: bool) -> None:
        """Run a step request (`StepRequest`'s fields, in order) to its end."""
        for _ in self.step_parts(*request, lean=lean):
            pass

    def step_parts(  # noqa: PLR0917  (a StepRequest's fields, in order)
        self,
        seq: int,
        locals_: Sequence[int],
        mode: str,
        reset_first: Sequence[bool] | None,
        actions: Sequence[Any] | None,
        stream: bool,
        timed: bool = False,
        *,
        lean: bool = False,
    ) -> Iterator[None]:
        """Run a step as a job: async envs as tasks, then sync envs, one per iteration.

        A streamed or timed step publishes its run of sync envs as it goes (a
        timer cuts it every `FLUSH_AFTER` seconds), so that neither a slow env
        nor a deadline holds back the results before it.  Where no timer can
        cut a run of sync envs (a Ray actor, whose calls do not run on the main
        thread), each sync env's result is published as it ends, and the job
        pauses there (it yields) so that the caller can send that part on
        before the next sync env starts.  A request of sync envs only, neither
        streamed nor timed, is stepped at once and answered once (the lean
        reply when every result went to the rows).
        """
        publish = stream or timed
        if not publish and not self.any_async(locals_):
            self._answer_once(seq, self.step(locals_, mode, reset_first, actions), lean=lean)
            return
        if actions is None:
            actions = self._shared_actions(locals_)
        if reset_first is None:
            reset_first = self._shared_resets(locals_)
        # Async envs' results are always published as they come (envs done in the
        # same loop iteration share a message): a slow env must not make another
        # env of its worker miss its deadline.
        job = _Job(seq, len(locals_), lean, step=True)
        envs, flows, tasks, is_async = self.envs, self.flows, self.tasks, self.is_async
        later = []
        for k, j in enumerate(locals_):
            if not is_async[j]:
                later.append(k)
                continue
            before = tasks[j]
            if before is None or before.done():
                flow = flows[j] or flow_at(flows, j, mode)
                self._start(job, k, j, step_async(envs[j], flow, reset_first[k], actions[k]))
            else:  # its cancelled call still unwinds: its flow is known once it has
                coro = self._async_step(j, mode, reset_first[k], actions[k])
                self._start(job, k, j, _after(before, coro))
        if later:
            self._burst = job if publish and len(later) > 1 and self.timed else None
            each = publish and not self.timed  # no timer (a Ray actor): publish env by env
            try:
                for k in later:
                    j = locals_[k]
                    flow = flows[j] or flow_at(flows, j, mode)
                    try:
                        job.stepped[j] = step_sync(envs[j], flow, reset_first[k], actions[k])
                    except BaseException as exc:
                        job.errors[j] = self._failed(j, exc)
                    job.left -= 1
                    if each and job.left:
                        self._publish(job, last=False)
                        yield
                    elif self._burst is not None and job.left and not self._armed:
                        self._armed = True
                        signal.setitimer(signal.ITIMER_REAL, FLUSH_AFTER)
            finally:
                self._burst = None
                if self._armed:
                    self._armed = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
            if job.left and (job.stepped or job.errors):  # async envs still to run: publish
                self._publish(job, last=False)
        self._progress(job)

    def _answer_once(self, seq: int, reply: StepReply, *, lean: bool) -> None:
        """Answer a step at once (the lean reply when the rows say it all)."""
        if lean and not any(reply):  # nothing to tell beyond the rows
            write_all(self.out, LeanReply.frame(seq))
        else:
            _send(self.out, Reply(seq, reply))

    def any_async(self, locals_: Sequence[int]) -> bool:
        """Whether any env of ``locals_`` is async."""
        is_async = self.is_async
        if True not in is_async:  # the usual group: all sync, or all async
            return False
        if False not in is_async:
            return True
        return any(is_async[j] for j in locals_)

    async def _async_step(self, j: int, mode: str, reset_first: bool, action: Any) -> Any:
        flows = self.flows
        flow = flows[j] or flow_at(flows, j, mode)
        return await step_async(self.envs[j], flow, reset_first, action)

    def _call(self, seq: int, locals_: Sequence[int], op: CallOp) -> None:
        """One call per env of ``locals_``: async envs' as tasks; one reply."""
        if not self.any_async(locals_):
            _send(self.out, Reply(seq, CallReply(self.call(locals_, op))))
            return
        self.call_jobs(seq, locals_, op)

    def call_jobs(self, seq: int, locals_: Sequence[int], op: CallOp) -> None:
        """`_call` as a job: async envs' calls as tasks (which `cancel` can end); one reply."""
        job = _Job(seq, len(locals_), False, step=False)
        job.outcomes = [(None, None)] * len(locals_)
        for k, j in enumerate(locals_):
            env, call = self.envs[j], op.calls[k]
            if self.is_async[j]:
                before = self.tasks[j]
                coro = perform_async(env, call)
                if before is not None and not before.done():
                    coro = _after(before, coro)
                self._start(job, k, j, coro)
                continue
            try:
                job.outcomes[k] = (perform_sync(env, call), None)
            except BaseException as exc:
                job.outcomes[k] = None, self._failed(j, exc)
            job.left -= 1
        self._progress(job)

    def _start(self, job: _Job, k: int, j: int, coro: Coroutine[Any, Any, Any]) -> None:
        """Run env ``j``'s call ``coro`` as a task (the k-th env of ``job``)."""
        task = self._loop().create_task(coro)
        self.tasks[j] = task
        if not job.running:
            job.running = True
            self.jobs.add(job)
        task.add_done_callback(functools.partial(self._async_done, job, k, j))

    def _async_done(self, job: _Job, k: int, j: int, task: asyncio.Task[Any]) -> None:
        if self.tasks[j] is task:
            self.tasks[j] = None
        try:
            value = task.result()
        except BaseException as exc:  # a CancelledError too: its call was abandoned
            error = self._failed(j, exc)
            if job.step:
                job.errors[j] = error
            else:
                job.outcomes[k] = None, error
        else:
            if job.step:
                job.stepped[j] = value
            else:
                job.outcomes[k] = value, None
        job.left -= 1
        self._progress(job)

    def _progress(self, job: _Job) -> None:
        """Reply once every env of ``job`` is done; a streamed step publishes as they end."""
        if job.left == 0:
            self.jobs.discard(job)
            if job.step:
                self._publish(job, last=True)
            else:
                self._reply(job.seq, CallReply(job.outcomes))
            changed = self._changed
            if changed is not None and not changed.done():
                changed.set_result(None)
            return
        if job.step and not job.flushing and (job.stepped or job.errors):
            job.flushing = True  # envs done within FLUSH_AFTER share a reply
            self._loop().call_later(FLUSH_AFTER, self._flush, job)

    def _flush(self, job: _Job) -> None:
        job.flushing = False
        if job.left and (job.stepped or job.errors):
            self._publish(job, last=False)

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        """The flush timer: publish the results of a run of sync envs that goes on."""
        self._armed = False
        job = self._burst
        if job is None or self._writing or not (job.stepped or job.errors):
            return
        with contextlib.suppress(Exception):  # a broken pipe: the parent is gone
            self._publish(job, last=False)

    def _publish(self, job: _Job, *, last: bool) -> None:
        """Write the results of ``job`` not yet published to the rows; reply with the rest."""
        self._writing = True
        try:
            # Copied and emptied, never replaced: a timer that cuts in between the
            # main thread's reading ``job.stepped`` and storing into it loses nothing.
            stepped, errors = job.stepped.copy(), job.errors.copy()
            job.stepped.clear()
            job.errors.clear()
            infos: dict[int, dict[str, Any]] = {}
            finals: dict[int, dict[str, Any]] = {}
            odd: dict[int, Transition] = {}
            if not self._put_together(stepped, infos, finals):
                for j, transition in stepped.items():
                    self._put(j, transition, infos, finals, odd)
            if last:
                if job.lean and not job.published and not (errors or infos or finals or odd):
                    write_all(self.out, LeanReply.frame(job.seq))
                    return
                reply = StepReply(errors, infos, finals, odd)
            else:
                job.published = True
                reply = StepReply(errors, infos, finals, odd, envs=[*stepped, *errors])
            self._reply(job.seq, reply)
        finally:
            self._writing = False

    def _reply(self, seq: int, body: StepReply | CallReply) -> None:
        if self.emit is not None:
            self.emit(seq, body)
        else:
            _send(self.out, Reply(seq, body))

    def cancel(self, locals_: Sequence[int]) -> None:
        """Cancel the async envs' calls in flight (each fails with CancelledError)."""
        for j in locals_:
            task = self.tasks[j]
            if task is not None:
                task.cancel()

    def _settle(self, locals_: Sequence[int]) -> None:
        """Wait until the calls in flight of envs ``locals_`` (cancelled ones) have ended."""
        tasks = [task for j in locals_ if (task := self.tasks[j]) is not None]
        if tasks:
            self._loop().run_until_complete(asyncio.wait(tasks))

    async def settled(self, locals_: Sequence[int]) -> None:
        """`_settle`, awaited on the running loop (a Ray actor's)."""
        tasks = [task for j in locals_ if (task := self.tasks[j]) is not None]
        if tasks:
            await asyncio.wait(tasks)

    # -- the shared step buffer -----------------------------------------------------

    def attach(self, layout: StepLayout) -> BaseException | None:
        """Map the shared step file, which the parent has sized for ``layout``."""
        try:
            buffer = mmap.mmap(self.shared_fd, layout.nbytes)
        except (OSError, ValueError) as exc:
            return _portable(exc)
        self.use_buffer(layout, buffer, self.first)
        return None

    def use_buffer(self, layout: StepLayout, buffer: Any, first_row: int) -> None:
        """Write transitions into ``buffer`` (laid out by ``layout``) from row ``first_row``."""
        self.buffer = buffer
        self.layout = layout
        self.first_row = first_row
        self.arrays = layout.arrays(buffer)
        self.write_obs = layout.observations.writer(self.arrays.observations)
        leaves = layout.observations.leaves
        self._bulk = None
        if layout.observations.tree[0] == "leaf" and len(leaves[0].shape) > 1:  # one array
            self._bulk = (self.arrays.observations, leaves[0].shape[1:], leaves[0].dtype)

    def _rows(self, locals_: Sequence[int]) -> slice | list[int]:
        """The rows of envs ``locals_`` in the shared buffer."""
        first = self.first_row
        if isinstance(locals_, range):
            return slice(first + locals_.start, first + locals_.stop)
        return [first + j for j in locals_]

    def _shared_actions(self, locals_: Sequence[int]) -> list[Any]:
        """This step's actions of envs ``locals_``, copied out of the shared buffer."""
        assert self.layout is not None
        assert self.layout.actions is not None
        assert self.arrays is not None
        batch = take_rows(self.arrays.actions, self._rows(locals_))
        return self.layout.actions.split(batch, len(locals_))

    def _shared_resets(self, locals_: Sequence[int]) -> list[bool]:
        """This step's reset flags of envs ``locals_``, out of the shared buffer."""
        assert self.arrays is not None
        resets: list[bool] = self.arrays.resets[self._rows(locals_)].tolist()
        return resets

    # -- requests -------------------------------------------------------------------

    def step(
        self,
        locals_: Sequence[int],
        mode: str,
        reset_first: Sequence[bool] | None,
        actions: Sequence[Any] | None,
    ) -> StepReply:
        """Step envs ``locals_``: sync envs now, then async envs together."""
        return self._run(self.step_flow(locals_, mode, reset_first, actions))

    def step_flow(
        self,
        locals_: Sequence[int],
        mode: str,
        reset_first: Sequence[bool] | None,
        actions: Sequence[Any] | None,
    ) -> GroupFlow[StepReply]:
        """The flow of `step` (``None``: the resets or actions are in the shared buffer)."""
        if actions is None:
            actions = self._shared_actions(locals_)
        if reset_first is None:
            reset_first = self._shared_resets(locals_)
        errors: dict[int, BaseException] = {}
        infos: dict[int, dict[str, Any]] = {}
        finals: dict[int, dict[str, Any]] = {}
        odd: dict[int, Transition] = {}
        later: list[tuple[int, Any]] = []
        stepped: dict[int, Transition] = {}  # in the order of ``locals_``, async envs last
        envs, flows, is_async = self.envs, self.flows, self.is_async
        for k, j in enumerate(locals_):
            flow = flows[j] or flow_at(flows, j, mode)
            if is_async[j]:
                later.append((j, step_async(envs[j], flow, reset_first[k], actions[k])))
                continue
            try:
                stepped[j] = step_sync(envs[j], flow, reset_first[k], actions[k])
            except BaseException as exc:
                errors[j] = self._failed(j, exc)
        if later:
            results = yield [coro for _, coro in later]
            for (j, _), result in zip(later, results, strict=True):
                if isinstance(result, BaseException):
                    errors[j] = self._failed(j, result)
                else:
                    stepped[j] = result
        if not self._put_together(stepped, infos, finals):
            for j, transition in stepped.items():
                self._put(j, transition, infos, finals, odd)
        return StepReply(errors, infos, finals, odd)

    def _put_together(
        self,
        stepped: dict[int, Transition],
        infos: dict[int, dict[str, Any]],
        finals: dict[int, dict[str, Any]],
    ) -> bool:
        """Write every transition into the shared buffer at once, if every one fits exactly.

        The common case (each observation an array of the row's shape and dtype,
        exact number and flag types, dict infos) is recognised with loops that
        run in C; anything else returns ``False`` and goes env by env (`_put`).
        """
        if self._bulk is None or not stepped:
            return False
        observations, row_shape, dtype = self._bulk
        obs, rewards, terminations, truncations, infos_, finals_ = zip(
            *stepped.values(), strict=True
        )
        if not (
            _NUMBERS.issuperset(map(type, rewards))
            and _FLAGS.issuperset(map(type, terminations + truncations))
            and _DICTS.issuperset(map(type, infos_))
            and _ARRAYS.issuperset(map(type, obs))
        ):
            return False
        arrays = self.arrays
        assert arrays is not None
        keys = list(stepped)
        start = self.first_row + keys[0]
        rows: slice | list[int]
        # Rows joined end to end (``concatenate``: ``stack`` costs 3x).  Each
        # observation's first dimension is checked here; joining them checks the
        # others (a different count of dimensions, or a different size after the
        # first, raises ValueError), and ``casting="no"`` refuses another dtype,
        # all before a byte is written.
        joined_shape = (len(keys) * row_shape[0], *row_shape[1:])
        try:
            if set(map(len, obs)) != {row_shape[0]}:  # len() of a 0-d array: TypeError
                return False
            if keys == list(range(keys[0], keys[0] + len(keys))):
                rows = slice(start, start + len(keys))
                np.concatenate(obs, out=observations[rows].reshape(joined_shape), casting="no")
            else:
                rows = [self.first_row + j for j in keys]
                joined = np.concatenate(obs)
                if joined.dtype != dtype or joined.shape != joined_shape:
                    return False
                observations[rows] = joined.reshape((len(keys), *row_shape))
        except (TypeError, ValueError):  # another dtype, or another shape
            return False
        arrays.rewards[rows] = rewards
        arrays.terminations[rows] = terminations
        arrays.truncations[rows] = truncations
        if any(infos_):
            infos.update((j, info) for j, info in zip(stepped, infos_, strict=True) if info)
        if any(finals_):
            finals.update((j, f) for j, f in zip(stepped, finals_, strict=True) if f is not None)
        return True

    def _put(
        self,
        j: int,
        transition: Transition,
        infos: dict[int, dict[str, Any]],
        finals: dict[int, dict[str, Any]],
        odd: dict[int, Transition],
    ) -> None:
        """Write env ``j``'s transition into the shared buffer, or keep it for the reply."""
        obs, reward, terminated, truncated, info, final = transition
        arrays, i = self.arrays, self.first_row + j
        if (
            arrays is not None
            and type(reward) in _NUMBERS
            and type(terminated) in _FLAGS
            and type(truncated) in _FLAGS
            and type(info) is dict
            and self.write_obs(i, obs)
        ):
            arrays.rewards[i] = reward
            arrays.terminations[i] = terminated
            arrays.truncations[i] = truncated
            if info:
                infos[j] = info
            if final is not None:
                finals[j] = final
        else:
            odd[j] = transition

    def call(self, locals_: Sequence[int], op: CallOp) -> list[Outcome]:
        """One call per env of ``locals_``: sync envs now, then async envs together."""
        return self._run(self.call_flow(locals_, op))

    def call_flow(self, locals_: Sequence[int], op: CallOp) -> GroupFlow[list[Outcome]]:
        """The flow of `call`."""
        out: list[Outcome] = [(None, None)] * len(locals_)
        later: list[tuple[int, Any]] = []
        for k, j in enumerate(locals_):
            env, call = self.envs[j], op.calls[k]
            if self.is_async[j]:
                later.append((k, perform_async(env, call)))
                continue
            try:
                out[k] = (perform_sync(env, call), None)
            except BaseException as exc:
                out[k] = None, self._failed(j, exc)
        if later:
            results = yield [coro for _, coro in later]
            for (k, _), result in zip(later, results, strict=True):
                failed = isinstance(result, BaseException)
                out[k] = (None, self._failed(locals_[k], result)) if failed else (result, None)
        return out

    def _failed(self, j: int, error: BaseException) -> BaseException:
        self.flows[j] = None  # it still expects the failed call's result
        return _portable(error)

    def _run(self, flow: GroupFlow[T]) -> T:
        """Run a request's flow, its async envs on this group's own loop."""
        try:
            coros = next(flow)
            while True:
                coros = flow.send(self._loop().run_until_complete(gather_outcomes(coros)))
        except StopIteration as stop:
            result: T = stop.value
            return result

    def rebuild(self, locals_: Sequence[int]) -> dict[int, BaseException]:
        """Close and rebuild the envs ``locals_``; the errors of those that failed."""
        return self._run(self.rebuild_flow(locals_))

    def rebuild_flow(self, locals_: Sequence[int]) -> GroupFlow[dict[int, BaseException]]:
        """The flow of `rebuild`."""
        errors: dict[int, BaseException] = {}
        for j in locals_:
            yield from self._close(j)
            self.flows[j] = None
            (env,) = yield [make_env(self.fns[j])]
            try:
                if isinstance(env, BaseException):
                    raise env
                check_rebuilt(self.first + j, env, *self.spaces)
                self.is_async[j] = is_async_env(env)
            except Exception as exc:
                errors[j] = _portable(exc)
                continue
            self.envs[j] = env
        return errors

    def _close(self, j: int) -> GroupFlow[None]:
        try:
            result = perform_sync(self.envs[j], CLOSE)
        except Exception:  # the env already failed; its close may well fail too
            return
        if asyncio.iscoroutine(result):
            yield [result]  # its error, if any, is ignored too

    def close(self) -> None:
        """Release the worker's loop (envs were closed by a ``close`` op, or are lost)."""
        if self.loop is not None:
            for task in self.tasks:
                if task is not None:
                    task.cancel()
            self.loop.close()


class _Job:
    """A request of a worker process whose envs' calls run on its loop.

    ``left`` counts the envs not done; a step's results wait in ``stepped`` and
    ``errors`` until they are published (as they come: see `FLUSH_AFTER`); a
    call's in ``outcomes``, for one reply.
    """

    __slots__ = (
        "errors",
        "flushing",
        "lean",
        "left",
        "outcomes",
        "published",
        "running",
        "seq",
        "step",
        "stepped",
    )

    def __init__(self, seq: int, count: int, lean: bool, *, step: bool) -> None:
        self.seq, self.left, self.lean, self.step = seq, count, lean, step
        self.stepped: dict[int, Transition] = {}
        self.errors: dict[int, BaseException] = {}
        self.outcomes: list[Outcome] = []
        self.flushing = False  # a flush is scheduled on the loop
        self.published = False  # a part was published already
        self.running = False  # some of its envs' calls are tasks on the loop


def _new_loop() -> asyncio.AbstractEventLoop:
    """The worker's event loop: uvloop's where it is installed (less per waiting env)."""
    try:
        import uvloop  # noqa: PLC0415  (an optional extra)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _after(before: asyncio.Task[Any], coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, once the task ``before`` (the same env's call before, cancelled) ended."""
    try:
        await asyncio.wait([before])
    except BaseException:
        coro.close()
        raise
    return await coro


def build_flow(fns: Sequence[Callable[[], Any]], first: int) -> GroupFlow[list[Any]]:
    """Build the envs ``fns`` (the first is env ``first``) together, on the loop (`make_env`).

    Raises:
        _BuildFailed: for the lowest env whose factory failed or built no env;
            the envs built are closed.
    """
    envs = yield [make_env(fn) for fn in fns]
    for j, env in enumerate(envs):
        try:
            if isinstance(env, BaseException):
                raise _BuildFailed(first + j, env, by_factory=True) from env
            try:
                check_env(first + j, env)
                is_async_env(env)
            except TypeError as exc:
                raise _BuildFailed(first + j, exc, by_factory=False) from exc
        except _BuildFailed:
            close_quietly([e for e in envs if not isinstance(e, BaseException)])
            raise
    try:
        validate.check_distinct_envs(envs, first)
    except ValueError as exc:
        close_quietly(envs)
        raise _BuildFailed(first, exc, by_factory=False) from exc
    return list(envs)


async def gather_outcomes(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Await ``coros`` together; each one's result or exception, in order."""
    return await asyncio.gather(*coros, return_exceptions=True)


def _send(fd: int, message: Reply) -> None:
    try:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    except Exception:
        data = pickle.dumps(_portable_message(message), pickle.HIGHEST_PROTOCOL)
    write_all(fd, frame(data))


def _portable_message(message: Reply) -> Reply:
    """``message`` with every value that cannot be pickled replaced by an error."""
    seq, reply = message
    if isinstance(reply, CallReply):
        return Reply(seq, CallReply([_portable_outcome(*outcome) for outcome in reply.outcomes]))
    if isinstance(reply, StepReply):
        errors, infos, finals, odd, rows, envs = reply
        errors = dict(errors)
        for part in (infos, finals, odd):
            for j in list(part):
                _, error = _portable_outcome(part[j], None)
                if error is not None:
                    del part[j]
                    errors[j] = error
        return Reply(seq, StepReply(errors, infos, finals, odd, rows, envs))
    return message


def _portable_outcome(value: Any, error: BaseException | None) -> Outcome:
    if error is not None:
        return None, error
    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return None, TypeError(f"the env's result {value!r} cannot be sent to the parent: {exc}")
    return value, None


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its repr."""
    text = "".join(traceback.format_exception(error))
    try:
        copy = pickle.loads(pickle.dumps(error, pickle.HIGHEST_PROTOCOL))
    except Exception:
        copy = RuntimeError(f"{error!r} (raised in a worker process; it cannot be pickled)")
    if isinstance(copy, BaseException):
        copy.add_note(f"Raised in a worker process:\n{text}")
        return copy
    return RuntimeError(repr(error))
