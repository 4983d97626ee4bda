"""``backend="remote"``: envs that are sessions on an ``aiovec serve`` server.

Theory of operation.  ``aiovec.make("ws://host:port", num_envs)`` builds a
vector env whose factories are `Remote` (the URL and the factory's keyword
arguments); this backend opens them as one *group* of sessions on the server,
over one connection (`aiovec._serve.link.ServerLink`; ``aiovec/_serve/protocol.py``
says what travels).  The vector env applies every rule here as everywhere
(lifecycle, validation, timeouts, restarts); the server runs each env's
``step_flow``, so autoreset costs no extra round trip.

- **One request per call.**  `launch` turns an op into one message (a step's
  actions as one block of bytes) numbered by the group's request id, and every
  message of one loop turn leaves in one frame.  Each env remembers the request
  it waits on (``_waiting``); an answer is delivered only to the envs still
  waiting on it, so a late answer (its envs cancelled at a deadline) is
  dropped and never reaches a later call.
- **Answers as blocks.**  A step's answer holds its envs' rows as raw bytes;
  when it covers every env at once it is handed over as one `StepBlock` of
  views of the frame (no copy, no per-env work), otherwise its rows are copied
  into the backend's own arrays and handed over as a block of those.
  Transitions that do not fit the rows come one by one.
- **A blocking caller waits in ``poll``.**  While the loop is parked (a
  `BlockingVectorEnv` driving its call by hand), a request is written at once
  and `collect` waits on the socket itself (`ServerLink.wait`): a step costs no task
  and no loop iteration.  Anything that needs the loop (a reconnect) is
  waited for through it.
- **Resume and loss** are the link's; once it is lost, every env in flight
  fails with a ``ConnectionError`` saying why, and the envs stay lost (any
  later call fails at once).
- **Construction** connects before the constructor returns: with a blocking
  handshake (a constructor cannot wait on its loop), or through the loop when
  the server runs on that very loop (`aiovec._serve.embed.served_here`), which
  needs ``await AsyncioVectorEnv.create(...)`` (``await server.connect(...)``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import anyio
import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._core import validate
from aiovec._core.layout import StepArrays, StepLayout, copy_rows
from aiovec._core.ops import CallOp, Op, StepOp
from aiovec._core.rows import Rows, StepBlock
from aiovec._log import logger
from aiovec.backends._base import EnvTraits
from aiovec.backends._drive import CLOSE_TIMEOUT
from aiovec.backends._limit import SlottedBackend

try:
    from aiovec._serve import codec
    from aiovec._serve.calls import call_data
    from aiovec._serve.embed import served_here
    from aiovec._serve.link import ServerLink
    from aiovec._serve.protocol import (
        PROTOCOL,
        BusyMsg,
        CallMsg,
        CallReplyMsg,
        CancelMsg,
        CloseMsg,
        FailedMsg,
        GoneMsg,
        HelloMsg,
        Layouts,
        OpenedMsg,
        OpenMsg,
        RebuildMsg,
        StepMsg,
        StepPart,
        WelcomeMsg,
        envs_bytes,
    )
    from aiovec._serve.steps import pack_actions, pack_resets, rows_of
    from aiovec._serve.wsclient import parse_url
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is missing
    if exc.name not in {"msgspec", "aiohttp"}:
        raise
    raise ModuleNotFoundError(
        f'backend="remote" (aiovec.make("ws://...")) needs {exc.name}, which is not installed: '
        'pip install "aiovec[serve]"',
        name=exc.name,
    ) from exc

__all__ = ("Remote", "RemoteBackend")

GROUP = 1
"""The id of the one group of sessions a connection of this backend holds."""

_MODE_NAMES = {mode: mode.value for mode in AutoresetMode}


class Remote:
    """A session on an ``aiovec serve`` server: the factory ``aiovec.make`` gives a ws:// URL.

    Its env lives on the server, built there by the server's factory with
    ``kwargs``; calling it here is a mistake, and says so.
    """

    __slots__ = ("kwargs", "url")

    def __init__(self, url: str, kwargs: Mapping[str, Any] | None = None) -> None:
        parse_url(url)
        self.url = url
        self.kwargs = dict(kwargs or {})
        codec.pack(self.kwargs)  # plain data only: refused here, not on the server

    def __call__(self) -> Any:
        """Refuse: the env is built on the server."""
        raise TypeError(
            f"this env is a session on the aiovec server at {self.url}: only "
            'backend="remote" opens it (aiovec.make(url, num_envs) sets that up)'
        )

    def __repr__(self) -> str:
        return f"Remote({self.url!r}, {self.kwargs!r})"


@dataclass(eq=False, slots=True)
class _Out:
    """A request in flight: its message (sent again after a reconnect) and its envs."""

    message: Any
    since: float
    left: int = 0  # envs still waiting on it
    done: asyncio.Future[Any] | None = None  # open, rebuild and close: their reply


class RemoteBackend(SlottedBackend):
    """Envs as sessions on an aiovec server, over one connection (see the module).

    Options (``backend_options``): ``url`` (else the factories' URL), ``token``,
    ``connect_timeout`` (seconds, default 10), ``deadline`` (seconds a server may
    take to answer a call; ``aiovec.make`` gives it ``step_timeout``).
    """

    OPTIONS: ClassVar[frozenset[str]] = frozenset({"url", "token", "connect_timeout", "deadline"})

    @staticmethod
    def session(url: str, kwargs: Mapping[str, Any]) -> Remote:
        """The factory of a session on the server at ``url`` (its factory gets ``kwargs``)."""
        return Remote(url, kwargs)

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(env_fns, num_workers, limiter)
        options = dict(options or {})
        url, self._kwargs = _sessions(env_fns, options.get("url"))
        token = _optional_str("token", options.get("token"))
        connect_timeout = validate.check_timeout(
            "connect_timeout", options.get("connect_timeout", 10.0)
        )
        self.deadline = validate.check_timeout("deadline", options.get("deadline"))
        self.url = url
        self._link = ServerLink(
            url,
            token,
            connect_timeout or 10.0,
            on_message=self._on_message,
            again=self._again,
            busy=lambda: bool(self._inflight),
            on_lost=self._lose,
        )
        self._rid = 0
        self._waiting = np.zeros(self.num_envs, dtype=np.int64)  # request each env waits on
        self._every = np.arange(self.num_envs, dtype=np.uint32)
        self._every_bytes = envs_bytes(self._every)
        self._inflight: dict[int, _Out] = {}
        self._gone: Exception | None = None  # the sessions are lost, and why
        self._busy: list[int] = []  # requests the server asked to send again

    @classmethod
    async def open(
        cls,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None,
        options: Mapping[str, Any] | None,
    ) -> Self:
        """Connect and open the sessions (see the module: blocking, or through the loop)."""
        backend = cls(env_fns, num_workers, limiter, options)
        try:
            await backend._connect()
        except BaseException:
            backend.close_now()
            raise
        return backend

    # -- opening -----------------------------------------------------------------------

    async def _connect(self) -> None:
        """Connect, shake hands and open the sessions (see the module: how it waits)."""
        link = self._link
        self._rid = 1
        opening = [
            HelloMsg(PROTOCOL),
            OpenMsg(1, GROUP, self.num_envs, [codec.pack(k) for k in self._kwargs]),
        ]
        if served_here(self.url):  # this loop serves it: wait through the loop
            await link.connect()
            opened = await asyncio.wait_for(self._request(opening), link.connect_timeout)
        else:
            link.connect_now()
            answer = self._request(opening)
            link.flush()
            self._open_now(answer)
            opened = answer.result()
        self._opened(opened)

    def _open_now(self, opened: asyncio.Future[Any]) -> None:
        """Wait (blocking) for the server to open the sessions."""
        link = self._link
        until = time.monotonic() + link.connect_timeout
        while not opened.done():
            if time.monotonic() >= until:
                raise TimeoutError(
                    f"the aiovec server at {self.url} did not open the sessions within "
                    f"{link.connect_timeout} s"
                )
            if not link.wait(until):
                raise ConnectionError(f"the aiovec server at {self.url} closed the connection")

    def _opened(self, opened: OpenedMsg) -> None:
        link = self._link
        link.token_of_group = (GROUP, opened.token)
        self.traits = _traits(opened, self.num_envs)
        self._obs_layouts = Layouts(self.traits.observation_spaces[0])
        self._act_layouts = Layouts(self.traits.action_spaces[0])
        layout = StepLayout.of(
            self.traits.observation_spaces[0], self.traits.action_spaces[0], self.num_envs
        )
        self._arrays: StepArrays | None = (
            None if layout is None else layout.arrays(bytearray(layout.nbytes))
        )

    # -- requests out ------------------------------------------------------------------

    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Send ``op`` for ``indices`` as one request (it leaves with this loop turn's frame)."""
        since = time.perf_counter()
        self.pending.update(indices)
        started = self._started
        if type(indices) is range and len(indices) == self.num_envs:
            started[:] = [since] * self.num_envs
        else:
            for i in indices:
                started[i] = since
        if self._gone is not None:
            for i in indices:
                self._finish(i, None, self._lost_error())
            return
        self.launch_op(indices, op, since)

    def send_op(self, indices: Sequence[int], op: Op, since: float) -> None:
        """Send ``op`` for ``indices`` as the next request."""
        self._rid += 1
        rid = self._rid
        try:
            message = self._message(rid, indices, op)
        except (TypeError, ValueError) as exc:
            for i in indices:
                self._finish(i, None, exc)
            return
        whole = type(indices) is range and len(indices) == self.num_envs
        self._waiting[slice(None) if whole else list(indices)] = rid
        self._inflight[rid] = _Out(message, since, len(indices))
        self._link.send(message)

    def _message(self, rid: int, indices: Sequence[int], op: Op) -> StepMsg | CallMsg:
        count = len(indices)
        whole = type(indices) is range and count == self.num_envs
        envs = self._every_bytes if whole else envs_bytes(indices)
        if type(op) is StepOp:
            actions, values = pack_actions(op, count, self._act_layouts)
            resets, autoresets = pack_resets(op)
            return StepMsg(
                rid,
                GROUP,
                envs,
                _MODE_NAMES[op.mode],
                resets,
                autoresets,
                actions,
                values,
                op.stream,
                op.timed,
                self.deadline,
            )
        assert isinstance(op, CallOp)
        return CallMsg(rid, GROUP, envs, op.name, [call_data(c) for c in op.calls], self.deadline)

    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Report the envs in flight (of ``indices``, or all) cancelled; tell the server."""
        out = list(self.pending if indices is None else self.pending.intersection(indices))
        self.forget_queued(out)  # a queued env is not sent now only to be cancelled
        by_request: dict[int, list[int]] = {}
        for i in out:
            rid = int(self._waiting[i])
            self._waiting[i] = 0
            by_request.setdefault(rid, []).append(i)
            self._finish(i, None, asyncio.CancelledError())
        for rid, envs in by_request.items():
            self._settled(rid, len(envs))
            if rid and self._gone is None:
                self._link.send(CancelMsg(GROUP, rid, envs_bytes(sorted(envs))))

    def _settled(self, rid: int, count: int) -> None:
        """``count`` envs no longer wait on request ``rid``: forget it once none does."""
        out = self._inflight.get(rid)
        if out is not None and out.done is None:
            out.left -= count
            if out.left <= 0:
                del self._inflight[rid]

    def _again(self) -> list[Any]:
        """The requests to send again on a new connection (after its resume)."""
        return [out.message for _, out in sorted(self._inflight.items())]

    # -- waiting -----------------------------------------------------------------------

    async def collect(
        self,
        min_done: int,
        timeout: float | None = None,  # noqa: ASYNC109  (returns what finished by then)
    ) -> tuple[Any, dict[int, BaseException]]:
        """As `Backend.collect`; a blocking caller's wait is a ``poll`` of the socket.

        While the loop is parked (`ServerLink.parked`), nothing else can run on it,
        and every outcome comes through the link: waiting on its socket here
        spares the task and the loop iterations a suspension costs.
        """
        if not self._link.parked:
            return await super().collect(min_done, timeout)
        self._start_collect(min_done)
        deadline = None if timeout is None else time.monotonic() + timeout
        link = self._link
        while not self._satisfied():
            if not link.wait(deadline):  # the link needs the loop (a reconnect): wait there
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                return await super().collect(min_done, left)
            if deadline is not None and time.monotonic() >= deadline:
                break
        return self.take()

    # -- answers in --------------------------------------------------------------------

    def _on_message(self, message: Any) -> None:
        kind = type(message)
        if kind is StepPart:
            self._part(message)
        elif kind is CallReplyMsg:
            self._reply(message)
        elif kind is FailedMsg:
            self._failed(message)
        elif kind is BusyMsg:
            self._busy.append(message.rid)
            self._loop_or_now(self._send_busy)
        elif kind is OpenedMsg:
            self._answer_future(message.rid, message)
        elif kind is WelcomeMsg:
            self._welcome(message)
        elif kind is GoneMsg:
            self._link.lose(ConnectionError(message.reason))

    def _part(self, part: StepPart) -> None:
        rid = part.rid
        out = self._inflight.get(rid)
        if out is None:
            return  # a late answer: its envs were cancelled
        rows = rows_of(part, self._obs_layouts)
        if rows is not None:
            n = self.num_envs
            if out.left == n and part.envs == self._every_bytes:  # every env, in order
                arrays = StepArrays(
                    rows.observations,
                    None,
                    rows.rewards,
                    rows.terminations,
                    rows.truncations,
                    rows.terminations,  # (resets: not read from an answer's rows)
                )
                self._waiting[:] = 0
                out.left = 0
                self._finish_block(StepBlock(range(n), arrays, part.infos, part.finals), out.since)
            else:
                self._rows(part, rows, out)
        if part.singles:
            waiting = self._waiting
            for i, value in part.singles.items():
                if 0 <= i < self.num_envs and waiting[i] == rid:
                    waiting[i] = 0
                    out.left -= 1
                    self._finish(i, tuple(value), None)
        if part.errors:
            self._deliver_errors(rid, out, part.errors)
        if part.done:
            self._ended(rid, out)

    def _rows(self, part: StepPart, rows: Any, out: _Out) -> None:
        """Copy the wanted rows of a part into the backend's arrays; deliver them as a block."""
        wanted = self._waiting[rows.envs] == part.rid
        if not wanted.any():
            return
        arrays = self._arrays
        assert arrays is not None
        positions = np.flatnonzero(wanted)
        envs: list[int] = rows.envs[positions].tolist()
        copy_rows(arrays.observations, rows.observations, envs, positions.tolist())
        arrays.rewards[envs] = rows.rewards[positions]
        arrays.terminations[envs] = rows.terminations[positions]
        arrays.truncations[envs] = rows.truncations[positions]
        self._waiting[envs] = 0
        out.left -= len(envs)
        keep = set(envs)
        infos = {i: v for i, v in part.infos.items() if i in keep}
        finals = {i: v for i, v in part.finals.items() if i in keep}
        self._finish_block(StepBlock(envs, arrays, infos, finals), out.since)

    def _deliver_errors(self, rid: int, out: _Out, errors: dict[int, Any]) -> None:
        waiting = self._waiting
        for i, error in errors.items():
            if 0 <= i < self.num_envs and waiting[i] == rid:
                waiting[i] = 0
                out.left -= 1
                self._finish(i, None, codec.data_to_error(error))

    def _new_results(self) -> Rows:
        return Rows()

    def _reply(self, reply: CallReplyMsg) -> None:
        if self._answer_future(reply.rid, reply):
            return
        rid = reply.rid
        out = self._inflight.get(rid)
        if out is None:
            return  # a late answer: its envs were cancelled
        waiting = self._waiting
        for i, value in reply.values.items():
            if 0 <= i < self.num_envs and waiting[i] == rid:
                waiting[i] = 0
                out.left -= 1
                self._finish(i, value, None)
        self._deliver_errors(rid, out, reply.errors)
        self._ended(rid, out)

    def _failed(self, failed: FailedMsg) -> None:
        error = codec.data_to_error(failed.error)
        out = self._inflight.get(failed.rid)
        if out is None:
            if failed.rid == 0:
                self._link.lose(ConnectionError(f"the aiovec server refused a frame: {error}"))
            return
        if out.done is not None:
            del self._inflight[failed.rid]
            if not out.done.done():
                out.done.set_exception(error)
            return
        for i in np.flatnonzero(self._waiting == failed.rid).tolist():
            self._waiting[i] = 0
            self._finish(i, None, error)
        self._inflight.pop(failed.rid, None)

    def _answer_future(self, rid: int, answer: Any) -> bool:
        """Settle the future of request ``rid`` (open, rebuild, close), if it has one."""
        out = self._inflight.get(rid)
        if out is None or out.done is None:
            return False
        del self._inflight[rid]
        if not out.done.done():
            out.done.set_result(answer)
        return True

    def _ended(self, rid: int, out: _Out) -> None:
        """Request ``rid`` is answered in full: any env it left out fails."""
        del self._inflight[rid]
        if out.left <= 0:
            return
        for i in np.flatnonzero(self._waiting == rid).tolist():
            self._waiting[i] = 0
            self._finish(
                i, None, RuntimeError(f"the server's answer to request {rid} left env {i} out")
            )

    def _send_busy(self) -> None:
        """Send again the requests the server was too busy to take (now it answered)."""
        busy, self._busy = self._busy, []
        for rid in sorted(busy):
            out = self._inflight.get(rid)
            if out is not None:
                self._link.send(out.message)

    def _loop_or_now(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once this frame is handled (through the loop, or now if it is parked)."""
        if self._link.parked:
            fn()
        else:
            asyncio.get_running_loop().call_soon(fn)

    def _welcome(self, welcome: WelcomeMsg) -> None:
        reason = welcome.resumed.get(GROUP)
        if reason:
            self._link.lose(
                ConnectionError(f"could not resume the sessions on {self.url}: {reason}")
            )
        elif self._link.token_of_group is not None:
            logger.warning("aiovec: resumed the sessions on %s", self.url)
        else:  # the first: the server's heartbeat and resume window
            self._link.heartbeat = welcome.heartbeat
            self._link.resume_window = welcome.resume_window

    # -- losing the sessions -----------------------------------------------------------

    def drop_connection(self) -> None:
        """Cut the connection now, as a network fault would (for tests and fault runs)."""
        self._link.drop("cut by drop_connection()")

    @property
    def reconnects(self) -> int:
        """How many times the connection was made again (and the sessions resumed)."""
        return self._link.reconnects

    def _lose(self, error: Exception) -> None:
        """The sessions are gone (the link says why): fail every env in flight; later calls too."""
        self._gone = error
        logger.warning("aiovec: %s", error)
        for out in list(self._inflight.values()):
            if out.done is not None and not out.done.done():
                out.done.set_exception(self._lost_error())
        self._inflight.clear()
        for i in sorted(self.pending):
            self._waiting[i] = 0
            self._finish(i, None, self._lost_error())

    def _lost_error(self) -> Exception:
        gone = self._gone
        assert gone is not None
        error = ConnectionError(str(gone))
        error.__cause__ = gone.__cause__
        return error

    @property
    def lost(self) -> frozenset[int]:
        """Every env, once the sessions are gone (see `_lose`)."""
        return frozenset(range(self.num_envs)) if self._gone is not None else frozenset()

    # -- open, rebuild and close -------------------------------------------------------

    def _request(self, messages: Any) -> asyncio.Future[Any]:
        """Send a request answered as a whole (open, rebuild, close); the future of its answer."""
        listed = messages if isinstance(messages, list) else [messages]
        done = asyncio.get_running_loop().create_future()
        self._inflight[self._rid] = _Out(listed[-1], time.perf_counter(), done=done)
        for message in listed:
            self._link.send(message)
        return done

    async def _answer(self, done: asyncio.Future[Any], timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """The answer ``done`` will hold (``TimeoutError`` after ``timeout``)."""
        if timeout is not None:
            await asyncio.wait([done], timeout=timeout)  # (a blocking caller drives this by hand)
            if not done.done():
                raise TimeoutError(f"no answer within {timeout} s")
        return await done

    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Have the server close and rebuild the sessions ``indices``."""
        if self._gone is not None:
            return dict.fromkeys(indices, self._lost_error())
        self._rid += 1
        try:
            reply = await self._answer(
                self._request(RebuildMsg(self._rid, GROUP, envs_bytes(indices)))
            )
        except ConnectionError as exc:
            return dict.fromkeys(indices, exc)
        return {int(i): codec.data_to_error(e) for i, e in reply.errors.items()}

    async def aclose(self) -> dict[int, BaseException]:
        """Close the sessions on the server, then the connection (once the server ended it)."""
        errors: dict[int, BaseException] = {}
        try:
            await self.drain()
            if self._gone is None:
                self._rid += 1
                try:
                    reply = await self._answer(
                        self._request(CloseMsg(self._rid, GROUP)), CLOSE_TIMEOUT
                    )
                    errors = {int(i): codec.data_to_error(e) for i, e in reply.errors.items()}
                except (TimeoutError, ConnectionError) as exc:
                    logger.warning("aiovec: closing the sessions on %s failed: %r", self.url, exc)
            await self._link.goodbye()
        finally:
            self.close_now()
        return errors

    def close_now(self) -> None:
        """Drop the connection and every timer, without a loop (construction failed)."""
        self._link.close()


def _sessions(fns: Sequence[Callable[[], Any]], url: object) -> tuple[str, list[dict[str, Any]]]:
    """The URL the factories name and each one's keyword arguments."""
    bad = [k for k, fn in enumerate(fns) if not isinstance(fn, Remote)]
    if bad:
        raise TypeError(
            f'backend="remote": env_fns[{bad[0]}] is {validate.describe(fns[bad[0]])}, not a '
            'session on a server; build the vector env with aiovec.make("ws://HOST:PORT", '
            "num_envs) (the server builds the envs)"
        )
    remotes: list[Remote] = list(fns)  # type: ignore[arg-type]
    urls = {url} if url is not None else {fn.url for fn in remotes}
    if len(urls) != 1:
        raise ValueError(
            f"backend='remote': every session must be on one server, got {sorted(map(str, urls))}"
        )
    return str(urls.pop()), [fn.kwargs for fn in remotes]


def _optional_str(name: str, value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"{name} must be a str or None, got {validate.describe(value)}")


def _traits(opened: OpenedMsg, num_envs: int) -> EnvTraits:
    obs = codec.data_to_space(opened.observation_space)
    act = codec.data_to_space(opened.action_space)
    observation_spaces = [obs] * num_envs
    action_spaces = [act] * num_envs
    for k, data in opened.observation_spaces.items():
        observation_spaces[int(k)] = codec.data_to_space(data)
    for k, data in opened.action_spaces.items():
        action_spaces[int(k)] = codec.data_to_space(data)
    metadata = dict(opened.metadata) if isinstance(opened.metadata, dict) else {}
    return EnvTraits(observation_spaces, action_spaces, metadata, opened.render_mode)
