"""The backend protocol: what a vector env needs from whatever hosts its envs.

A backend builds the envs from their factories, then runs *ops* (core values
describing one vector call) on some of them: ``launch`` starts an op and returns
at once; ``collect`` waits, through the event loop, until enough envs have
finished and hands over their outcomes (a value or an exception per env).  The
vector env never knows where the envs live, and the backend never knows a rule.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import anyio
from gymnasium import spaces

from aiovec._core.calls import CLOSE
from aiovec._core.latency import LatencyBook
from aiovec._core.ops import CallOp, Op
from aiovec._core.rows import Rows, StepBlock
from aiovec._errors import EnvError, WorkerDiedError
from aiovec.backends import _drive
from aiovec.backends._drive import close_quietly

__all__ = (
    "Backend",
    "EnvTraits",
    "Outcomes",
    "build_envs",
    "check_env",
    "check_rebuilt",
    "check_rebuilt_spaces",
    "make_env",
)

Outcomes = tuple[MutableMapping[int, Any], dict[int, BaseException]]


@dataclass(frozen=True, slots=True)
class EnvTraits:
    """What the vector env needs to know of its envs once they are built."""

    observation_spaces: Sequence[spaces.Space[Any]]
    action_spaces: Sequence[spaces.Space[Any]]
    metadata: dict[str, Any]
    render_mode: str | None

    @classmethod
    def of(cls, envs: Sequence[Any]) -> EnvTraits:
        """Read the traits off built env objects."""
        return cls(
            [env.observation_space for env in envs],
            [env.action_space for env in envs],
            dict(getattr(envs[0], "metadata", None) or {}),
            getattr(envs[0], "render_mode", None),
        )


class Backend(abc.ABC):
    """Hosts envs and runs ops on them; outcomes are collected through the loop.

    Subclasses implement `launch`, `cancel` and `aclose`, and
    report each env's outcome with `_finish` (which wakes a waiting
    `collect`).
    """

    traits: EnvTraits
    OPTIONS: ClassVar[frozenset[str]] = frozenset()
    """The names of the ``backend_options`` the backend takes (passed as ``options=``)."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Subclasses that take no `OPTIONS` leave ``options`` out of their signature."""
        self.num_envs = len(env_fns)
        self.limiter = limiter
        self.latency = LatencyBook(self.num_envs)
        self._started = [0.0] * self.num_envs  # when each env's call in flight began
        self._before = [0.0] * self.num_envs  # what it waited before it started (loop, slot)
        self.lag = [0.0] * self.num_envs
        """Loop time each env's call in flight waited after it started, while other envs ran."""
        self.queued: set[int] = set()  # envs in flight still waiting for a concurrency slot
        self._results: MutableMapping[int, Any] = self._new_results()
        self._errors: dict[int, BaseException] = {}
        self.pending: set[int] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._wanted = 0

    @classmethod
    async def open(
        cls,
        env_fns: Sequence[Callable[[], Any]],
        num_workers: int | None,
        limiter: anyio.CapacityLimiter | None,
        options: Mapping[str, Any] | None,
    ) -> Self:
        """Make the backend on the running loop; the vector env's construction awaits this.

        A backend whose envs live in its workers builds them there (each worker
        awaits `make_env`) and has nothing to await here; one whose envs live on
        this loop overrides this to await their factories.
        """
        if options:
            return cls(env_fns, num_workers, limiter, options=options)
        return cls(env_fns, num_workers, limiter)

    @property
    def envs(self) -> tuple[Any, ...] | None:
        """The env objects, where they live in this process (else ``None``)."""
        return None

    @property
    def lost(self) -> frozenset[int]:
        """Envs that are gone (their worker died) until `rebuild` replaces them."""
        return frozenset()

    async def settle(self, indices: Sequence[int]) -> None:
        """Let envs of ``indices`` held by an abandoned call come back, briefly (if they can).

        Nothing to wait for where a call in flight can be cancelled or dropped.
        """
        return

    @abc.abstractmethod
    def launch(self, indices: Sequence[int], op: Op) -> None:
        """Start ``op`` on the envs ``indices`` (none of which may be in flight)."""

    @abc.abstractmethod
    def cancel(self, indices: Iterable[int] | None = None) -> None:
        """Ask the calls in flight (of ``indices``, or all) to stop; each reports an outcome."""

    @abc.abstractmethod
    async def rebuild(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Replace envs (none in flight) with fresh ones from their factories.

        Each old env is closed first, best effort.  Returns the envs whose
        factory failed (or built an env with other spaces), by index.
        """

    def _check_rebuilt(self, i: int, env: Any) -> None:
        traits = self.traits
        check_rebuilt(i, env, traits.observation_spaces[i], traits.action_spaces[i])

    @abc.abstractmethod
    async def aclose(self) -> dict[int, BaseException]:
        """Close every env and release every resource; returns close errors by env."""

    def close_now(self) -> None:
        """Release everything at once, without a loop (construction failed)."""
        close_quietly(self.envs or ())

    async def _close_envs(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Finish what is in flight, then close the envs ``indices``; errors by env.

        An env whose ``close()`` has not finished within ``_drive.CLOSE_TIMEOUT``
        seconds (the same for every backend) is abandoned and reported with a
        ``TimeoutError``.
        """
        timeout = _drive.CLOSE_TIMEOUT
        await self.drain()
        self.launch(indices, CallOp([CLOSE] * len(indices), "close"))
        _, errors = await self.collect(len(indices), timeout=timeout)
        for i in sorted(self.pending):
            errors[i] = TimeoutError(f"env {i}'s close() did not finish in {timeout} s")
        if self.pending:
            self.cancel()
            self.take()
        return errors

    def _mark_waiting(self, i: int, since: float, start: float | None = None) -> None:
        """Env ``i``'s call, launched at ``since``, waits: it is in flight and timed.

        ``start`` is when the call really started, if later (its turn on the loop
        came after other envs'): the time between is queue wait, not the env's.
        """
        self.pending.add(i)
        if start is None:
            self._started[i] = since
        else:
            self._started[i] = start
            self._before[i] = start - since

    def _queue(self, i: int, waiting: bool) -> None:
        """Env ``i`` waits for a ``max_concurrency`` slot, or no longer (its clock starts now)."""
        if waiting:
            self.queued.add(i)
        else:
            self.queued.discard(i)
            now = time.perf_counter()  # queued time is not the env's: it is queue wait
            self._before[i] += now - self._started[i]
            self._started[i] = now

    def started_at(self, i: int) -> float | None:
        """When env ``i``'s call in flight started (``time.perf_counter``).

        ``None`` while it waits for a ``max_concurrency`` slot: its deadline
        counts from the moment it gets one.
        """
        return None if i in self.queued else self._started[i]

    def _new_results(self) -> MutableMapping[int, Any]:
        """An empty mapping for the results of the next collect."""
        return {}

    def _finish(self, i: int, value: Any, error: BaseException | None) -> None:
        lag = self.lag[i]
        if lag or self._before[i]:  # it waited for the loop or for a slot: queue wait
            self.latency.record(
                i, time.perf_counter() - self._started[i] - lag, self._before[i] + lag
            )
            self.lag[i] = self._before[i] = 0.0
        else:
            self.latency.record(i, time.perf_counter() - self._started[i])
        self.pending.discard(i)
        if error is None:
            self._results[i] = value
        else:
            self._errors[i] = error
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._satisfied():
            waiter.set_result(None)

    def _fail_gone(self, envs: Sequence[int], died: BaseException) -> None:
        """Fail ``envs``, whose worker died before this call, with ``WorkerDiedError``."""
        error = WorkerDiedError(dict.fromkeys(envs, died), "an earlier call")
        for i in envs:
            self._finish(i, None, error)

    def _finish_block(self, block: StepBlock, since: float) -> None:
        """The envs of ``block`` (started at ``since``) finished their step together."""
        self.latency.record_many(block.envs, time.perf_counter() - since)
        pending = self.pending
        if len(block.envs) == len(pending):  # the block's envs are all in flight: all done
            pending.clear()
        else:
            pending.difference_update(block.envs)
        results = self._results
        assert isinstance(results, Rows)
        results.add_block(block)
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._satisfied():
            waiter.set_result(None)

    def _satisfied(self) -> bool:
        return not self.pending or len(self._results) + len(self._errors) >= self._wanted

    def wake(self) -> None:
        """Have the `collect` waiting now return what it has (more envs were launched)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> Outcomes:
        """The outcomes that arrived since the last take or collect, without waiting."""
        outcomes = self._results, self._errors
        self._results, self._errors = self._new_results(), {}
        return outcomes

    async def collect(
        self,
        min_done: int,
        timeout: float | None = None,  # noqa: ASYNC109  (returns what finished by then)
    ) -> Outcomes:
        """Wait until ``min_done`` envs finished (or all in flight, or ``timeout``).

        Args:
            min_done: How many outcomes to wait for.
            timeout: Seconds to wait at most; what finished by then is returned.

        Returns:
            The outcomes that arrived since the last collect: results and
            errors by env index.
        """
        self._start_collect(min_done)
        if not self._satisfied():
            await self._sleep(timeout)
        return self.take()

    def _start_collect(self, min_done: int) -> None:
        """A collect of ``min_done`` outcomes begins (one at a time: see `collect`)."""
        if self._waiter is not None:  # its waiter would be replaced, and never woken
            raise RuntimeError(
                "Backend.collect() called while another collect() waits; one caller collects"
            )
        self._wanted = min_done

    async def _sleep(self, timeout: float | None) -> bool:  # noqa: ASYNC109  (as collect)
        """Sleep until an outcome completes the collect, or ``timeout``; whether it did."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            if timeout is None:
                await waiter
            else:
                await asyncio.wait([waiter], timeout=timeout)
        finally:
            self._waiter = None
        return waiter.done()

    async def settle_cancelled(self) -> None:
        """Let the transport's own work for calls cancelled by `cancel` end (a deadline's).

        Nothing to do where a cancelled call leaves nothing running in this
        process; a transport that receives a call's replies in a task of its own
        (Ray's streamed steps) waits for those tasks here, briefly.
        """
        return

    async def drain(self) -> Outcomes:
        """Cancel whatever is in flight and wait for every outcome."""
        if self.pending:
            self.cancel()
        return await self.collect(self.num_envs)


async def make_env(fn: Callable[[], Any]) -> Any:
    """The factory rule: call ``fn`` on the running loop, and await what it returns if awaitable.

    Every backend that runs async envs builds them through this on the loop
    that will run them, so an env may open a client session (anything that
    needs ``asyncio.get_running_loop()``) in its ``__init__``, and an
    ``async def`` factory may ``await`` its set-up.
    """
    env = fn()
    if inspect.isawaitable(env):
        env = await env
    return env


async def build_envs(env_fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """Build each env in turn (`make_env`); on failure, close what was built and raise.

    A factory that raises (or is cancelled while it waits) fails with
    ``EnvError`` naming it; one that returns no env, with ``TypeError``.  The
    envs built are closed without waiting (`close_quietly`), as after any
    failed construction.
    """
    envs: list[Any] = []
    for i, fn in enumerate(env_fns):
        try:
            env = await make_env(fn)
        except Exception as exc:
            close_quietly(envs)
            raise EnvError({i: exc}, f"env_fns[{i}]()") from exc
        except BaseException:
            close_quietly(envs)
            raise
        try:
            check_env(i, env)
        except TypeError:
            close_quietly([*envs, env])
            raise
        envs.append(env)
    return envs


def check_env(i: int, env: Any) -> None:
    """``env_fns[i]()`` must have returned a single-agent env with the protocol's members."""
    if _multi_agent(env):
        raise TypeError(
            f"env_fns[{i}]() returned a multi-agent env ({type(env).__name__}: "
            "it has possible_agents, or its observation_space is a method, as a PettingZoo "
            "ParallelEnv's): aiovec vectorizes single-agent gymnasium envs. Make it one first: "
            "wrap it in a gymnasium.Env whose spaces are Dict spaces keyed by agent (one "
            "policy acting for all agents) and give aiovec factories of that; or, to share one "
            "policy among the agents, SuperSuit's pettingzoo_env_to_vec_env_v1 makes each agent "
            "an env of a vector env of its own (docs/migrating.md)"
        )
    missing = [
        a for a in ("reset", "step", "observation_space", "action_space") if not hasattr(env, a)
    ]
    if missing:
        raise TypeError(
            f"env_fns[{i}]() must return an env (an aiovec.AsyncEnv or gymnasium.Env), got "
            f"{type(env).__name__}, which lacks {', '.join(missing)}"
        )


def _multi_agent(env: Any) -> bool:
    """Whether ``env`` looks like a PettingZoo env (its spaces are per-agent methods)."""
    if hasattr(env, "possible_agents"):
        return True
    space = getattr(env, "observation_space", None)
    return callable(space) and not isinstance(space, spaces.Space)


def check_rebuilt(
    i: int, env: Any, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> None:
    """A rebuilt env ``i`` must be an env with the same spaces as the others."""
    check_env(i, env)
    check_rebuilt_spaces(
        i, (env.observation_space, env.action_space), (observation_space, action_space)
    )


def check_rebuilt_spaces(
    i: int,
    got: tuple[spaces.Space[Any], spaces.Space[Any]],
    want: tuple[spaces.Space[Any], spaces.Space[Any]],
) -> None:
    """Rebuilt env ``i``'s (observation, action) spaces ``got`` must be the others' ``want``."""
    for kind, space, first in zip(("observation_space", "action_space"), got, want, strict=True):
        if space != first:
            raise ValueError(
                f"the rebuilt env {i} has {kind} {space}, the others (and the env it "
                f"replaces) {first}"
            )
