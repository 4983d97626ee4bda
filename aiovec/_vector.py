"""``AsyncioVectorEnv``: the one implementation of a vector env's calls.

Theory of operation.  Each public call does the same four things: check the
lifecycle table (``_core/lifecycle.py``), validate its arguments (nothing is
touched yet), hand the backend an op (``_core/ops.py``) and batch what comes
back (``_core/batching.py``).  ``BlockingVectorEnv`` forwards here; no rule is
written anywhere else.

- ``_run`` is the path of every full-batch call: ``_gather`` launches the op and
  collects every env's outcome, turning envs still running at the deadline
  (``step_timeout``/``reset_timeout``) into ``TimeoutError``s after cancelling
  them; ``_restart`` replaces the failed envs of a step when a restart policy is
  set; ``_raise_for`` turns the remaining failures into ``EnvError`` (or
  ``EnvTimeoutError``) and says which state the vector env is left in.
- ``send``/``recv`` are partial stepping: ``send`` launches a step for some envs
  and returns; ``recv`` collects (``_receive``, ``_collect_sent``) until
  ``min_envs`` are in, cancelling envs past their own deadline, and batches that
  subset.  gymnasium's ``AsyncVectorEnv`` spellings, which only
  ``BlockingVectorEnv`` offers, are the same path: ``_step_async`` is a ``send``
  of every env, ``_step_wait`` a ``_receive`` of every env batched as ``step``
  batches; ``_reset_async`` launches a reset the same way (``RESET_SENT``) and
  ``_reset_wait`` receives it.  A wait's own ``timeout`` fails the envs still
  out with ``TimeoutError``: they are cancelled, nothing of them can come later.
- ``_unwound`` is set while a call waits on envs, so that ``close()`` can cancel
  the envs and wait for that call to unwind before closing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import warnings
from collections.abc import Callable, Coroutine, Mapping, MutableMapping, Sequence
from types import TracebackType
from typing import Any, Generic, NoReturn, Self, TypeVar

import anyio
import numpy as np
from gymnasium import spaces
from gymnasium.core import RenderFrame
from gymnasium.vector import AutoresetMode

from aiovec._core import validate
from aiovec._core.autoreset import AutoresetState, ResetHook
from aiovec._core.batching import Batcher, StepBatch
from aiovec._core.calls import RENDER, CallMethod, EnvCall, GetAttr, IsWrapped, Reset, SetAttr
from aiovec._core.deadlines import overdue
from aiovec._core.latency import LatencyStats
from aiovec._core.lifecycle import PENDING, Lifecycle, State, VectorCall
from aiovec._core.ops import CallOp, Op, StepOp
from aiovec._core.restart import RestartBook, RestartPolicy, describe_failure, restarted_row
from aiovec._core.rows import Rows
from aiovec._errors import (
    ClosedError,
    EnvError,
    EnvTimeoutError,
    StateError,
    WorkerDiedError,
    describe_error,
)
from aiovec._log import logger
from aiovec.backends import Backend, load_backend
from aiovec.backends._base import Outcomes

__all__ = ("AsyncioVectorEnv", "RecvBatch")

EnvIds = Sequence[int] | np.ndarray
"""Env indices a call names (``send``'s ``env_ids``, ``call``'s, ...)."""

RecvBatch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]
"""``(observations, rewards, terminations, truncations, infos, env_ids)``."""

_DEFERRED: contextvars.ContextVar[list[Coroutine[Any, Any, None]] | None] = contextvars.ContextVar(
    "aiovec_deferred_build", default=None
)
"""Set by `AsyncioVectorEnv.create` around the constructor, which leaves it its build to await."""


def _build_now(build: Coroutine[Any, Any, None]) -> None:
    """Run the constructor's ``build`` to its end at once; refuse a factory that waits.

    The constructor holds the loop, so it cannot wait on it.  The refusal is
    raised inside the factory, at its ``await``, so that it fails as a factory
    that raises does: an `aiovec.EnvError` naming it, the envs built closed.
    """
    try:
        build.send(None)
        build.throw(
            RuntimeError(
                "the factory waited (an `await` that suspends) while AsyncioVectorEnv(...) built "
                "the envs; the constructor cannot wait on the loop it runs on: build it with "
                "`await AsyncioVectorEnv.create(env_fns, ...)`, or use BlockingVectorEnv, "
                "which awaits factories"
            )
        )
    except StopIteration:
        return
    build.close()  # it caught the refusal and waited again
    raise RuntimeError("an env factory waited while AsyncioVectorEnv(...) built the envs")


ObsType = TypeVar("ObsType")
ActType = TypeVar("ActType")


class AsyncioVectorEnv(Generic[ObsType, ActType]):
    """Step many envs together on one event loop.

    Args:
        env_fns: Non-empty sequence of zero-argument callables, each returning
            an env: an `aiovec.AsyncEnv` (or any object with coroutine
            ``reset``/``step`` and the two spaces) or a ``gymnasium.Env``.
            Each is called on the loop that will run its env; an ``async def``
            factory is awaited there.  On the inline backend this constructor
            cannot wait for one that suspends (``await env.connect()``): build
            with ``await AsyncioVectorEnv.create(env_fns, ...)`` instead.
        backend: Where envs live: ``"inline"`` (this event loop; sync envs are
            called directly, async ones awaited together), ``"thread"``
            (sync envs whose calls block, each on a thread of its own),
            ``"process"`` (worker processes, several envs each) or ``"ray"``
            (Ray actors, several envs each, anywhere on a Ray cluster; needs
            ``pip install "aiovec[ray]"``).
        num_workers: How many workers host the envs (``"thread"``: threads,
            by default one per env; ``"process"``: processes, by default one
            per CPU this process may use; ``"ray"``: actors, by default one per
            CPU of the cluster).
        autoreset_mode: gymnasium's ``AutoresetMode`` (or its string value).
        step_timeout: Seconds an env may take to answer a step (and render,
            call, ...); ``None`` waits forever.  Each env's time counts from
            its own start: under ``max_concurrency``, waiting for a slot does
            not count.  A late env fails with `aiovec.EnvTimeoutError`; its
            call is cancelled (inline) or abandoned (thread) and can never
            deliver stale data.
        on_error: ``"raise"``: a failing env raises `aiovec.EnvError`.
            ``"restart"`` (or a `aiovec.RestartPolicy`): a failed env is
            closed, rebuilt from its factory and reset; its row is the reset
            observation with ``truncated=True``, reward 0 and
            ``infos["error"]``, and every other env's transition is kept.
        copy: ``False`` lets returned observation arrays be a buffer that the
            next call overwrites (saves a copy per call).
        reset_timeout: Seconds an env may take to reset (connecting often
            takes longer than a step), from its own start as for
            ``step_timeout``; ``None`` means ``step_timeout``.
        max_concurrency: At most this many env calls in flight at once, on
            every backend (``None``: no limit), so many envs do not flood one
            server.  On the inline and thread backends an
            ``anyio.CapacityLimiter`` may be passed instead of an int and shared
            by several vector envs that talk to the same server (docs/network.md).
        backend_options: Options of the backend.  ``"process"`` takes
            ``cpus``: CPU ids to pin the workers to, worker ``k`` on
            ``cpus[k % len(cpus)]`` (Linux); ``None`` never pins; ``"auto"``
            (the default) pins one worker per usable CPU when there are as
            many workers as usable CPUs (``docs/process.md``).  ``"ray"``
            takes the Ray actor options of every actor (``num_cpus``, ``num_gpus``,
            ``memory``, ``resources``, ``scheduling_strategy`` (default
            ``"SPREAD"``), ``runtime_env``, ...), and ``placement_timeout`` and
            ``actor_pool`` (``docs/ray.md``).
        reset_options: ``reset_options(env_id, episode) -> dict | None``,
            the options of every reset of every env, autoresets included
            (curricula, per-episode tasks).  ``episode`` counts each env's
            resets from 0; each episode's answer is asked for once, on the
            loop, before the call that may reset the env is sent.  Options
            given to `reset` override the hook's key by key.  Also settable
            later as the ``reset_options`` attribute.

    Raises:
        TypeError: An argument has the wrong type (the message names it).
        ValueError: An argument has a wrong value, the envs' spaces differ, or
            two factories returned the same env object (both are named).
        aiovec.EnvError: An env factory raised (or, in this constructor,
            waited on the inline backend); the envs built are closed.

    Example:
        >>> async with AsyncioVectorEnv([make_env] * 8) as venv:  # doctest: +SKIP
        ...     obs, infos = await venv.reset(seed=42)
        ...     obs, rewards, terminations, truncations, infos = await venv.step(actions)
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        *,
        backend: str = "inline",
        num_workers: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        step_timeout: float | None = None,
        on_error: str | RestartPolicy = "raise",
        copy: bool = True,
        reset_timeout: float | None = None,
        max_concurrency: int | anyio.CapacityLimiter | None = None,
        backend_options: Mapping[str, Any] | None = None,
        reset_options: ResetHook | None = None,
    ) -> None:
        self._life = Lifecycle()
        self._backend: Backend | None = None
        self._unwound: asyncio.Future[None] | None = None  # set while a call waits on envs
        fns = validate.check_env_fns(env_fns)
        mode = validate.check_autoreset_mode(autoreset_mode)
        backend_name = validate.check_choice("backend", backend, validate.BACKENDS)
        workers = validate.check_num_workers(num_workers, len(fns))
        self.step_timeout = validate.check_timeout("step_timeout", step_timeout)
        self.reset_timeout = validate.check_timeout("reset_timeout", reset_timeout)
        if self.reset_timeout is None:
            self.reset_timeout = self.step_timeout
        self.restart_policy: RestartPolicy | None = None
        if isinstance(on_error, RestartPolicy):
            self.on_error, self.restart_policy = "restart", on_error
        else:
            self.on_error = validate.check_choice("on_error", on_error, validate.ON_ERROR)
            if self.on_error == "restart":
                self.restart_policy = RestartPolicy()
        if not isinstance(copy, bool):
            raise TypeError(f"copy must be a bool, got {validate.describe(copy)}")
        limiter = validate.check_max_concurrency(max_concurrency, backend_name)
        self._hook = _check_hook(reset_options)
        if isinstance(limiter, int):
            limiter = anyio.CapacityLimiter(limiter)
        backend_cls = load_backend(backend_name)
        options = validate.check_backend_options(backend_options, backend_name, backend_cls.OPTIONS)
        self.num_envs = len(fns)
        self.backend = backend_name
        self.copy = copy
        self.autoreset_mode = mode
        build = self._build(backend_cls.open(fns, workers, limiter, options))
        deferred = _DEFERRED.get()
        if deferred is not None:
            deferred.append(build)  # `create` awaits it
        else:
            _build_now(build)

    @classmethod
    async def create(cls, env_fns: Sequence[Callable[[], Any]], **options: Any) -> Self:
        """Build a vector env, awaiting factories that wait (``await env.connect()``).

        Takes the arguments of the constructor, checked the same way before any
        factory is called.  Only the ``inline`` backend builds envs on this
        loop; the others build them in their workers, which await factories
        under the constructor too.

        Example:
            >>> venv = await AsyncioVectorEnv.create([make_env] * 8)  # doctest: +SKIP
        """
        builds: list[Coroutine[Any, Any, None]] = []
        token = _DEFERRED.set(builds)
        try:
            venv = cls(env_fns, **options)
        finally:
            _DEFERRED.reset(token)
        await builds[0]
        return venv

    async def _build(self, opening: Coroutine[Any, Any, Backend]) -> None:
        """The end of construction: await the backend (its envs built), read their traits."""
        self._backend = await opening
        traits = self._backend.traits
        try:
            validate.check_spaces(traits.observation_spaces, traits.action_spaces)
            envs = self._backend.envs  # built in this process (workers check their own)
            if envs is not None:
                validate.check_distinct_envs(envs)
        except (TypeError, ValueError):
            self._close_now()
            raise
        mode = self.autoreset_mode
        self.metadata: dict[str, Any] = {**traits.metadata, "autoreset_mode": mode}
        self.render_mode: str | None = traits.render_mode
        self._batcher = Batcher(
            traits.observation_spaces[0], traits.action_spaces[0], self.num_envs, self.copy
        )
        self._check_results = validate.step_result_checker(traits.observation_spaces[0])
        self._autoreset = AutoresetState(mode, self.num_envs, self._hook)
        self._in_flight: set[int] = set()  # envs started by send(), not yet recv()ed
        self._sent_reset: tuple[np.ndarray | None, dict[int, BaseException]] = (None, {})
        """The mask of the reset in flight (RESET_SENT) and the lost envs it could not rebuild."""
        self._sent_at = [0.0] * self.num_envs  # when send() launched each env (perf_counter)
        self._held: Outcomes = ({}, {})
        """Outcomes of sent envs that came while a restart waited for its own envs."""
        self._restarts = RestartBook(self.restart_policy or RestartPolicy(), self.num_envs)
        self._all = range(self.num_envs)

    # -- properties --------------------------------------------------------------

    @property
    def single_observation_space(self) -> spaces.Space[ObsType]:
        """The observation space of one env."""
        return self._batcher.single_observation_space

    @property
    def single_action_space(self) -> spaces.Space[ActType]:
        """The action space of one env."""
        return self._batcher.single_action_space

    @property
    def observation_space(self) -> spaces.Space[Any]:
        """The batched observation space (``num_envs`` along the first axis)."""
        return self._batcher.observation_space

    @property
    def action_space(self) -> spaces.Space[Any]:
        """The batched action space."""
        return self._batcher.action_space

    @property
    def reset_options(self) -> ResetHook | None:
        """The reset-options hook (see the constructor), or ``None``; settable."""
        return self._hook

    @reset_options.setter
    def reset_options(self, hook: ResetHook | None) -> None:
        self._hook = self._autoreset.hook = _check_hook(hook)

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._life.state is State.CLOSED

    @property
    def state(self) -> State:
        """The lifecycle state, an `aiovec.State` (``READY``, ``BUSY``, ``BROKEN``, ...)."""
        return self._life.state

    @property
    def envs(self) -> tuple[Any, ...]:
        """The env objects (inline and thread backends only)."""
        envs = self._backend.envs if self._backend is not None else None
        if envs is None:
            raise AttributeError(f"envs is not available with backend={self.backend!r}")
        return envs

    @property
    def unwrapped(self) -> AsyncioVectorEnv[ObsType, ActType]:
        """The vector env itself."""
        return self

    # -- calls ---------------------------------------------------------------------

    async def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[ObsType, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``).

        Args:
            seed: ``None`` leaves generators alone; an int seeds env i with
                ``seed + i``; a list gives each env its own seed.
            options: Passed to every env's reset; ``"reset_mask"`` (a bool
                array of shape ``(num_envs,)``) resets only the masked envs.

        Returns:
            Batched observations and infos.
        """
        indices, op, mask = self._reset_call(VectorCall.RESET, seed, options)
        await self._clear_break()
        results = await self._run(indices, op, breaks=True)
        return self._reset_done(indices, results, mask)

    async def _clear_break(self) -> None:
        """Before a reset of a broken vector env: drop what the call that broke it left.

        A call abandoned where it could not wait (``send()`` interrupted as it
        started its envs, ``recv()`` closed unfinished) leaves its envs' outcomes
        behind; they are not the reset's.
        """
        if self._life.state is State.BROKEN:
            backend = self._backend
            assert backend is not None
            await backend.drain()

    def _reset_call(
        self, call: VectorCall, seed: object, options: object
    ) -> tuple[Sequence[int], CallOp, np.ndarray | None]:
        """Check a reset (``call`` is allowed now, valid arguments); its envs, op and mask."""
        self._life.check(call)
        seeds = validate.check_seeds(seed, self.num_envs)
        env_options, mask = validate.check_options(options, self.num_envs)
        if mask is None:
            indices: Sequence[int] = self._all
        else:
            self._life.check(VectorCall.RESET_MASK)
            indices = np.flatnonzero(mask).tolist()
        resets = [Reset(seeds[i], self._autoreset.reset_options(i, env_options)) for i in indices]
        return indices, CallOp(resets, "reset"), mask

    def _reset_done(
        self, indices: Sequence[int], results: MutableMapping[int, Any], mask: np.ndarray | None
    ) -> tuple[ObsType, dict[str, Any]]:
        """The batch of a reset whose every env answered; the vector env is ready."""
        self._autoreset.was_reset(mask)
        observations, infos = self._batcher.reset_batch(indices, results)
        self._life.state = State.READY
        return observations, infos

    async def step(self, actions: Any) -> StepBatch:
        """Step every env with its action, under the autoreset mode's rules.

        Args:
            actions: A batch of actions from ``action_space``.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``,
            ordered by env index.
        """
        self._life.check(VectorCall.STEP)
        per_env = self._batcher.split_actions(actions)
        reset_first = self._autoreset.plan()
        op = StepOp(
            self.autoreset_mode,
            per_env,
            reset_first,
            batch=self._batch_of(actions, reset_first),
            timed=self.step_timeout is not None,
        )
        return self._stepped(await self._run(self._all, op, breaks=True))

    def _stepped(self, results: MutableMapping[int, Any]) -> StepBatch:
        """The batch of a step whose every env answered; the vector env is ready."""
        batch = self._batcher.step_batch(self._all, results)
        self._autoreset.stepped(None, batch[2], batch[3])
        self._life.state = State.READY
        return batch

    def send(self, actions: Any, env_ids: EnvIds | None = None) -> None:
        """Start steps for some envs and return at once (EnvPool's asynchronous mode).

        Call it from code running in the event loop; collect the results with
        `recv`.  Each env follows the same autoreset and info rules as
        with `step`.  Envs still in flight cannot be sent again.

        Args:
            actions: One action per env in ``env_ids``, batched.
            env_ids: The envs to step (``None``: every env).
        """
        self._life.check(VectorCall.SEND)
        ids = validate.check_env_ids(env_ids, self.num_envs)
        busy = sorted(self._in_flight.intersection(ids))
        if busy:
            raise StateError(f"env(s) {busy} are still in flight from send(); recv() them first")
        per_env = self._batcher.split_actions(actions, len(ids))
        reset_first = self._autoreset.plan(ids)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "send() starts envs on the running event loop: call it from async code "
                "(BlockingVectorEnv.send works from anywhere)"
            ) from None
        batch = self._batch_of(actions, reset_first)
        op = StepOp(self.autoreset_mode, per_env, reset_first, batch=batch, stream=True)
        self._launch_sent(ids, op, "send()")

    def _batch_of(self, actions: Any, reset_first: list[Any]) -> Any:
        """A step op's ``batch``: none where an autoreset has options (they go env by env)."""
        if self._hook is None or all(type(f) is bool for f in reset_first):
            return actions
        return None

    def _launch_sent(self, ids: Sequence[int], op: Op, call: str) -> None:
        """Start ``op`` on ``ids`` and return: they are in flight until received."""
        backend = self._backend
        assert backend is not None
        self._in_flight.update(ids)
        self._life.state = State.RESET_SENT if op.name == "reset" else State.SENT
        now = time.perf_counter()
        for i in ids:
            self._sent_at[i] = now
        try:
            backend.launch(ids, op)
        except BaseException as exc:  # Ctrl-C raised by a sync env: stop everything
            backend.cancel()
            self._in_flight.clear()
            self._life.break_(f"{call} was interrupted ({type(exc).__name__})")
            raise

    async def recv(
        self,
        min_envs: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109  (the contract's; returns what is ready)
    ) -> RecvBatch:
        """Results of envs started by `send`, as soon as ``min_envs`` have finished.

        Every env that has finished by then is included (possibly more than
        ``min_envs``); rows are ordered by env index and ``env_ids`` says which
        env each row is.  A slow env never holds the others back.

        Args:
            min_envs: How many finished envs to wait for (default: all in flight).
            timeout: Seconds to wait at most; whatever finished by then is
                returned (maybe nothing).  Per-env ``step_timeout`` still applies.

        Returns:
            ``(observations, rewards, terminations, truncations, infos, env_ids)``.
        """
        self._life.check(VectorCall.RECV)
        wanted = validate.check_min_envs(min_envs, len(self._in_flight))
        wait = validate.check_timeout("timeout", timeout)
        results = await self._receive("recv()", wanted, wait, strict=False)
        ids = sorted(results)
        batch = self._batcher.subset_batch(ids, results)
        self._autoreset.stepped(ids, batch[2], batch[3])
        self._life.state = State.SENT if self._in_flight else State.READY
        return (*batch, np.array(ids, dtype=np.int64))

    async def _receive(
        self, call: str, wanted: int, wait: float | None, *, strict: bool
    ) -> MutableMapping[int, Any]:
        """Results of sent envs once ``wanted`` are in (or ``wait`` s passed), or raise.

        ``strict``: ``wanted`` envs or an error; those still out after ``wait``
        seconds fail with ``TimeoutError`` (and are cancelled, like any failed
        call's siblings), so the call raises `aiovec.EnvTimeoutError`.
        """
        name = PENDING[self._life.state]  # what is in flight: "step" or "reset"
        self._life.state = State.BUSY
        refusal = ""
        try:
            results, errors = await self._collect_sent(wanted, wait, name)
            late: set[int] = set()
            if strict and len(results) + len(errors) < wanted:  # the caller's timeout
                late = self._in_flight.difference(results, errors)
                errors.update(
                    (i, TimeoutError(f"env {i} did not answer {call} within {wait} s"))
                    for i in late
                )
            if name == "step":
                self._check_steps(results, errors)
            while errors and not late and self._restartable(errors, step=name == "step"):
                refusal = self._charge_restarts(errors)
                if refusal:
                    break
                results.update(await self._restart(errors, "step"))
                # what other sent envs delivered while the restart waited for its own
                more, errors = self._take_held(({}, {}))
                self._check_steps(more, errors)
                results.update(more)
        except GeneratorExit:
            self._abandon_sent(f"{call} was abandoned unfinished")
            raise
        except BaseException as exc:
            if self._life.state is not State.CLOSED:
                await self._drain_sent()
                self._life.break_(f"{call} was interrupted ({type(exc).__name__})")
            raise
        finally:
            if self._unwound is not None:
                self._unwound.set_result(None)
                self._unwound = None
        if name == "reset":
            errors.update(self._sent_reset[1])  # why they are still lost
        self._in_flight.difference_update(results)
        self._in_flight.difference_update(errors)
        if self._life.state is State.CLOSED:
            raise ClosedError(f"the vector env was closed while {call} was waiting")
        if errors:
            await self._drain_sent()
            self._raise_for(errors, name, State.READY, breaks=True, note=refusal)
        return results

    async def _collect_sent(self, wanted: int, wait_s: float | None, name: str) -> Outcomes:
        """Outcomes of sent envs until ``wanted`` arrived, ``wait_s`` passed or all are in.

        ``name`` is the call in flight (``"step"``, ``"reset"``): its timeout applies.
        """
        backend = self._backend
        assert backend is not None
        if self._unwound is None:
            self._unwound = asyncio.get_running_loop().create_future()
        until = None if wait_s is None else time.perf_counter() + wait_s
        launched = self._sent_at.__getitem__
        return await self._collect(wanted, self._timeout_of(name), name, launched, until)

    async def _collect(
        self,
        wanted: int,
        timeout: float | None,  # noqa: ASYNC109  (each env's own deadline, not this call's)
        name: str,
        launched: Callable[[int], float],
        until: float | None = None,
        *,
        own: set[int] | None = None,
    ) -> Outcomes:
        """Collect until ``wanted`` envs are in, none is in flight, or ``until`` passed.

        An env still running ``timeout`` seconds after its own start (see
        `_core.deadlines`) is cancelled and fails with ``TimeoutError``; its
        start is never before ``launched(i)``, when its call was launched.
        Times are on the ``time.perf_counter`` clock.  With ``own``, only those
        envs are collected (and timed): the outcomes of the others are held
        for the `recv` in progress (`_keep`).
        """
        backend = self._backend
        assert backend is not None
        if own is None:
            results, errors = self._take_held(backend.take())
        else:
            results, errors = self._keep(backend.take(), own)
        expired: set[int] = set()
        while len(results) + len(errors) < wanted and self._out(own):
            now = time.perf_counter()
            wait: float | None = None
            if timeout is not None:
                out = backend.pending if own is None else backend.pending & own
                starts = (
                    (i, _not_before(backend.started_at(i), launched(i))) for i in out - expired
                )
                late, wait = overdue(starts, timeout, now)
                if late:
                    expired.update(late)
                    backend.cancel(late)
                    continue  # collect what the cancellation delivered at once
            if until is not None:
                if until <= now:
                    break  # the caller's timeout
                wait = until - now if wait is None else min(wait, until - now)
            more_results, more_errors = self._keep(
                await backend.collect(wanted - len(results) - len(errors), wait), own
            )
            if not results and not errors:
                results, errors = more_results, more_errors  # keep the backend's own mapping
            else:
                results.update(more_results)
                errors.update(more_errors)
        if expired:  # the outcomes their cancellation delivered
            more_results, more_errors = self._keep(backend.take(), own)
            results.update(more_results)
            errors.update(more_errors)
        timed_out = sorted(i for i in expired.intersection(errors) if _cancelled(errors[i]))
        for i in timed_out:
            errors[i] = TimeoutError(f"env {i} did not answer {name}() within {timeout} s")
        if timed_out:
            logger.warning(
                "%s did not answer %s() within %s s; cancelled", _envs(timed_out), name, timeout
            )
        return results, errors

    def _out(self, own: set[int] | None) -> bool:
        """Whether some env is still in flight (of ``own``, when given)."""
        pending = self._backend.pending  # type: ignore[union-attr]
        return bool(pending) if own is None else not own.isdisjoint(pending)

    def _keep(self, outcomes: Outcomes, own: set[int] | None) -> Outcomes:
        """``outcomes`` of the envs ``own`` (all when ``None``); hold the others' for `recv`."""
        if own is None:
            return outcomes
        held_results, held_errors = self._held
        results, errors = outcomes
        for i in [i for i in results if i not in own]:
            held_results[i] = results.pop(i)
        for i in [i for i in errors if i not in own]:
            held_errors[i] = errors.pop(i)
        return results, errors

    def _take_held(self, outcomes: Outcomes) -> Outcomes:
        """``outcomes`` with the held ones added (they came first); nothing is held after."""
        held_results, held_errors = self._held
        if not held_results and not held_errors:
            return outcomes
        self._held = ({}, {})
        results, errors = outcomes
        results.update(held_results)
        errors.update(held_errors)
        return results, errors

    def _timeout_of(self, name: str) -> float | None:
        """Seconds an env may take to answer the call ``name`` (``None``: no limit)."""
        return self.reset_timeout if name == "reset" else self.step_timeout

    async def _drain_sent(self) -> None:
        """Cancel (and wait for) every env still in flight from send()."""
        backend = self._backend
        assert backend is not None
        await backend.drain()
        self._in_flight.clear()
        self._held = ({}, {})

    async def _stop_sent(self, reason: str) -> None:
        """Cancel (and wait for) the envs in flight from send(); a reset is needed then."""
        if self._life.state is State.SENT:
            await self._drain_sent()
            self._life.break_(reason)

    def _abandon_sent(self, reason: str) -> None:
        backend = self._backend
        assert backend is not None
        backend.cancel()
        self._in_flight.clear()
        self._held = ({}, {})
        self._life.break_(reason)

    # -- gymnasium's AsyncVectorEnv spellings (BlockingVectorEnv's; one set of rules) --

    def _step_async(self, actions: Any) -> None:
        """``step_async``: `send` ``actions`` to every env (from code running in the loop)."""
        self._life.check(VectorCall.STEP_ASYNC)
        self.send(actions)

    async def _step_wait(
        self,
        timeout: float | None,  # noqa: ASYNC109  (gymnasium's; the envs out then are cancelled)
    ) -> StepBatch:
        """``step_wait``: every env's step from `_step_async`, batched as `step` batches it."""
        self._life.check(VectorCall.STEP_WAIT)
        wait = validate.check_timeout("timeout", timeout)
        if len(self._in_flight) < self.num_envs:
            idle = sorted(set(self._all) - self._in_flight)
            raise StateError(
                f"cannot call step_wait(): it collects a step of every env, and env(s) {idle} "
                "are not in flight; recv() the envs sent with send()"
            )
        return self._stepped(await self._receive("step_wait()", self.num_envs, wait, strict=True))

    async def _reset_async(self, seed: object, options: object) -> None:
        """``reset_async``: start a reset (see `reset`) and return; `_reset_wait` collects it."""
        indices, op, mask = self._reset_call(VectorCall.RESET_ASYNC, seed, options)
        await self._clear_break()
        unbuilt = await self._rebuild_lost(indices)
        self._sent_reset = mask, unbuilt
        self._launch_sent(indices, op, "reset_async()")

    async def _reset_wait(
        self,
        timeout: float | None,  # noqa: ASYNC109  (gymnasium's; the envs out then are cancelled)
    ) -> tuple[ObsType, dict[str, Any]]:
        """``reset_wait``: the reset started by `_reset_async`, as `reset` returns it."""
        self._life.check(VectorCall.RESET_WAIT)
        wait = validate.check_timeout("timeout", timeout)
        mask = self._sent_reset[0]
        indices = sorted(self._in_flight)
        results = await self._receive("reset_wait()", len(indices), wait, strict=True)
        return self._reset_done(indices, results, mask)

    def latency_stats(self) -> LatencyStats:
        """Latency of each env's recent calls that waited (which server is slow?).

        Calls of async envs that suspended and every call on the thread backend
        are timed, from their start to their result; the last 256 per env are
        kept.  Envs that answer without waiting (CPU-bound envs) are not timed.
        """
        backend = self._backend
        assert backend is not None
        return backend.latency.summary()

    async def render(self) -> tuple[RenderFrame | None, ...]:
        """Each env's frame, by env index."""
        return await self._broadcast(RENDER, "render")

    async def call(
        self, name: str, *args: Any, env_ids: EnvIds | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call method ``name`` on every env (awaiting coroutines); attributes are read.

        Args:
            name: The method (or attribute) of each env.
            *args: Positional arguments of the method.
            env_ids: The envs to call, as for `send` (``None``: every env); the
                others are not touched.  It is this call's own keyword, so a
                method argument named ``env_ids`` cannot be passed through.
            **kwargs: Keyword arguments of the method.

        Returns:
            Each env's result, in the order of ``env_ids`` (by env index for ``None``).
        """
        return await self._broadcast(CallMethod(_check_name(name), args, kwargs), "call", env_ids)

    async def get_attr(self, name: str, *, env_ids: EnvIds | None = None) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (or of those in ``env_ids``, in that order)."""
        return await self._broadcast(GetAttr(_check_name(name)), "get_attr", env_ids)

    async def set_attr(self, name: str, values: Any, *, env_ids: EnvIds | None = None) -> None:
        """Set attribute ``name`` on every env: one value per env, or one for all.

        Args:
            name: The attribute.
            values: A list or tuple of one value per env (of ``env_ids``, in
                that order), or any other value, set on every env.
            env_ids: The envs to set it on, as for `send` (``None``: every env).
        """
        self._life.check(VectorCall.INSPECT)
        name = _check_name(name)
        ids = self._env_ids(env_ids)
        values = validate.check_values(
            values, len(ids), "len(env_ids)" if env_ids is not None else ""
        )
        calls = dict(zip(ids, (SetAttr(name, v) for v in values), strict=True))
        launched = sorted(ids)
        await self._run(launched, CallOp([calls[i] for i in launched], "set_attr"), breaks=False)

    async def env_is_wrapped(
        self, wrapper_class: type, *, env_ids: EnvIds | None = None
    ) -> tuple[bool, ...]:
        """Whether each env is wrapped in ``wrapper_class``, wherever the envs live.

        The env's gymnasium wrappers are followed through ``.env`` (as
        Stable-Baselines3's ``env_is_wrapped`` does); process and Ray workers
        look at their own envs.

        Args:
            wrapper_class: A wrapper class, e.g. ``gymnasium.wrappers.RecordEpisodeStatistics``.
            env_ids: The envs to ask, as for `send` (``None``: every env).

        Returns:
            One bool per env, in the order of ``env_ids``.
        """
        if not isinstance(wrapper_class, type):
            raise TypeError(
                f"wrapper_class must be a class, got {validate.describe(wrapper_class)}"
            )
        return await self._broadcast(IsWrapped(wrapper_class), "env_is_wrapped", env_ids)

    async def close(self) -> None:
        """Close every env and release everything; calling it again does nothing.

        Raises:
            aiovec.EnvError: Some env's ``close`` raised (everything else was
                still released).
        """
        if self._life.state is State.CLOSED or self._backend is None:
            self._life.state = State.CLOSED
            return
        self._life.state = State.CLOSED
        unwound = self._unwound
        if unwound is not None and not unwound.done():  # a call is waiting on envs
            self._backend.cancel()
            await asyncio.shield(unwound)  # it sees CLOSED and raises ClosedError
        errors = await self._backend.aclose()
        if errors:
            raise EnvError(errors, "close()")

    async def __aenter__(self) -> AsyncioVectorEnv[ObsType, ActType]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (
            f"AsyncioVectorEnv(num_envs={getattr(self, 'num_envs', '?')}, "
            f"backend={getattr(self, 'backend', '?')!r}, state={self._life.state.name})"
        )

    def __del__(self) -> None:
        if getattr(self, "_backend", None) is None or self._life.state is State.CLOSED:
            return
        message = f"{self!r} was never closed; call `await venv.close()` or use `async with`"
        # Release everything first (the warning may be raised as an error): lanes
        # cancelled, threads stopped, workers reaped; envs closed on a best-effort basis.
        with contextlib.suppress(Exception):
            self._close_now()
        warnings.warn(message, ResourceWarning, stacklevel=1, source=self)

    # -- machinery -------------------------------------------------------------------

    async def _broadcast(
        self, call: EnvCall, name: str, env_ids: EnvIds | None = None
    ) -> tuple[Any, ...]:
        """Make ``call`` on every env (or those of ``env_ids``); results in that order."""
        self._life.check(VectorCall.INSPECT)
        if env_ids is None:
            results = await self._run(self._all, CallOp([call] * self.num_envs, name), breaks=False)
            return self._batcher.gather(self._all, results)
        ids = self._env_ids(env_ids)
        launched = sorted(ids)
        results = await self._run(launched, CallOp([call] * len(ids), name), breaks=False)
        return self._batcher.gather(ids, results)

    def _env_ids(self, env_ids: EnvIds | None) -> Sequence[int]:
        """The envs a call names (checked: distinct, in range), or every env for ``None``."""
        return self._all if env_ids is None else validate.check_env_ids(env_ids, self.num_envs)

    async def _run(
        self, indices: Sequence[int], op: Op, *, breaks: bool
    ) -> MutableMapping[int, Any]:
        """Run ``op`` on ``indices`` and return every env's result, or raise.

        ``breaks``: a failure leaves envs half-updated (step, reset), so the
        vector env becomes ``BROKEN``; otherwise its state is restored.
        """
        backend = self._backend
        assert backend is not None
        before = self._life.state
        self._life.state = State.BUSY
        refusal = ""
        try:
            results, errors = await self._gather(indices, op)
            if isinstance(op, StepOp):
                self._check_steps(results, errors)
            if errors and self._restartable(errors, step=isinstance(op, StepOp)):
                refusal = self._charge_restarts(errors)
                if not refusal:
                    results.update(await self._restart(errors, op.name))
                    errors = {}
        except GeneratorExit:  # the coroutine was closed unfinished: no awaiting now
            backend.cancel()
            self._life.break_(f"{op.name}() was abandoned unfinished")
            raise
        except BaseException as exc:
            if self._life.state is not State.CLOSED:
                await backend.drain()
                self._life.break_(f"{op.name}() was interrupted ({type(exc).__name__})")
            raise
        finally:
            if self._unwound is not None:
                self._unwound.set_result(None)
                self._unwound = None
        if self._life.state is State.CLOSED:
            raise ClosedError(f"the vector env was closed while {op.name}() was in flight")
        if errors:
            self._raise_for(errors, op.name, before, breaks, note=refusal)
        self._life.state = before
        return results

    async def _gather(self, indices: Sequence[int], op: Op) -> Outcomes:
        """Launch ``op`` and collect every env's outcome; late envs fail with TimeoutError.

        Every env's call runs to its end, failed or not: the errors reported
        never depend on which env happened to finish first.  A ``reset`` first
        rebuilds the envs that the backend lost (their worker died).
        """
        backend = self._backend
        assert backend is not None
        unbuilt = await self._rebuild_lost(indices) if op.name == "reset" else {}
        timeout = self._timeout_of(op.name)
        since = 0.0 if timeout is None else time.perf_counter()
        own = set(indices) if self._in_flight else None  # a restart amid sent envs
        backend.launch(indices, op)
        if not backend.pending:
            results, errors = self._keep(backend.take(), own)
            errors.update(unbuilt)  # why they are still lost
            return results, errors
        if self._unwound is None:
            self._unwound = asyncio.get_running_loop().create_future()
        if timeout is None and own is None:
            results, errors = await backend.collect(len(indices))
        else:
            results, errors = await self._collect(
                len(indices), timeout, op.name, lambda i: since, own=own
            )
        errors.update(unbuilt)
        return results, errors

    async def _rebuild_lost(self, indices: Sequence[int]) -> dict[int, BaseException]:
        """Before a reset, rebuild the envs of ``indices`` the backend lost; those it could not."""
        backend = self._backend
        assert backend is not None
        await backend.settle(indices)
        if backend.lost.isdisjoint(indices):
            return {}
        return await backend.rebuild(sorted(backend.lost.intersection(indices)))

    def _check_steps(self, results: MutableMapping[int, Any], errors: dict[int, Any]) -> None:
        """Fail the envs whose step result is malformed (it would spoil the whole batch).

        Results in shared-memory blocks were written there exactly by their
        worker; only those that came one by one are checked.
        """
        singles = results.singles if type(results) is Rows else results
        if not singles:
            return
        for i, error in self._check_results(singles).items():
            del results[i]
            errors[i] = error

    async def _restart(self, failed: dict[int, BaseException], name: str) -> dict[int, Any]:
        """Rebuild and reset the failed envs; their rows, or EnvError if the policy gives up.

        The envs are tried together, with `RestartPolicy.wait_before` between
        tries; its downtime counts from here (the failure has just been seen).
        """
        backend, policy = self._backend, self.restart_policy
        assert backend is not None
        assert policy is not None
        messages = {i: describe_failure(error, f"{name}()") for i, error in failed.items()}
        causes: dict[str, list[int]] = {}  # envs that failed alike share a line
        for i, error in sorted(failed.items()):
            causes.setdefault(describe_error(error), []).append(i)
        for cause, envs in causes.items():
            logger.warning("%s failed in %s(): %s; restarting", _envs(envs), name, cause)
        rows: dict[int, Any] = {}
        todo: dict[int, BaseException] = dict(failed)
        since = time.perf_counter()
        tried = restarts = 0
        while (delay := policy.wait_before(tried, time.perf_counter() - since)) is not None:
            if tried:
                logger.warning(
                    "%s: restart attempt %d failed (%s); attempt %d in %.3g s",
                    _envs(sorted(todo)),
                    tried,
                    describe_error(todo[min(todo)]),
                    tried + 1,
                    delay,
                )
            if delay:
                await asyncio.sleep(delay)
            tried += 1
            restarts += len(todo)
            todo = await backend.rebuild(sorted(todo)) or {}
            rebuilt = [i for i in failed if i not in rows and i not in todo]
            reset_op = CallOp([self._restart_reset(i) for i in rebuilt], "reset")
            resets, reset_errors = await self._gather(rebuilt, reset_op)
            rows.update((i, restarted_row(resets[i], messages[i])) for i in resets)
            todo.update(reset_errors)
            if not todo:
                if tried > 1:  # an outage: say once that it is over
                    logger.warning(
                        "%s back after %.3g s (%d restarts)",
                        _envs(sorted(failed)),
                        time.perf_counter() - since,
                        restarts,
                    )
                return rows
        down = time.perf_counter() - since
        logger.warning(
            "%s: giving up after %d restart attempt(s) over %.3g s: %s",
            _envs(sorted(todo)),
            tried,
            down,
            describe_error(todo[min(todo)]),
        )
        raise EnvError(todo, f"{name}() (restart failed after {tried} attempts over {down:.3g} s)")

    def _restart_reset(self, i: int) -> Reset:
        """A restarted env's reset: it starts an episode, with the hook's options if any."""
        return Reset(options=self._autoreset.reset_options(i, None))

    def _charge_restarts(self, failed: dict[int, BaseException]) -> str:
        """Charge a restart to every failed env, or to none if one is over its limit.

        Returns:
            ``""`` when every env may be restarted (each is charged one restart),
            else why the step raises instead (nothing is charged).
        """
        policy = self.restart_policy
        assert policy is not None
        now = asyncio.get_running_loop().time()
        if all(self._restarts.may_restart(i, now) for i in failed):
            self._restarts.record(failed, now)
            return ""
        refusal = (
            f"restart limit reached: more than {policy.max_restarts} restarts "
            f"within {policy.window:g} s"
        )
        logger.warning("%s: giving up: %s", _envs(sorted(failed)), refusal)
        return refusal

    def _restartable(self, errors: dict[int, BaseException], *, step: bool) -> bool:
        """Step failures are restarted under a restart policy; Ctrl-C and exits never are."""
        return (
            self.restart_policy is not None
            and step
            and all(isinstance(e, Exception) for e in errors.values())
        )

    def _raise_for(
        self,
        errors: dict[int, BaseException],
        name: str,
        before: State,
        breaks: bool,
        note: str = "",
    ) -> NoReturn:
        """Raise the error for ``errors``: its class follows the causes; ``note`` says more."""
        for error in errors.values():
            if not isinstance(error, Exception):  # Ctrl-C or exit from an env: as it is
                self._life.break_(f"{name}() was interrupted ({type(error).__name__})")
                raise error
        if breaks:
            self._life.break_(f"{name}() failed in env {min(errors)}")
        else:
            self._life.state = before
        kind: type[EnvError] = EnvError
        causes: dict[int, BaseException] = {}
        for i, error in errors.items():
            causes[i] = error
            if isinstance(error, EnvError):  # a backend's report on env i: its cause is the news
                if isinstance(error, WorkerDiedError):
                    kind = WorkerDiedError
                causes[i] = error.errors.get(i, error)
        if kind is EnvError and any(isinstance(e, TimeoutError) for e in causes.values()):
            kind = EnvTimeoutError
        raise kind(causes, f"{name}() ({note})" if note else f"{name}()")

    def _close_now(self) -> None:
        """Release everything without a loop (a failed construction, garbage collection)."""
        backend = self._backend
        self._life.state = State.CLOSED
        if backend is not None:
            backend.close_now()


def _check_hook(hook: object) -> ResetHook | None:
    if hook is not None and not callable(hook):
        raise TypeError(
            "reset_options must be a callable reset_options(env_id, episode) -> dict | None, "
            f"or None, got {validate.describe(hook)}"
        )
    return hook


def _not_before(start: float | None, launched: float) -> float | None:
    """An env's start, never before its launch (a backend may not have stamped it yet)."""
    return None if start is None else max(start, launched)


def _cancelled(error: BaseException) -> bool:
    return isinstance(error, asyncio.CancelledError)


def _envs(indices: Sequence[int]) -> str:
    """``env 3``, ``envs 0, 1, 2``, ``envs 0-255`` or ``40 envs`` for a log line (sorted)."""
    if len(indices) == 1:
        return f"env {indices[0]}"
    if len(indices) <= _HANDFUL:
        return "envs " + ", ".join(map(str, indices))
    if indices[-1] - indices[0] + 1 == len(indices):
        return f"envs {indices[0]}-{indices[-1]}"
    return f"{len(indices)} envs"


_HANDFUL = 5
"""Up to this many envs, a log line lists them; more are a range or a count."""


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty attribute name, got {validate.describe(name)}")
    return name
