"""``AsyncioVectorEnv``: the one implementation of a vector env's calls.

Theory of operation.  Each public call does the same four things: check the
lifecycle table (``_core/lifecycle.py``), validate its arguments (nothing is
touched yet), hand an op (``_core/ops.py``) to the parts below and batch what
comes back (``_core/batching.py``).  ``BlockingVectorEnv`` forwards here; no
rule is written anywhere else.

The vector env owns its parts and delegates to them:

- `aiovec._flight.Flight` runs the calls on the envs: a whole call
  (``step``, ``reset``, ``call``, ...) and partial stepping (``send`` launches,
  ``recv`` receives) end through its one skeleton: outcomes collected with
  per-env deadlines, failed steps restarted, failures raised, the state the
  call leaves;
- `aiovec._restarter.Restarter` restarts failed envs under a `RestartPolicy`;
- `aiovec._sent.Sent` remembers the envs in flight from ``send()`` and the
  outcomes held for them.

gymnasium's ``AsyncVectorEnv`` spellings, which only ``BlockingVectorEnv``
offers, and the collectors' resets start and receive envs through the same
parts (`aiovec._sends.Sends`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import warnings
from collections.abc import Callable, Coroutine, Mapping, MutableMapping, Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import anyio
import numpy as np
from gymnasium import spaces
from gymnasium.core import RenderFrame
from gymnasium.vector import AutoresetMode

from aiovec._core import validate
from aiovec._core.autoreset import AutoresetState, ResetHook
from aiovec._core.batching import Batcher, StepBatch
from aiovec._core.calls import (
    KEEP_ENDED,
    RENDER,
    CallMethod,
    EnvCall,
    GetAttr,
    IsWrapped,
    Reset,
    SetAttr,
)
from aiovec._core.fits import ResultCheck
from aiovec._core.latency import LatencyStats
from aiovec._core.lifecycle import Lifecycle, State, VectorCall, allowed_in
from aiovec._core.ops import CallOp, StepOp
from aiovec._core.restart import RestartPolicy
from aiovec._core.rows import Rows
from aiovec._errors import EnvError, StateError
from aiovec._flight import Flight
from aiovec._restarter import Restarter, policy_of
from aiovec._sent import Sent
from aiovec.backends import Backend, load_backend

__all__ = ("AsyncioVectorEnv", "RecvBatch")

EnvIds = Sequence[int] | np.ndarray
"""Env indices a call names (``send``'s ``env_ids``, ``call``'s, ...)."""

RecvBatch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]

# An enum member read off its class costs 0.1-0.2 us on Python 3.11 (``EnumType``
# has a ``__getattr__``): what runs on every call reads module names instead.
_STEP, _SEND, _RECV = VectorCall.STEP, VectorCall.SEND, VectorCall.RECV
_READY, _SENT = State.READY, State.SENT
_STEP_OK, _SEND_OK, _RECV_OK = allowed_in(_STEP), allowed_in(_SEND), allowed_in(_RECV)
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
        observation_mode: How the envs' observation spaces batch, as in
            gymnasium's vector envs: ``"same"`` (every env has env 0's
            space), ``"different"`` (one shape and dtype, bounds of their
            own, batched by gymnasium's ``batch_differing_spaces``), or a
            tuple ``(observation_space, single_observation_space)`` to use
            as they are (each env's space of the single space's shape and
            dtype).
        check_observations: When observations are checked against each
            env's observation space (its bounds, as gymnasium's
            ``Space.contains``; their shape and dtype always are): ``None``, in
            the first reset and the first step; ``True``, in every call;
            ``False``, never.  One that does not fit fails its env (an
            `aiovec.EnvError` naming the env, the call and the first element
            out of bounds).

    Raises:
        TypeError: An argument has the wrong type (the message names it).
        ValueError: An argument has a wrong value, the envs' spaces differ
            (beyond what ``observation_mode`` allows; also a ``RuntimeError``), or
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
        observation_mode: str | tuple[spaces.Space[Any], spaces.Space[Any]] = "same",
        check_observations: bool | None = None,
    ) -> None:
        self._life = Lifecycle()
        self._backend: Backend | None = None
        fns = validate.check_env_fns(env_fns)
        mode = validate.check_autoreset_mode(autoreset_mode)
        backend_name = validate.check_choice("backend", backend, validate.BACKENDS)
        workers = validate.check_num_workers(num_workers, len(fns))
        self.step_timeout = validate.check_timeout("step_timeout", step_timeout)
        self.reset_timeout = validate.check_timeout("reset_timeout", reset_timeout)
        if self.reset_timeout is None:
            self.reset_timeout = self.step_timeout
        self.on_error, self.restart_policy = policy_of(on_error)
        if not isinstance(copy, bool):
            raise TypeError(f"copy must be a bool, got {validate.describe(copy)}")
        limiter = validate.check_max_concurrency(max_concurrency, backend_name)
        self._hook = _check_hook(reset_options)
        self.observation_mode = validate.check_observation_mode(observation_mode)
        self.check_observations = validate.check_bool_or_none(
            "check_observations", check_observations
        )
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
            single, batched = validate.check_spaces(
                traits.observation_spaces, traits.action_spaces, self.observation_mode
            )
            envs = self._backend.envs  # built in this process (workers check their own)
            if envs is not None:
                validate.check_distinct_envs(envs)
        except (TypeError, ValueError):
            self._close_now()
            raise
        mode = self.autoreset_mode
        self.metadata: dict[str, Any] = {**traits.metadata, "autoreset_mode": mode}
        self.render_mode: str | None = traits.render_mode
        self._batcher = Batcher(single, traits.action_spaces[0], self.num_envs, self.copy, batched)
        self._autoreset = AutoresetState(mode, self.num_envs, self._hook)
        self._sent = Sent(self.num_envs)
        self._check = ResultCheck(traits.observation_spaces, self.check_observations)
        self._order = tuple(range(self.num_envs))
        restarter = Restarter(self.restart_policy, self.num_envs, self._backend, self._autoreset)
        self._flight = Flight(
            self._backend,
            self._life,
            self._sent,
            restarter,
            check_results=self._check.check,
            step_timeout=self.step_timeout,
            reset_timeout=self.reset_timeout,
        )
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
        await self._flight.clear_break()
        results = await self._flight.run(indices, op, breaks=True)
        return self._reset_done(indices, results, mask)

    def _reset_call(
        self, call: VectorCall, seed: object, options: object
    ) -> tuple[Sequence[int], CallOp, np.ndarray | None]:
        """Check a reset (``call`` is allowed now, valid arguments); its envs, op and mask.

        Amid envs sent by ``send()``, a ``reset_mask`` may reset envs that are
        not in flight (their rows come back; the others stay in flight).
        """
        life = self._life
        amid_sent = call is VectorCall.RESET and life.state is State.SENT
        if not amid_sent:
            life.check(call)
        seeds = validate.check_seeds(seed, self.num_envs)
        env_options, mask = validate.check_options(options, self.num_envs)
        if mask is None:
            if amid_sent:
                life.check(call)  # refused, in the state's words
            indices: Sequence[int] = self._all
        else:
            life.check(VectorCall.RESET_MASK)
            indices = np.flatnonzero(mask).tolist()
            busy = self._sent.envs.intersection(indices)
            if busy:
                raise StateError(
                    f"cannot reset env(s) {sorted(busy)}: they are in flight from send(); "
                    "recv() them first (a reset_mask may name only envs not in flight)"
                )
        resets = [Reset(seeds[i], self._autoreset.reset_options(i, env_options)) for i in indices]
        return indices, CallOp(resets, "reset"), mask

    def _reset_done(
        self, indices: Sequence[int], results: MutableMapping[int, Any], mask: np.ndarray | None
    ) -> tuple[ObsType, dict[str, Any]]:
        """The batch of a reset whose every env answered; the vector env is ready."""
        self._autoreset.was_reset(mask)
        observations, infos = self._batcher.reset_batch(indices, results)
        self._life.state = State.SENT if self._sent.envs else State.READY
        return observations, infos

    async def step(self, actions: Any) -> StepBatch:
        """Step every env with its action, under the autoreset mode's rules.

        Args:
            actions: A batch of actions from ``action_space``.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``,
            ordered by env index.
        """
        if self._life.state not in _STEP_OK:
            self._life.check(_STEP)  # refused
        per_env = self._batcher.split_actions(actions)
        reset_first = self._autoreset.plan()
        batch = actions if self._hook is None else self._batch_of(actions, reset_first)
        timed = self.step_timeout is not None or (
            self.reset_timeout is not None and any(reset_first)
        )
        op = StepOp(self.autoreset_mode, per_env, reset_first, "step", batch, False, timed)
        return self._stepped(await self._flight.run(self._all, op))

    def _stepped(self, results: MutableMapping[int, Any]) -> StepBatch:
        """The batch of a step whose every env answered; the vector env is ready."""
        clean = None if type(results) is Rows else self._check.clean_columns(results, self._order)
        batch = self._batcher.step_batch(self._all, results, clean)
        self._autoreset.stepped(None, batch[2], batch[3])
        self._life.state = _READY
        return batch

    def send(self, actions: Any, env_ids: EnvIds | None = None) -> None:
        """Start steps for some envs and return at once (EnvPool's asynchronous mode).

        Call it from code running in the event loop; collect the results with
        `recv`.  Each env follows the same autoreset and info rules as
        with `step`.  Envs still in flight cannot be sent again.  Other envs
        may be sent while a `recv` waits (from another task): that ``recv``
        collects them too.

        Args:
            actions: One action per env in ``env_ids``, batched.
            env_ids: The envs to step (``None``: every env).
        """
        self._send(actions, env_ids)

    def _send(
        self,
        actions: Any,
        env_ids: EnvIds | None,
        *,
        keep_ended: bool = False,
        checked: bool = False,
    ) -> None:
        """`send`, with two switches for the collectors.

        ``keep_ended``: under ``SAME_STEP``, an env that ends is not reset; its
        caller resets it (the EpisodeCollector, with the next member's task).
        ``checked``: the caller checked the actions (naming its policy and the
        envs of the policy's call in its errors).
        """
        if self._life.state not in _SEND_OK:
            self._life.check(_SEND)  # refused
        ids = self._all if env_ids is None else validate.check_env_ids(env_ids, self.num_envs)
        busy = sorted(self._sent.envs.intersection(ids))
        if busy:
            raise StateError(f"env(s) {busy} are still in flight from send(); recv() them first")
        per_env = self._batcher.split_actions(actions, len(ids), checked=checked)
        keep_ended = keep_ended and self.autoreset_mode is AutoresetMode.SAME_STEP
        if keep_ended:
            reset_first: list[Any] = [KEEP_ENDED] * len(ids)
        else:
            reset_first = self._autoreset.plan(None if env_ids is None else ids)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "send() starts envs on the running event loop: call it from async code "
                "(BlockingVectorEnv.send works from anywhere)"
            ) from None
        if keep_ended:
            batch = None
        else:
            batch = actions if self._hook is None else self._batch_of(actions, reset_first)
        op = StepOp(self.autoreset_mode, per_env, reset_first, "step", batch, True, False)
        self._flight.send(ids, op, "send()")

    def _batch_of(self, actions: Any, reset_first: list[Any]) -> Any:
        """A step op's ``batch``: none where an autoreset has options (they go env by env)."""
        if self._hook is None or all(type(f) is bool for f in reset_first):
            return actions
        return None

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
        if self._life.state not in _RECV_OK:
            self._life.check(_RECV)  # refused
        wanted = validate.check_min_envs(min_envs, len(self._sent.envs))
        wait = None if timeout is None else validate.check_timeout("timeout", timeout)
        results = await self._flight.receive("recv()", wanted, wait, strict=False)
        ids = sorted(results)
        clean = None
        if len(ids) == self.num_envs and type(results) is not Rows:
            clean = self._check.clean_columns(results, self._order)
        batch = self._batcher.subset_batch(ids, results, clean)
        self._autoreset.stepped(ids, batch[2], batch[3])
        self._life.state = _SENT if self._sent.envs else _READY
        return (*batch, np.array(ids, dtype=np.int64))

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
        await self._flight.run(
            launched, CallOp([calls[i] for i in launched], "set_attr"), breaks=False
        )

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
        unwound = self._flight.unwound
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
            results = await self._flight.run(
                self._all, CallOp([call] * self.num_envs, name), breaks=False
            )
            return self._batcher.gather(self._all, results)
        ids = self._env_ids(env_ids)
        launched = sorted(ids)
        results = await self._flight.run(launched, CallOp([call] * len(ids), name), breaks=False)
        return self._batcher.gather(ids, results)

    def _env_ids(self, env_ids: EnvIds | None) -> Sequence[int]:
        """The envs a call names (checked: distinct, in range), or every env for ``None``."""
        return self._all if env_ids is None else validate.check_env_ids(env_ids, self.num_envs)

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


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty attribute name, got {validate.describe(name)}")
    return name
