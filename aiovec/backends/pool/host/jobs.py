"""A worker's job engine: steps and calls run, their replies emitted through one `Sink`.

A request's work is a *job* (`Job`).  Async envs' calls run as tasks of their
own on the worker's loop, so that a `Jobs.cancel` can end one env's call while
the others go on; sync envs run one after another, never interrupted.  A job
ends when its last env is done, and its reply is emitted then.

Replies stream.  A streamed step (``send()``) and a whole step under a
``step_timeout`` (*timed*) publish each env's result as soon as it is done, so
that the parent can tell, at a deadline, which env its worker still runs; so
do async envs' results in any step.  Envs done together share one part: async
envs that finish within `FLUSH_AFTER` of each other, and a run of sync envs at
its end.  A run of sync envs that goes on longer is cut by an alarm (a worker
process's ``SIGALRM``), which publishes what has finished so far.  Where no
alarm can cut in (a Ray actor, whose calls do not run on the main thread), a
run of sync envs publishes env by env and pauses (its flow yields an empty
list) so that its driver sends each part on before the next env starts.  A
step of sync envs only, neither streamed nor timed, is answered once.

Every reply leaves through the sink: a worker process's writes frames to its
reply pipe, a Ray actor's hands them to the call that waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from aiovec._core.calls import Transition
from aiovec.backends._drive import perform_async, step_async
from aiovec.backends.pool.host.envs import Envs, GroupFlow
from aiovec.backends.pool.host.rows import RowWriter
from aiovec.backends.pool.messages import (
    AttachReply,
    Call,
    CallReply,
    Failed,
    Outcome,
    Ready,
    RebuildReply,
    StepReply,
    StepRequest,
)

__all__ = ("FLUSH_AFTER", "Body", "Job", "Jobs", "Sink")

T = TypeVar("T")
Body = Ready | Failed | StepReply | CallReply | RebuildReply | AttachReply
"""What a worker says in reply to a request (`messages.Reply`'s body)."""

FLUSH_AFTER = 0.001
"""Seconds a finished env's result may wait to share a message with others.

Async envs' results that finish within this of each other go in one message.
In a streamed or timed request a worker publishes its sync envs' results
at the end of each run of sync envs, in one message; if that run goes on for
longer than this, an alarm publishes what has finished so far, so that a slow
env never holds back the results before it for long.  A request's last result
is published at once, with what is left."""


class Sink(Protocol):
    """Where a worker's results and replies go: the only writer of them."""

    def stepped(self, seq: int, done: list[int], reply: StepReply) -> None:
        """Envs ``done`` (local) of step request ``seq`` are done, their results in the rows.

        ``reply`` holds what the rows cannot (by local index); its ``envs`` is
        ``None`` when these are the request's last envs.
        """

    def called(self, seq: int, locals_: Sequence[int], reply: CallReply) -> None:
        """Call request ``seq`` on envs ``locals_`` is done: one outcome per env, in order."""

    def reply(self, seq: int, body: Body) -> None:
        """Reply ``body`` to control request ``seq`` (a rebuild, an attach)."""


class Job:
    """A request whose envs run: ``left`` counts the envs not done.

    A step's results wait in ``stepped`` and ``errors`` until they are
    published (see `FLUSH_AFTER`); a call's in ``outcomes``, for one reply.
    """

    __slots__ = (
        "errors",
        "flushing",
        "left",
        "locals",
        "outcomes",
        "running",
        "seq",
        "step",
        "stepped",
    )

    def __init__(self, seq: int, locals_: Sequence[int], *, step: bool) -> None:
        self.seq, self.locals, self.left, self.step = seq, locals_, len(locals_), step
        self.stepped: dict[int, Transition] = {}
        self.errors: dict[int, BaseException] = {}
        self.outcomes: list[Outcome] = []
        self.flushing = False  # a flush is scheduled on the loop
        self.running = False  # some of its envs' calls are tasks on the loop


class Jobs:
    """Runs a worker's steps and calls; emits their replies through ``sink``.

    ``loop`` gives the loop that runs async envs' calls (a worker process's
    own, a Ray actor's running one); ``alarm(seconds)`` sets (0: clears) a
    timer that calls `on_alarm`, where there is one (a worker process's main
    thread).
    """

    def __init__(
        self,
        envs: Envs,
        rows: RowWriter,
        sink: Sink,
        loop: Callable[[], asyncio.AbstractEventLoop],
        alarm: Callable[[float], None] | None = None,
    ) -> None:
        self.envs, self.rows, self.sink, self.loop, self.alarm = envs, rows, sink, loop, alarm
        self.running: set[Job] = set()  # jobs with calls on the loop
        self.tasks: list[asyncio.Task[Any] | None] = [None] * len(envs.envs)  # each env's call
        self.seqs = [0] * len(envs.envs)  # the request each env's task belongs to
        self._changed: asyncio.Future[None] | None = None  # a job ended
        self._burst: Job | None = None  # the published job whose sync envs run now
        self._armed = False  # the alarm is set
        self._writing = False  # a reply is being written (the alarm must not cut in)

    # -- steps ----------------------------------------------------------------------

    def step(self, request: StepRequest) -> GroupFlow[None]:
        """Run a step as a job: async envs as tasks, then sync envs, in turn.

        The flow yields (an empty
        list: a pause) after each sync env's part where no alarm cuts a run of
        sync envs.
        """
        envs, locals_, mode = self.envs, request.locals, request.mode
        actions = request.actions
        if actions is None:
            actions = self.rows.actions(locals_)
        reset_first = request.reset_first
        if reset_first is None:
            reset_first = self.rows.resets(locals_)
        job = Job(request.seq, locals_, step=True)
        publish = request.stream or request.timed
        if not publish and not envs.any_async(locals_):  # stepped at once, answered once
            envs.step_sync(
                locals_, mode, reset_first, actions, stepped=job.stepped, errors=job.errors
            )
            job.left = 0
            self._answer(job, job.stepped, job.errors, last=True)
            return
        # Async envs' results are always published as they come: a slow env must
        # not make another env of its worker miss its deadline.
        later = []
        for k, j in enumerate(locals_):
            if envs.is_async[j]:
                self._start(job, k, j, self._step_async(j, mode, reset_first[k], actions[k]))
            else:
                later.append(k)
        if later:
            yield from self._run_sync(job, later, request, reset_first, actions, publish)
        self._progress(job)

    def _run_sync(  # noqa: PLR0917  (a step's run of sync envs)
        self,
        job: Job,
        later: list[int],
        request: StepRequest,
        reset_first: Sequence[bool],
        actions: Sequence[Any],
        publish: bool,
    ) -> GroupFlow[None]:
        """Step the sync envs ``later`` (positions in the request), publishing as it goes."""
        locals_, mode, alarm = request.locals, request.mode, self.alarm
        self._burst = job if publish and len(later) > 1 and alarm is not None else None
        each = publish and alarm is None  # no alarm (a Ray actor): publish env by env
        try:
            for k in later:
                one = (locals_[k],)
                self.envs.step_sync(
                    one,
                    mode,
                    (reset_first[k],),
                    (actions[k],),
                    stepped=job.stepped,
                    errors=job.errors,
                )
                job.left -= 1
                if each and job.left:
                    self._publish(job, last=False)
                    yield []
                elif self._burst is not None and job.left and not self._armed:
                    assert alarm is not None
                    self._armed = True
                    alarm(FLUSH_AFTER)
        finally:
            self._burst = None
            if self._armed:
                self._armed = False
                assert alarm is not None
                alarm(0)
        if job.left and (job.stepped or job.errors):  # async envs still to run: publish
            self._publish(job, last=False)

    def _step_async(self, j: int, mode: str, reset_first: bool, action: Any) -> Any:
        """Async env ``j``'s step, as a coroutine; after its cancelled call, if one unwinds."""
        before = self.tasks[j]
        if before is None or before.done():
            return step_async(self.envs.envs[j], self.envs.flow(j, mode), reset_first, action)
        # its flow is known once the cancelled call has ended
        return _after(before, self._step_async_now(j, mode, reset_first, action))

    async def _step_async_now(self, j: int, mode: str, reset_first: bool, action: Any) -> Any:
        return await step_async(self.envs.envs[j], self.envs.flow(j, mode), reset_first, action)

    # -- calls ----------------------------------------------------------------------

    def call(self, request: Call) -> None:
        """One call per env: sync envs' at once, async envs' as tasks; one reply."""
        envs, locals_, op = self.envs, request.locals, request.op
        job = Job(request.seq, locals_, step=False)
        job.outcomes = [(None, None)] * len(locals_)
        for k, j in enumerate(locals_):
            if envs.is_async[j]:
                coro = perform_async(envs.envs[j], op.calls[k])
                before = self.tasks[j]
                if before is not None and not before.done():
                    coro = _after(before, coro)
                self._start(job, k, j, coro)
                continue
            job.outcomes[k] = envs.call_sync(j, op, k)
            job.left -= 1
        self._progress(job)

    def cancel(self, locals_: Sequence[int], seq: int = 0) -> None:
        """Cancel the async envs' calls in flight (each fails with CancelledError).

        ``seq``: only those of request ``seq`` (0: whatever runs).  A transport
        whose cancels may overtake later calls (a Ray actor's methods run in no
        set order) names the request, so that a late cancel never reaches the
        env's next call.
        """
        for j in locals_:
            task = self.tasks[j]
            if task is not None and (not seq or self.seqs[j] == seq):
                task.cancel()

    def in_flight(self, locals_: Sequence[int]) -> list[asyncio.Task[Any]]:
        """The calls of envs ``locals_`` still running (cancelled ones may still unwind)."""
        return [task for j in locals_ if (task := self.tasks[j]) is not None]

    def close(self) -> None:
        """Cancel every call in flight (the worker is going)."""
        self.cancel(range(len(self.tasks)))

    # -- tasks on the loop ----------------------------------------------------------

    def _start(self, job: Job, k: int, j: int, coro: Coroutine[Any, Any, Any]) -> None:
        """Run env ``j``'s call ``coro`` as a task (the k-th env of ``job``)."""
        task = self.loop().create_task(coro)
        self.tasks[j] = task
        self.seqs[j] = job.seq
        if not job.running:
            job.running = True
            self.running.add(job)
        task.add_done_callback(functools.partial(self._async_done, job, k, j))

    def _async_done(self, job: Job, k: int, j: int, task: asyncio.Task[Any]) -> None:
        if self.tasks[j] is task:
            self.tasks[j] = None
        try:
            value = task.result()
        except BaseException as exc:  # a CancelledError too: its call was abandoned
            error = self.envs.failed(j, exc)
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

    def _progress(self, job: Job) -> None:
        """Reply once every env of ``job`` is done; a step publishes as they end."""
        if job.left == 0:
            self.running.discard(job)
            if job.step:
                self._publish(job, last=True)
            else:
                self.sink.called(job.seq, job.locals, CallReply(job.outcomes))
            changed = self._changed
            if changed is not None and not changed.done():
                changed.set_result(None)
            return
        if job.step and not job.flushing and (job.stepped or job.errors):
            job.flushing = True  # envs done within FLUSH_AFTER share a reply
            self.loop().call_later(FLUSH_AFTER, self._flush, job)

    async def until(self, event: asyncio.Future[None]) -> None:
        """Run until ``event`` is done or no job has calls on the loop."""
        loop = self.loop()
        while self.running and not event.done():
            changed = self._changed = loop.create_future()
            await asyncio.wait([event, changed], return_when=asyncio.FIRST_COMPLETED)

    # -- publishing -----------------------------------------------------------------

    def _flush(self, job: Job) -> None:
        job.flushing = False
        if job.left and (job.stepped or job.errors):
            self._publish(job, last=False)

    def on_alarm(self) -> None:
        """The alarm: publish the results of a run of sync envs that goes on."""
        self._armed = False
        job = self._burst
        if job is None or self._writing or not (job.stepped or job.errors):
            return
        with contextlib.suppress(Exception):  # a broken pipe: the parent is gone
            self._publish(job, last=False)

    def _publish(self, job: Job, *, last: bool) -> None:
        """Write the results of ``job`` not yet published to the rows; reply with the rest."""
        self._writing = True
        try:
            # Copied and emptied, never replaced: an alarm that cuts in between the
            # main thread's reading ``job.stepped`` and storing into it loses nothing.
            stepped, errors = job.stepped.copy(), job.errors.copy()
            job.stepped.clear()
            job.errors.clear()
            self._answer(job, stepped, errors, last=last)
        finally:
            self._writing = False

    def _answer(
        self,
        job: Job,
        stepped: dict[int, Transition],
        errors: dict[int, BaseException],
        *,
        last: bool,
    ) -> None:
        """Write ``stepped`` to the rows; publish them with the rest (a part, unless ``last``)."""
        infos, finals, odd = self.rows.write(stepped)
        done = [*stepped, *errors]
        self.sink.stepped(
            job.seq, done, StepReply(errors, infos, finals, odd, envs=None if last else done)
        )


async def _after(before: asyncio.Task[Any], coro: Coroutine[Any, Any, T]) -> T:
    """``coro``, once the task ``before`` (the same env's call before, cancelled) ended."""
    try:
        await asyncio.wait([before])
    except BaseException:
        coro.close()
        raise
    return await coro
