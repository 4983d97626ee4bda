"""``BlockingVectorEnv``: `AsyncioVectorEnv` as a synchronous gymnasium vector env.

Every method is one line: it runs the same call of one ``AsyncioVectorEnv``
through one `Runner`.  No rule lives here: gymnasium's ``AsyncVectorEnv``
spellings (``step_async``/``step_wait``, ``reset_async``/``reset_wait``) run the
vector env's ``send``/``recv`` machinery and its lifecycle table
(`aiovec._sends.Sends`).
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import gymnasium
from gymnasium import spaces
from gymnasium.core import RenderFrame
from gymnasium.vector import AutoresetMode

from aiovec._core.autoreset import ResetHook
from aiovec._core.batching import StepBatch
from aiovec._core.latency import LatencyStats
from aiovec._core.lifecycle import PENDING, State
from aiovec._core.restart import RestartPolicy
from aiovec._core.validate import describe
from aiovec._runner import Runner
from aiovec._sends import Sends
from aiovec._vector import AsyncioVectorEnv, EnvIds, RecvBatch

__all__ = ("BlockingVectorEnv",)


async def _call(function: Callable[..., Any], *args: Any) -> Any:
    """Run a plain function inside the runner's loop (``send`` needs a running loop)."""
    return function(*args)


class BlockingVectorEnv(gymnasium.vector.VectorEnv[Any, Any, Any]):
    """A ``gymnasium.vector.VectorEnv`` whose calls run an `AsyncioVectorEnv`.

    Takes exactly the arguments of `AsyncioVectorEnv` and follows the
    same rules; it is a drop-in replacement for
    ``gymnasium.vector.SyncVectorEnv`` (``backend="inline"``) and for
    ``gymnasium.vector.AsyncVectorEnv`` (``backend="process"``; it has
    ``step_async``/``step_wait``, ``reset_async``/``reset_wait`` and
    ``close(terminate=...)``) in synchronous scripts, and works inside a
    running event loop too (Jupyter), where it runs its envs on a helper
    thread.

    Example:
        >>> envs = BlockingVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 4)
        >>> obs, infos = envs.reset(seed=42)
        >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())
        >>> envs.close()
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
        self._runner = Runner()
        try:  # built on the runner's loop, awaiting factories that wait, as `create` does
            self.vector_env: AsyncioVectorEnv[Any, Any] = self._runner.run(
                AsyncioVectorEnv.create(
                    env_fns,
                    backend=backend,
                    num_workers=num_workers,
                    autoreset_mode=autoreset_mode,
                    step_timeout=step_timeout,
                    on_error=on_error,
                    copy=copy,
                    reset_timeout=reset_timeout,
                    max_concurrency=max_concurrency,
                    backend_options=backend_options,
                    reset_options=reset_options,
                    observation_mode=observation_mode,
                    check_observations=check_observations,
                )
            )
        except BaseException:
            self._runner.close()
            raise
        venv = self.vector_env
        self._sends = Sends(venv)  # gymnasium's AsyncVectorEnv spellings
        self.num_envs = venv.num_envs
        self.single_observation_space = venv.single_observation_space
        self.single_action_space = venv.single_action_space
        self.observation_space = venv.observation_space
        self.action_space = venv.action_space
        self.metadata = venv.metadata
        self.render_mode = venv.render_mode
        self.autoreset_mode = venv.autoreset_mode
        self.observation_mode = venv.observation_mode
        self.check_observations = venv.check_observations
        self.copy = copy

    @property
    def envs(self) -> tuple[Any, ...]:
        """The env objects (inline and thread backends only)."""
        return self.vector_env.envs

    @property
    def reset_options(self) -> ResetHook | None:
        """The reset-options hook of the underlying vector env; settable."""
        return self.vector_env.reset_options

    @reset_options.setter
    def reset_options(self, hook: ResetHook | None) -> None:
        self.vector_env.reset_options = hook

    @property
    def state(self) -> State:
        """The lifecycle state of the underlying vector env."""
        return self.vector_env.state

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs; see `AsyncioVectorEnv.reset`."""
        return self._runner.run(self.vector_env.reset(seed=seed, options=options))

    def step(self, actions: Any) -> StepBatch:
        """Step the envs; see `AsyncioVectorEnv.step`."""
        return self._runner.run(self.vector_env.step(actions))

    def reset_async(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """Start resetting the envs and return at once, as ``AsyncVectorEnv.reset_async``.

        The arguments are `reset`'s and are checked here; collect the result
        with `reset_wait`.

        Raises:
            aiovec.AlreadyPendingCallError: A ``step_async`` (or ``send``) or
                ``reset_async`` is still waiting to be collected.
        """
        self._runner.run(self._sends.reset_async(seed, options))

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset started by `reset_async`; what `reset` returns.

        Args:
            timeout: Seconds to wait at most (``None``: no limit).  The envs
                that have not answered by then are cancelled: nothing of them
                can reach a later call, and only a full `reset` (or
                `close`) is allowed next.

        Raises:
            aiovec.NoAsyncCallError: No `reset_async` is waiting to be collected.
            aiovec.EnvTimeoutError: Some env did not answer within ``timeout``
                (also a ``TimeoutError`` and a ``multiprocessing.TimeoutError``,
                which ``AsyncVectorEnv`` raises).
            aiovec.EnvError: Some env's reset raised.
        """
        return self._runner.run(self._sends.reset_wait(timeout))

    def step_async(self, actions: Any) -> None:
        """Start a step of every env and return at once, as ``AsyncVectorEnv.step_async``.

        It is `send` for every env: the actions are checked here; collect the
        result with `step_wait`.

        Raises:
            aiovec.AlreadyPendingCallError: A call is still waiting to be collected.
        """
        self._runner.run(_call(self._sends.step_async, actions))

    def step_wait(self, timeout: float | None = None) -> StepBatch:
        """Wait for the step started by `step_async`; what `step` returns.

        Args:
            timeout: Seconds to wait at most, as in `reset_wait`.

        Raises:
            aiovec.NoAsyncCallError: No `step_async` is waiting to be collected.
            aiovec.EnvTimeoutError: As in `reset_wait` (or past ``step_timeout``).
            aiovec.EnvError: Some env's step raised (under ``on_error="restart"``
                it is restarted, as in `step`).
        """
        return self._runner.run(self._sends.step_wait(timeout))

    def send(self, actions: Any, env_ids: EnvIds | None = None) -> None:
        """Start steps for some envs; see `AsyncioVectorEnv.send`."""
        self._runner.run(_call(self.vector_env.send, actions, env_ids))

    def recv(self, min_envs: int | None = None, timeout: float | None = None) -> RecvBatch:
        """Results of sent envs; see `AsyncioVectorEnv.recv`."""
        return self._runner.run(self.vector_env.recv(min_envs, timeout))

    def render(self) -> tuple[RenderFrame | None, ...]:  # type: ignore[override]
        """Each env's frame; see `AsyncioVectorEnv.render`."""
        return self._runner.run(self.vector_env.render())

    def call(
        self, name: str, *args: Any, env_ids: EnvIds | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call a method on every env (or those of ``env_ids``); see `AsyncioVectorEnv.call`."""
        return self._runner.run(self.vector_env.call(name, *args, env_ids=env_ids, **kwargs))

    def get_attr(self, name: str, *, env_ids: EnvIds | None = None) -> tuple[Any, ...]:
        """Read an attribute of every env (or of ``env_ids``); see `AsyncioVectorEnv.get_attr`."""
        return self._runner.run(self.vector_env.get_attr(name, env_ids=env_ids))

    def set_attr(self, name: str, values: Any, *, env_ids: EnvIds | None = None) -> None:
        """Set an attribute on every env (or ``env_ids``); see `AsyncioVectorEnv.set_attr`."""
        self._runner.run(self.vector_env.set_attr(name, values, env_ids=env_ids))

    def env_is_wrapped(
        self, wrapper_class: type, *, env_ids: EnvIds | None = None
    ) -> tuple[bool, ...]:
        """Whether each env is wrapped in a class; see `AsyncioVectorEnv.env_is_wrapped`."""
        return self._runner.run(self.vector_env.env_is_wrapped(wrapper_class, env_ids=env_ids))

    def latency_stats(self) -> LatencyStats:
        """Per-env latency of calls that waited; see `AsyncioVectorEnv.latency_stats`."""
        return self.vector_env.latency_stats()

    def close(self, *, terminate: bool = False) -> None:  # type: ignore[override]
        """Close every env and the runner's loop; calling it again does nothing.

        The vector env ends closed even when some env's ``close`` raises.  A
        call still waiting to be collected (``step_async``, ``reset_async``,
        ``send``) is cancelled, with a ``UserWarning`` as ``AsyncVectorEnv``
        gives.

        Args:
            terminate: Do not wait for the envs to close, as
                ``AsyncVectorEnv.close(terminate=True)``: every env is closed
                best effort without waiting on it, and worker processes still
                running after a short grace period are terminated.

        Raises:
            aiovec.EnvError: Some env's ``close`` raised (everything else was
                still released; not with ``terminate=True``).
        """
        if not isinstance(terminate, bool):
            raise TypeError(f"terminate must be a bool, got {describe(terminate)}")
        if self.closed:
            return
        pending = PENDING.get(self.state)
        try:
            self.close_extras(terminate=terminate)
        finally:
            self.closed = True
        if pending is not None:  # after closing: a warning turned into an error leaks nothing
            warnings.warn(
                f"Calling `close` while waiting for a pending call to `{pending}` to complete."
                " It was cancelled.",
                UserWarning,
                stacklevel=2,
            )

    def close_extras(self, *, terminate: bool = False, **kwargs: Any) -> None:
        """Close the envs, then the runner's loop; called once by ``close()``."""
        try:
            if terminate:  # the calls in flight unwind on the loop; then nothing waits
                self._runner.run(self._sends.drain())
                self.vector_env._close_now()
            else:
                self._runner.run(self.vector_env.close())
        finally:
            self._runner.close()

    @property
    def np_random_seed(self) -> Any:
        """The envs' seeds, as ``SyncVectorEnv`` reports them."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]  # read-only, as in SyncVectorEnv
    def np_random(self) -> Any:
        """The envs' generators, as ``SyncVectorEnv`` reports them."""
        return self.get_attr("np_random")

    def __enter__(self) -> BlockingVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        venv = getattr(self, "vector_env", None)
        return f"BlockingVectorEnv({venv!r})"

    def __del__(self) -> None:
        if getattr(self, "vector_env", None) is None or self.closed:
            return
        message = f"{self!r} was never closed; call `envs.close()`"
        # Release the loop and the envs first (the warning may be raised as an
        # error): a forgotten close must not leak.
        with contextlib.suppress(Exception):  # best effort at garbage collection
            if asyncio._get_running_loop() is None:
                self.close()
            else:  # collected inside another vector env's call, which holds this thread
                self._close_now()
        warnings.warn(message, ResourceWarning, stacklevel=1, source=self)

    def _close_now(self) -> None:
        """Release the envs without a call on the loop (it cannot run now), then the loop."""
        self.closed = True
        try:
            self.vector_env._close_now()
        finally:
            self._runner.close()
