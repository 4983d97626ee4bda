"""The process transport: worker processes, a shared completion table and one doorbell.

Theory of operation.  The pool (``backends/pool/``) decides what each env
does; this transport carries its requests to W worker processes
(``child.py``) and brings the outcomes back.  Three things are shared with
every worker (``shared.py``): the step rows (actions, observations, rewards,
flags), the completion table (``table.py``: per env a request number and a
done number) and the doorbell.

- **A step.**  The parent copies the batch of actions and the reset flags
  into the rows with numpy, writes each env's request number into the table
  (one numpy operation), and wakes each worker with one 15-byte `WholeStep`
  on its request pipe.  Each worker steps its envs through their own flows
  (autoreset included: the rule lives once, in ``_core``), writes the
  results into the rows and publishes them in the table; the last worker to
  finish rings the doorbell.  The parent, asleep on the doorbell alone (a
  blocking caller in ``poll``, the await API through one loop reader), wakes
  once, finds with one comparison that every env is done, and hands the whole
  step to the pool as one block (`Pool.finish_whole`).  A clean step costs the
  parent no Python per env and one wake; nothing is pickled.
- **What the rows cannot hold** (a non-empty info, a ``SAME_STEP`` final, an
  error, a transition of another shape or type, a call's outcome) comes as a
  message on the worker's reply pipe, written before the env's done mark,
  which is negated to say so: the parent reads that pipe only then (`_read`).
  Control requests (a rebuild, mapping the rows) and their replies keep the
  message path; a worker counts those replies in the table (``notes``).
- **Other calls** (``send()``'s steps, calls, steps whose actions do not fit
  the rows) are one request per worker part, each a `Request` in the pool's
  table, numbered, its envs' request numbers in the completion table.  What
  comes back is taken in by a *look* (`_look`): one comparison finds the envs
  done, which are delivered by request; a streamed request in parts.
- **Waiting.**  Before it sleeps, the parent arms the doorbell with the number
  of completions it waits for (``CompletionTable.arm``): the worker whose
  completions reach it rings.  ``recv(min_envs=k)`` sleeps until k envs are
  done, whichever workers they are on.
- **Deaths.**  The same wait watches every worker's sentinel: a death is seen
  at once, whatever the worker was doing.  The dead worker's last messages
  are read, what it published is taken in (those envs finished), and the pool
  fails the rest (`Pool.lose`).  A worker killed between writing its rows and
  marking them done leaves envs that are simply not done: they fail with it.
- **Cancel.**  An async env's call is cancelled in its worker (a `Cancel`);
  its late completion carries the old request number, and the table never
  takes it for a later call's.

A whole step's requests are written in the pool's table only when something
other than a clean end happens (`_settle_whole`): a death, a cancel, a
deadline, news in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import multiprocessing
import os
import pickle
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar

import cloudpickle
import numpy as np

from aiovec._core import validate
from aiovec._core.layout import StepLayout
from aiovec._core.ops import Op, StepOp
from aiovec._core.rows import StepBlock
from aiovec._errors import WorkerDiedError
from aiovec.backends._base import Backend, EnvTraits
from aiovec.backends.pool.messages import (
    Attach,
    AttachReply,
    Call,
    CallReply,
    Cancel,
    Rebuild,
    RebuildReply,
    Reply,
    StepReply,
    Stop,
)
from aiovec.backends.pool.table import Request
from aiovec.backends.pool.transport import Part, close_op
from aiovec.backends.process import child
from aiovec.backends.process import link as links
from aiovec.backends.process.link import Link, framed
from aiovec.backends.process.shared import Doorbell, StepRows, close_map, mapped, nameless
from aiovec.backends.process.table import FENCE, NEVER, CompletionTable
from aiovec.backends.process.watch import Watch
from aiovec.backends.process.wire import SharedFile, whole_frames

if TYPE_CHECKING:
    from aiovec.backends.pool.pool import Pool

__all__ = ("ProcessTransport",)


class ProcessTransport:
    """Carries a pool's requests to worker processes (see the module).

    Args:
        pool: The pool it carries requests for.
        options: ``{"cpus": ...}`` (`validate.check_cpus`): pin worker ``k`` to
            ``cpus[k % len(cpus)]``; ``None``: the OS places every worker;
            ``"auto"`` (the default): pinned when there is one worker per
            usable CPU.
    """

    INTERRUPTS: ClassVar[bool] = True

    def __init__(self, pool: Pool, options: dict[str, Any]) -> None:
        from aiovec.backends import process as package  # noqa: PLC0415  (its START_METHOD)

        self.pool = pool
        self._cpus_option = validate.check_cpus(options.get("cpus", "auto"))
        self._method = package.START_METHOD
        self._ctx = multiprocessing.get_context(self._method)
        if self._method == "forkserver":
            self._ctx.set_forkserver_preload([child.__name__])
        self._usable = validate.usable_cpus()
        self.default_workers = len(self._usable)
        self.workers: list[Link] = []
        self._seq = 0  # the number of the newest request
        self._whole: list[Any] | None = None  # a whole step in flight: [seq0, since, op, sent]
        self._seen = 0  # completions published when the table was last looked at
        self._need: Callable[[], int] | None = None  # what the loop's waiter waits for
        self._said: dict[int, list[StepReply]] = {}  # messages of steps, by request number
        self._frames: tuple[Any, ...] = (None, None)  # (mode, timed, pack, code, flags)
        self._action_leaf: np.ndarray | None = None  # the rows' actions, if one array
        self._notes = np.zeros(0, np.int64)  # each worker's notes, as last read
        self._bell = Doorbell()
        self._rows = StepRows()
        self._table_fd = nameless("aiovec-completions")
        self._table_map: mmap.mmap | None = None
        self.completions: CompletionTable | None = None
        self._watch = Watch(self._bell, self.workers, self._on_ring, self._on_exit)
        self._finalizer = weakref.finalize(self, links.reap, self.workers, self._release)

    # -- starting ----------------------------------------------------------------------

    def start(self) -> list[EnvTraits]:
        """A worker process per group (pinned, if so chosen); their reports; the rows shared."""
        pool = self.pool
        groups = pool.groups
        size = CompletionTable.nbytes(pool.num_envs, len(groups))
        self._table_map = mapped(self._table_fd, size)
        table = self.completions = CompletionTable(self._table_map, pool.num_envs, len(groups))
        table.blank()
        self._owners = np.array(pool.owner, np.int64) + 1  # env -> its worker's number + 1
        self._starts = [group.start for group in groups]
        self._notes = np.zeros(len(groups), np.int64)  # each worker's notes, as last read
        self._specs = links.foreign_specs()
        cpus = self._cpus_option
        if cpus == "auto":  # one worker per usable CPU: each on its own
            pin = len(groups) == len(self._usable) and hasattr(os, "sched_setaffinity")
            cpus = tuple(self._usable) if pin else None
        assert not isinstance(cpus, str)
        self._cpus = cpus
        for w in range(len(groups)):
            self.workers.append(self._start(w))
        traits = [self._ready(w, links.first_message(link)) for w, link in enumerate(self.workers)]
        self._share(traits[0])
        for link in self.workers:
            os.set_blocking(link.reply_fd, False)
        self._notes[:] = table.notes
        self._bell.clear()
        return traits

    def _start(self, w: int) -> Link:
        pool = self.pool
        group = pool.groups[w]
        boot = child.Boot(
            SharedFile(self._table_fd),
            SharedFile(self._bell.ring_fd),
            SharedFile(self._rows.fd),
            cloudpickle.dumps([pool.fns[i] for i in group]),
            group.start,
            w,
            pool.num_envs,
            len(pool.groups),
        )
        boot.specs = self._specs
        cpu = None if self._cpus is None else self._cpus[w % len(self._cpus)]
        return links.start(self._ctx, boot, group, cpu)

    def _ready(self, w: int, body: Any) -> EnvTraits:
        """Worker ``w``'s traits, from its first word (``None``: it died first)."""
        traits = links.check_ready(self.workers[w], body)
        self.pool.table.note_ready(w, body)
        return traits

    def _share(self, traits: EnvTraits) -> None:
        """Size the step rows for the spaces and map them in every worker (no loop: blocking)."""
        layout = StepLayout.of(
            traits.observation_spaces[0], traits.action_spaces[0], self.pool.num_envs
        )
        if layout is None:  # every result travels by message
            return
        arrays = self._rows.size(layout)
        if isinstance(arrays.actions, np.ndarray):
            self._action_leaf = arrays.actions
        for link in self.workers:
            self._seq += 1
            try:
                attached = link.ask_blocking(framed(Attach(self._seq, layout)))
            except (EOFError, OSError):
                link.process.join(1.0)
                died = link.death()
                raise WorkerDiedError(dict.fromkeys(link.group, died), "setup") from died
            assert isinstance(attached, AttachReply)
            if attached.error is not None:
                raise attached.error

    @property
    def pids(self) -> tuple[int | None, ...]:
        """The process id of each worker (for diagnostics and tests)."""
        return tuple(link.process.pid for link in self.workers)

    @property
    def shares_memory(self) -> bool:
        """Whether step data goes through the shared step rows (else it is pickled)."""
        return self._rows.arrays is not None

    def rows_of(self, request: Request, rows: Sequence[int], reply: StepReply) -> Any:
        """The block of rows ``rows`` of a reply: the shared step rows themselves."""
        return rows, self._rows.arrays

    # -- sending -----------------------------------------------------------------------

    def send(self, parts: list[Part], op: Op, since: float, whole: bool) -> None:
        """One request per part; a whole step whose actions fit the rows is one `WholeStep` each.

        A whole step is the hot path: its actions and reset flags go into the rows
        and its request numbers into the table with numpy, and every frame is
        made (in C) before any is written, so that the workers start together (a
        worker woken while the parent still works shares its core).
        """
        if asyncio.get_running_loop() is not self._watch.loop:
            self._watch.attach()
        if self._whole is not None:
            self._settle_whole()
        if whole and type(op) is StepOp and not op.stream and self._put_whole(op):
            table = self.completions
            assert table is not None
            seq0 = self._seq
            workers = self.workers
            self._seq += len(workers)
            np.add(self._owners, seq0, out=table.req)
            frames = self._frames
            if frames[0] is not op.mode or frames[1] is not op.timed:
                frames = self._frames = (op.mode, op.timed, *whole_frames(op.mode.value, op.timed))
            _, _, pack, code, flags = frames
            out = list(
                map(pack, range(seq0 + 1, seq0 + 1 + len(workers)), repeat(code), repeat(flags))
            )
            self._seen = sum(table.counts)  # before any worker can publish this step
            sent = self._whole = [seq0, since, op, 0]
            for link, data in zip(workers, out, strict=True):
                try:  # (`_post`, inline: 15 bytes go whole into a pipe with room)
                    if link.outbox:
                        raise BlockingIOError
                    os.write(link.request_fd, data)
                except BlockingIOError:
                    self._post(link, data)
                except OSError:  # a dead worker: its sentinel tells whichever waits next
                    pass
                sent[3] += 1  # in flight once written
            return
        in_rows = (
            type(op) is StepOp
            and op.stream
            and self.pool._slots is None  # a call waiting for a slot is sent on its own
            and (rows := _in_order(parts, len(op.actions))) is not None
            and self._rows.put_step(op, rows)
        )
        for w, envs, positions in parts:
            part = op if in_rows else op.subset(positions)
            self._send(self.workers[w], envs, part, since, in_rows)

    def _put_whole(self, op: StepOp) -> bool:
        """Copy a whole step's actions and reset flags into the rows; whether they fit."""
        batch, leaf = op.batch, self._action_leaf
        if (
            leaf is None
            or type(batch) is not np.ndarray
            or batch.dtype != leaf.dtype
            or batch.shape != leaf.shape
        ):
            return self._rows.put_step(op)
        leaf[...] = batch  # one array of actions: `StepRows.put_step`'s check, inline
        arrays = self._rows.arrays
        assert arrays is not None
        try:  # plain bools (an autoreset with options travels by message): bytes, at C speed
            arrays.resets[:] = np.frombuffer(bytes(op.reset_first), np.bool_)
        except TypeError:  # numpy's bools
            arrays.resets[:] = op.reset_first
        return True

    def _send(self, link: Link, envs: Sequence[int], op: Op, since: float, in_rows: bool) -> None:
        """Send ``op`` for ``envs`` (all hosted by ``link``), pickled or as a `WholeStep`.

        The request is in flight once written: a Ctrl-C between two workers'
        requests leaves none awaited that its worker never got.
        """
        self._seq += 1
        seq = self._seq
        try:  # a call's argument may not pickle
            data = links.request_frame(seq, link.group, envs, op, in_rows)
        except Exception as exc:
            self.pool.unsendable(envs, op, exc)
            return
        request = self.pool.table.track(link, envs, since, op, seq)
        table = self.completions
        assert table is not None
        table.req[_index(envs)] = seq
        self._post(link, data)
        self.pool.table.requests[seq] = request
        self.pool.table.wait_on(request, envs)

    def _post(self, link: Link, data: bytes) -> None:
        """Write a framed request (what the pipe cannot take waits for room).

        A broken pipe is ignored here: the worker's sentinel tells whichever waits next.
        """
        try:
            if link.write(data):
                self._watch.wait_to_write(link)
        except OSError:
            pass

    def _control(self, link: Link, kind: type[Rebuild | Attach], arg: Any) -> asyncio.Future[Any]:
        """Send a request that no env waits on; its reply (counted in ``notes``) resolves it."""
        loop = self._watch.attach()
        self._seq += 1
        future: asyncio.Future[Any] = loop.create_future()
        self._post(link, framed(kind(self._seq, arg)))
        self.pool.table.requests[self._seq] = Request(link, (), 0.0, future)
        return future

    def interrupt(self, worker: Link, locals_: list[int]) -> None:
        """Ask ``worker`` to cancel the calls of its async envs ``locals_``."""
        if worker.alive:  # if it died: its sentinel says so
            self._post(worker, framed(Cancel(0, locals_)))

    # -- taking outcomes in ------------------------------------------------------------

    def _look(self, settle: bool = False) -> None:
        """Take in every outcome the table holds now (see the module).

        A whole step that is not over is left as it is, unless something
        other than clean progress came (a message), or ``settle``.  Every
        completion counted in `_seen` is taken in: an armed doorbell waits
        for that many more.
        """
        table = self.completions
        assert table is not None
        total = table.total()  # before looking: each completion counted is visible
        whole = self._whole
        if whole is not None:
            done, req = table.done, table.req
            if whole[3] == len(self.workers) and (done == req).all():
                self._seen = total
                self._whole = None
                req.fill(0)
                pool, arrays = self.pool, self._rows.arrays
                assert arrays is not None  # (else the step was not whole)
                pool._finish_block(StepBlock(pool.all, arrays, {}, {}), whole[1])
                if pool.table.stuck:
                    self._unstick()
                return
            if (
                not settle
                and total < self._seen + len(done)  # (else late completions of earlier calls)
                and not (done == -req).any()
                and (table.notes == self._notes).all()
            ):
                return  # (its completions so far are not taken in: `_seen` stays as it was)
            self._settle_whole()
        self._seen = total
        clean, told = table.finished()
        done = np.flatnonzero(clean | told)
        seqs = table.req[done]
        if told.any() or (table.notes != self._notes).any():
            # Read after the marks were seen: their messages, written before, are there.
            self._read_told(told)
            keep = table.req[done] == seqs  # calls are delivered as read (and may start anew)
            if not keep.all():
                done, seqs = done[keep], seqs[keep]
        if done.size:
            table.req[done] = 0
            self._deliver(done, seqs)
        if self.pool.table.stuck:
            self._unstick()

    def _read_told(self, told: np.ndarray) -> None:
        """Read the pipes of the workers that said something (their envs' marks, their notes)."""
        table = self.completions
        assert table is not None
        owners = set(np.flatnonzero(np.logical_or.reduceat(told, self._starts)).tolist())
        for link in list(self.workers):
            notes = int(table.notes[link.w])
            if link.alive and (link.w in owners or notes != self._notes[link.w]):
                self._notes[link.w] = notes
                self._read(link)

    def _read(self, link: Link) -> None:
        """Handle every message ``link``'s pipe holds; one that cannot be read kills it."""
        for payload in link.read():
            try:
                self._receive(link, pickle.loads(payload))
            except Exception as exc:  # any: its envs must not wait forever
                self._unreadable(link, exc)
                return

    def _receive(self, link: Link, message: Reply) -> None:
        """One message: a step's news (kept for its envs' marks), a call's outcomes, a reply."""
        seq, body = message
        if seq == 0:  # a respawned worker is ready (or failed to build)
            if link.ready is not None and not link.ready.done():
                link.ready.set_result(body)
            return
        if type(body) is StepReply:
            self._said.setdefault(seq, []).append(body)
            return
        request = self.pool.table.requests.pop(seq, None)
        if request is None:  # a reply to a request abandoned with its worker
            return
        if type(body) is CallReply:
            table = self.completions
            assert table is not None
            rows = _index(request.envs)
            table.req[rows] = np.where(table.req[rows] == seq, 0, table.req[rows])
        self.pool.deliver(request, body)

    def _deliver(self, done: np.ndarray, seqs: np.ndarray) -> None:
        """Deliver envs ``done`` by request (``seqs``: the number of the one each finished)."""
        if seqs[0] == seqs[-1] and (seqs == seqs[0]).all():
            groups = [(int(seqs[0]), done)]
        else:
            numbers, inverse = np.unique(seqs, return_inverse=True)
            groups = [(int(seq), done[inverse == k]) for k, seq in enumerate(numbers)]
        requests = self.pool.table.requests
        for seq, envs in groups:
            request = requests.get(seq)
            if request is None:
                continue
            request.left -= len(envs)
            last = request.left <= 0
            if last:
                del requests[seq]
            first = request.worker.group.start
            local = (envs - first).tolist()
            reply = self._news(seq, local, last)
            self.pool.deliver_step(request, reply._replace(envs=None if last else local))

    def _news(self, seq: int, local: list[int], last: bool) -> StepReply:
        """What the messages of request ``seq`` said of the envs ``local``."""
        said = self._said.pop(seq, None) if last else self._said.get(seq)
        if not said:
            return StepReply({}, {}, {}, {})
        if len(said) == 1 and last:
            return said[0]
        keep = set(local)
        reply = StepReply({}, {}, {}, {})
        for part in said:
            reply.errors.update((j, v) for j, v in part.errors.items() if j in keep)
            reply.infos.update((j, v) for j, v in part.infos.items() if j in keep)
            reply.finals.update((j, v) for j, v in part.finals.items() if j in keep)
            reply.odd.update((j, v) for j, v in part.odd.items() if j in keep)
        return reply

    def _unstick(self) -> None:
        """Drop the abandoned calls whose worker is done with them (their late outcome)."""
        table, pool = self.completions, self.pool
        assert table is not None
        for i, request in list(pool.table.stuck.items()):
            if request.worker.alive and table.ended(i, request.seq):
                pool.table.waiting(request, [i])
                request.left -= 1
                if request.left <= 0:
                    pool.table.requests.pop(request.seq, None)
                    self._said.pop(request.seq, None)

    def _settle_whole(self) -> None:
        """Write a whole step's requests into the pool's table (see the module)."""
        whole, self._whole = self._whole, None
        if whole is None:
            return
        seq0, since, op, sent = whole
        pool = self.pool
        table = pool.table
        for w in range(sent):
            link = self.workers[w]
            request = table.track(link, link.group, since, op, seq0 + 1 + w)
            table.requests[seq0 + 1 + w] = request
            table.wait_on(request, link.group)
        pool._started[:] = [since] * pool.num_envs

    # -- waiting -----------------------------------------------------------------------

    def receive(self, need: Callable[[], int], deadline: float | None) -> bool:
        """Take in what came; a parked caller also waits here (see `Transport.receive`).

        A parked caller's whole step has a wait of its own (`_wait_whole`).  Asked
        for nothing (a refresh: the pool acts on its table next), a whole step's
        requests are written into the pool's table too.
        """
        parked = not asyncio.get_running_loop().is_running()
        whole = self._whole
        wanted_all = self.pool._wanted >= self.pool.num_envs
        if whole is not None and parked and wanted_all and self._wait_whole(whole, deadline):
            return True
        self._look(settle=need() <= 0)
        if not parked:
            self._need = need
            self._rearm()
            return False
        table = self.completions
        assert table is not None
        try:
            while (count := self._expected(need)) > 0:
                if table.arm(self._seen, count):
                    self._look()
                    continue
                seconds = None if deadline is None else max(0.0, deadline - time.monotonic())
                self._watch.wait(seconds)
                self._look()
                if seconds == 0.0:
                    break
        finally:
            table.disarm()
        return True

    def _wait_whole(self, whole: list[Any], deadline: float | None) -> bool:
        """Sleep until every env of a whole step is counted; deliver it if it ended clean.

        The doorbell alone is waited on (a death, the deadline or a request
        waiting for room ends this wait: the general one goes on).  Returns
        whether the step was delivered, as one block.
        """
        table, watch = self.completions, self._watch
        assert table is not None
        counts, words = table.counts, table.words
        wake_at = self._seen + table.num_envs
        words[0] = wake_at  # (`CompletionTable.arm`, inline: the hot path)
        FENCE.release()  # (`fence`)
        FENCE.acquire()
        try:
            while (total := sum(counts)) < wake_at:
                seconds = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not watch.wait(seconds) or seconds == 0.0:
                    return False
        finally:
            words[0] = NEVER
        done, req = table.done, table.req
        if whole is not self._whole or done.tobytes() != req.tobytes():
            return False  # late completions counted, news, or a death meanwhile
        FENCE.release()  # (`fence`, ARM): the marks before the rows
        FENCE.acquire()
        self._seen = total
        self._whole = None
        req.fill(0)
        pool, arrays = self.pool, self._rows.arrays
        assert arrays is not None  # (else the step was not whole)
        # (a whole step has no max_concurrency slots to give back: `Backend`'s own)
        Backend._finish_block(pool, StepBlock(pool.all, arrays, {}, {}), whole[1])
        if pool.table.stuck:
            self._unstick()
        return True

    def _expected(self, need: Callable[[], int]) -> int:
        """How many completions the next wake waits for: ``need()``, never more than can come.

        Only envs sent to their workers can complete: not those still waiting for
        a ``max_concurrency`` slot, nor those of a whole step that a worker
        published early (held, see `WorkTable.track`), which count as outcomes
        only with the step's last part.
        """
        wanted = need()
        if wanted <= 0:
            return 0
        pool = self.pool
        out = len(pool.pending) - len(pool.queued)
        if self._whole is None and pool.table.requests:
            out -= sum(len(r.done) for r in pool.table.requests.values() if r.done)
        return max(1, min(wanted, out))

    def _on_ring(self) -> None:
        """The loop saw the doorbell: take in what came, arm it again for what is waited for."""
        self._bell.clear()
        self._look()
        self._rearm()

    def _rearm(self) -> None:
        table = self.completions
        assert table is not None
        need = self._need
        while need is not None and (count := self._expected(need)) > 0:
            if not table.arm(self._seen, count):
                return
            self._look()
        self._need = None
        table.disarm()

    async def settle_cancelled(self) -> None:
        """Nothing of a cancelled call runs in this process."""

    # -- deaths ------------------------------------------------------------------------

    def _on_exit(self, link: Link, killed: ChildProcessError | None = None) -> None:
        """The worker's process ended (``killed``: why this side killed it): lose its envs.

        What it published before dying is taken in first (those envs finished).
        """
        if not link.alive:
            return
        self._settle_whole()
        if killed is None:  # messages it wrote before dying still count
            with contextlib.suppress(Exception):  # one that cannot be read is dropped
                for payload in link.read():
                    self._receive(link, pickle.loads(payload))
            self._look()
        self._watch.unwatch(link)
        self._watch.changed()
        link.alive = False
        link.close_pipes()
        link.process.join(1.0)  # its sentinel is ready: this reaps it at once
        died = killed if killed is not None else link.death()
        table = self.completions
        assert table is not None
        table.req[link.group.start : link.group.stop] = 0
        for request in self.pool.table.forget(link):
            self._said.pop(request.seq, None)
            if request.future is not None and not request.future.done():
                request.future.set_exception(died)
        self.pool.lose(link, died)
        for waiter in (link.ready, link.exited):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self._rearm()  # fewer completions can come now

    def _unreadable(self, link: Link, error: Exception) -> None:
        """A message of ``link`` could not be delivered (corrupt, or a bug here): kill it.

        Its messages can no longer be trusted: its envs fail with `WorkerDiedError`
        (caused by ``error``) and are rebuilt on a new worker, as after a crash.
        """
        if link.alive:
            self._on_exit(link, link.kill(f"a reply of it could not be read ({error!r})", error))

    def kill(self, w: int) -> None:
        """Kill worker ``w`` now (its envs are lost)."""
        link = self.workers[w]
        if link.alive:
            self._on_exit(link, link.kill("it was blocked"))

    # -- rebuilding and closing --------------------------------------------------------

    async def rebuild_in_place(self, w: int, locals_: list[int]) -> dict[int, BaseException]:
        """Rebuild envs ``locals_`` in worker ``w`` (if it dies meanwhile: raises)."""
        reply: RebuildReply = await self._control(self.workers[w], Rebuild, locals_)
        return self.pool.table.note_rebuilt(w, reply)

    async def replace(self, w: int) -> EnvTraits:
        """Kill worker ``w`` (if it still runs) and start a new one for its group."""
        loop = self._watch.attach()
        link = self.workers[w]
        if link.alive:
            link.process.kill()
            self._on_exit(link)
        link = self.workers[w] = self._start(w)
        os.set_blocking(link.reply_fd, False)
        link.ready = loop.create_future()
        self._watch.watch(link)
        traits = self._ready(w, await link.ready)
        layout = self._rows.layout
        if layout is not None:
            attached: AttachReply = await self._control(link, Attach, layout)
            if attached.error is not None:
                raise attached.error
        return traits

    async def aclose(self, errors: Mapping[int, BaseException] | None) -> None:
        """Ask every worker to exit, then terminate or kill stragglers; release everything."""
        loop = self._watch.attach()
        try:
            exits = []
            for link in self.workers:
                if link.alive:
                    link.exited = loop.create_future()
                    exits.append(link.exited)
                    self._post(link, framed(Stop()))
            if exits:
                await asyncio.wait(exits, timeout=links.GRACE)
        finally:
            self._watch.detach()
            self._finalizer()

    def close_now(self) -> None:
        """Without a loop (construction failed): ask workers to close their envs and exit.

        Workers get a grace period to do so; then they are terminated, killed, reaped.
        """
        self._watch.detach()
        for link in self.workers:
            if link.alive:
                local = list(range(len(link.group)))
                self._post(link, framed(Call(-1, local, close_op(len(local)))))
        self._finalizer()

    def _release(self) -> None:
        """Close the shared files and the doorbell (the workers are gone)."""
        self._rows.close()
        self.completions = None
        close_map(self._table_map, self._table_fd)
        self._bell.close()


def _in_order(parts: list[Part], count: int) -> list[int] | None:
    """The envs of ``parts`` in the order of their op.

    ``None``: some of its envs are not sent (lost, or on a blocked worker).
    """
    rows: list[int] = []
    for _, envs, positions in parts:  # (parts in the op's order: as they are)
        if positions[0] != len(rows) or positions[-1] != len(rows) + len(positions) - 1:
            break
        rows += envs
    else:
        return rows if len(rows) == count else None
    rows = [-1] * count
    for _, envs, positions in parts:
        for i, k in zip(envs, positions, strict=True):
            rows[k] = i
    return None if -1 in rows else rows


def _index(envs: Sequence[int]) -> Any:
    """Envs as an index of the table's arrays: a slice for a range."""
    if isinstance(envs, range):
        return slice(envs.start, envs.stop)
    return list(envs)
