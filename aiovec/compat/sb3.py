"""Stable-Baselines3 adapter: an aiovec vector env as an SB3 ``VecEnv``.

Example:
    >>> from stable_baselines3 import PPO  # doctest: +SKIP
    >>> from aiovec.compat.sb3 import make_sb3_env
    >>> venv = make_sb3_env([lambda: gymnasium.make("CartPole-v1")] * 8)
    >>> PPO("MlpPolicy", venv).learn(10_000)

Theory of operation
-------------------
SB3's ``VecEnv`` API differs from gymnasium's vector API in the ways below; the
adapter translates each and keeps no rule of its own:

1. **Autoreset.**  An SB3 env that ends is reset inside that same step: the
   step returns the new episode's first observation, the last one travels in
   ``infos[i]["terminal_observation"]`` and the reset's info lands in
   ``reset_infos[i]``.  That is gymnasium's ``SAME_STEP`` mode, so the adapter
   requires it (`make_sb3_env` sets it) and moves ``final_obs`` and
   ``final_info`` to where SB3 wants them.
2. **Results.**  ``dones = terminations | truncations``; rewards are float32
   (as ``DummyVecEnv``'s); ``infos`` is a list of one dict per env, each with
   ``"TimeLimit.truncated"`` set to ``truncated and not terminated``.  The
   adapter owns its vector env, whose batcher gives a step's infos so
   (`aiovec._core.batching.Batcher.infos_per_env`): no batching into
   gymnasium's dict of arrays only to take it apart again.
3. **Seeds and options** are stored by ``seed()`` and ``set_options()`` and
   used once, by the next ``reset()``.  aiovec resets every env with the same
   options, so envs whose options differ are reset group by group with
   ``reset_mask`` (each env once); that needs a first reset.
4. **``step_async``/``step_wait``** are aiovec's ``send``/``recv``: the envs
   run between the two calls where they can (threads, worker processes).  On
   ``backend="inline"`` the envs run on the caller's thread either way, so
   ``step_async`` only keeps the actions and ``step_wait`` makes one lock-step
   ``step`` of them (one call into the event loop instead of two; the actions
   are checked there).  A ``reset()`` after ``step_async`` first collects the
   steps in flight (SB3 says they are cancelled; their results are discarded;
   actions only kept are dropped).  A step before the
   first ``reset()``, which SB3's vec envs hand to envs never reset, resets
   them first: aiovec's vector env needs that reset.
5. **Indices.**  SB3's ``indices`` are aiovec's ``env_ids``: ``get_attr``,
   ``set_attr``, ``env_method`` (aiovec's ``call``) and ``env_is_wrapped`` reach
   the envs named and no others, on every backend (process and Ray workers are
   asked about their own envs).  Negative indices count from the end, as in
   SB3's list of envs.
6. **Actions.**  SB3 indexes its actions by env: an array with ``num_envs``
   rows, or a list or tuple of one action per env.  A list of per-env
   ``Dict``/``Tuple`` actions is batched the way gymnasium batches them.
7. **Copies.**  SB3's vec envs return infos (``terminal_observation``
   included) that the envs no longer hold.  Where the envs live in this process
   (``inline``, ``thread``) an info holds an env's own objects: each env's info
   that is not empty is deep-copied, as ``DummyVecEnv`` copies its infos; a
   worker's results arrive as copies already.
8. **Errors.**  An env's own exception (from its factory, ``reset``, ``step``,
   an attribute or a method) is raised as itself, as ``DummyVecEnv`` lets it
   through, not wrapped in `aiovec.EnvError`: SB3 code that catches, e.g.,
   ``gymnasium.error.DeprecatedEnv`` or a simulator's own error still does, on
   every backend.  A note (``add_note``) names the env, and any other env that
   failed in the same call.  aiovec's own failures (`aiovec.EnvTimeoutError`,
   `aiovec.WorkerDiedError`, an env lost with its worker) have no exception of
   the env's to raise and stay as they are.

An `aiovec.AsyncioVectorEnv` is driven through the runner that
`aiovec.BlockingVectorEnv` uses: SB3 is synchronous code.
"""

from __future__ import annotations

import copy
import inspect
import operator
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._blocking import BlockingVectorEnv
from aiovec._core.lifecycle import State
from aiovec._errors import EnvError, StateError
from aiovec._runner import Runner
from aiovec._vector import AsyncioVectorEnv
from aiovec.compat._shared import batch_per_env, own_error, unbatch_infos

try:
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        'aiovec.compat.sb3 needs Stable-Baselines3: pip install "aiovec[sb3]"'
    ) from exc

__all__ = ("SB3VecEnv", "make_sb3_env", "unbatch_infos")

_FINAL = ("final_obs", "final_info")


def make_sb3_env(env_fns: Sequence[Callable[[], Any]], **kwargs: Any) -> SB3VecEnv:
    """Build a `aiovec.BlockingVectorEnv` in ``SAME_STEP`` mode and wrap it for SB3.

    Args:
        env_fns: Env factories, as for `aiovec.BlockingVectorEnv`.
        **kwargs: Any other argument of `aiovec.BlockingVectorEnv`
            (``backend``, ``step_timeout``, ``on_error``, ...), except
            ``autoreset_mode``.  ``check_observations`` defaults to
            ``False``: SB3's vec envs pass observations outside their space on.

    Returns:
        The SB3 ``VecEnv``.

    Raises:
        Exception: A factory's own exception, as SB3's vec envs raise it (its
            note names the env), where aiovec raises `aiovec.EnvError`.
    """
    if "autoreset_mode" in kwargs:
        raise TypeError("make_sb3_env sets autoreset_mode itself (SB3 needs SAME_STEP)")
    kwargs.setdefault("check_observations", False)  # (as DummyVecEnv and SubprocVecEnv)
    try:
        venv = BlockingVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
    except EnvError as exc:
        own = own_error(exc, "make_sb3_env", "SB3")
    else:
        try:
            return SB3VecEnv(venv)
        except BaseException:
            venv.close()
            raise
    raise own  # outside the handler: as the env raised it, with no aiovec context


class SB3VecEnv(VecEnv):
    """An aiovec vector env as a Stable-Baselines3 ``VecEnv``.

    Args:
        venv: An `aiovec.BlockingVectorEnv` or `aiovec.AsyncioVectorEnv`
            built with ``autoreset_mode=AutoresetMode.SAME_STEP`` (an
            ``AsyncioVectorEnv`` not yet used on another event loop).  The
            adapter owns it from now on: ``close()`` closes it.

    Raises:
        TypeError: ``venv`` is not an aiovec vector env.
        ValueError: ``venv`` does not use ``SAME_STEP`` autoreset.
    """

    def __init__(self, venv: BlockingVectorEnv | AsyncioVectorEnv[Any, Any]) -> None:
        if not isinstance(venv, BlockingVectorEnv | AsyncioVectorEnv):
            raise TypeError(
                "SB3VecEnv wraps an aiovec.BlockingVectorEnv or aiovec.AsyncioVectorEnv, got "
                f"{type(venv).__name__}; or build one with make_sb3_env(env_fns)"
            )
        if venv.autoreset_mode is not AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3 resets an env inside the step on which it ends: build the vector env with "
                f"autoreset_mode=AutoresetMode.SAME_STEP (got {venv.autoreset_mode}), or use "
                "make_sb3_env(env_fns)"
            )
        self.venv = venv
        self._copies = _envs_in_this_process(venv)  # their infos may hold the envs' objects
        _front(venv)._batcher.infos_per_env = True  # SB3's infos: one dict per env
        self._runner = Runner() if isinstance(venv, AsyncioVectorEnv) else None
        self._sent = False
        # inline: step_async keeps the actions here (in a 1-tuple) for step_wait's step
        self._held: tuple[Any] | None = None
        self._keeps = _backend_of(venv) == "inline"
        try:
            super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        except BaseException:
            if self._runner is not None:
                self._runner.close()
            raise

    # -- the VecEnv API ------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds and options stored since the last reset.

        Envs whose options differ are reset group by group (aiovec's ``reset_mask``),
        each env once, with its own options.

        Raises:
            NotImplementedError: The options differ between envs and the vector
                env has not been reset yet (a masked reset needs a first reset).
        """
        seeds, options = self._seeds, self._options
        groups: list[tuple[dict[str, Any] | None, list[int]]] = []
        for i, option in enumerate(options):
            found = next((envs for known, envs in groups if known == option), None)
            if found is None:
                groups.append((option, [i]))
            else:
                found.append(i)
        if len(groups) > 1 and self.venv.state not in (State.READY, State.SENT):
            raise NotImplementedError(
                "set_options() with different options per env: aiovec resets the envs that "
                "share options together (reset_mask), which needs a first reset(); call "
                f"reset() once before (the vector env is {self.venv.state.name})"
            )
        self._reset_seeds()
        self._reset_options()
        self._collect_sent()
        seed = None if all(s is None for s in seeds) else list(seeds)
        obs: VecEnvObs
        if len(groups) == 1:
            obs, infos = self._do("reset", seed=seed, options=options[0] or None)
            self.reset_infos = unbatch_infos(infos, self.num_envs)
            return obs
        reset_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for shared, envs in groups:
            mask = np.zeros(self.num_envs, np.bool_)
            mask[envs] = True
            obs, infos = self._do(
                "reset", seed=seed, options={**(shared or {}), "reset_mask": mask}
            )
            per_env = unbatch_infos(infos, self.num_envs)
            for i in envs:
                reset_infos[i] = per_env[i]
        self.reset_infos = reset_infos
        return obs  # the last masked reset's batch holds every env's new observation

    def step_async(self, actions: np.ndarray | Sequence[Any]) -> None:
        """Start a step of every env (aiovec's ``send``).

        Args:
            actions: One action per env, as SB3's vec envs take them: an array
                with ``num_envs`` rows, or a list or tuple of per-env actions
                (of any space, ``Dict`` and ``Tuple`` included); aiovec's
                batched form (e.g. a dict of batched arrays) works too.
        """
        if self.venv.state is State.NEEDS_RESET:  # SB3 steps envs never reset: reset them first
            self.reset()
        if self._keeps:  # inline: step_wait steps them (the envs run on this thread anyway)
            if self._held is not None:
                raise StateError(
                    f"env(s) {list(range(self.num_envs))} are still in flight from "
                    "step_async(); step_wait() them first"
                )
            self._held = (self._batched(actions),)
        else:
            self._do("send", self._batched(actions))
        self._sent = True

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step started by `step_async` (aiovec's ``recv``)."""
        self._sent = False
        held, self._held = self._held, None
        if held is not None:  # inline: the one straight path, a lock-step step
            obs, rewards, terminations, truncations, infos = self._do("step", held[0])
        else:
            obs, rewards, terminations, truncations, infos, _ids = self._do("recv")
        per_env: list[dict[str, Any]] = []
        copies = self._copies  # the envs' own objects: copied, as DummyVecEnv copies its infos
        ends = zip(terminations.tolist(), truncations.tolist(), strict=True)
        for i, (info, (terminated, truncated)) in enumerate(zip(infos, ends, strict=True)):
            own = copy.deepcopy(info) if copies and info else dict(info)
            if terminated or truncated:
                own = self._ended(i, own)
            own["TimeLimit.truncated"] = truncated and not terminated  # a time limit
            per_env.append(own)
        return obs, rewards.astype(np.float32), terminations | truncations, per_env

    def close(self) -> None:
        """Close every env and the vector env (and the runner driving it)."""
        try:
            self._do("close")
        finally:
            if self._runner is not None:
                self._runner.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attribute ``attr_name`` of the envs in ``indices``.

        Raises:
            AttributeError: Some env has no such attribute.
        """
        env_ids = self._env_ids(indices)
        if env_ids == []:
            return []
        return list(self._do("get_attr", attr_name, env_ids=env_ids))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` to ``value`` on the envs in ``indices`` (and no others)."""
        env_ids = self._env_ids(indices)
        count = self.num_envs if env_ids is None else len(env_ids)
        if count:
            self._do("set_attr", attr_name, [value] * count, env_ids=env_ids)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` on the envs in ``indices`` (and no others); their results."""
        env_ids = self._env_ids(indices)
        if env_ids == []:
            return []
        return list(self._do("call", method_name, *method_args, env_ids=env_ids, **method_kwargs))

    def env_is_wrapped(
        self,
        wrapper_class: type[gymnasium.Wrapper[Any, Any, Any, Any]],
        indices: VecEnvIndices = None,
    ) -> list[bool]:
        """Whether each env in ``indices`` is wrapped in ``wrapper_class`` (every backend)."""
        env_ids = self._env_ids(indices)
        if env_ids == []:
            return []
        return list(self._do("env_is_wrapped", wrapper_class, env_ids=env_ids))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame."""
        return list(self._do("render"))

    # -- machinery -----------------------------------------------------------------

    def _do(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` on the blocking front end, or run it on the runner (await API).

        An env's own exception is raised as itself (`aiovec.compat._shared.own_error`),
        as ``DummyVecEnv`` does.
        """
        method = getattr(self.venv, name)
        try:
            if self._runner is None:
                return method(*args, **kwargs)
            return self._runner.run(_completed(method, args, kwargs))
        except EnvError as exc:
            own = own_error(exc, "make_sb3_env", "SB3")
        raise own  # outside the handler: as the env raised it, with no aiovec context

    def _collect_sent(self) -> None:
        if self._sent:
            self._sent = False
            if self._held is None:
                self._do("recv")
            self._held = None  # inline: the step never ran

    def _ended(self, i: int, info: dict[str, Any]) -> dict[str, Any]:
        """SB3's info of env ``i``, which ended and was reset in this step."""
        self.reset_infos[i] = {k: v for k, v in info.items() if k not in _FINAL}
        ended = dict(info.get("final_info", {}))
        if "final_obs" in info:  # absent for an env restarted by on_error="restart"
            ended["terminal_observation"] = info["final_obs"]
        return ended

    def _env_ids(self, indices: VecEnvIndices) -> list[int] | None:
        """SB3's ``indices`` as aiovec's ``env_ids`` (``None``: every env; ``-1``: the last)."""
        if indices is None:
            return None
        if isinstance(indices, np.integer):
            indices = int(indices)
        n = self.num_envs  # SB3 indexes a list of envs: -1 is the last one
        return [
            i + n if -n <= i < 0 else i for i in map(operator.index, self._get_indices(indices))
        ]

    def _batched(self, actions: Any) -> Any:
        """A list or tuple of per-env actions of a ``Dict``/``Tuple`` space, batched."""
        if isinstance(actions, np.ndarray):
            return actions  # SB3's rows: aiovec's own input
        return batch_per_env(self.venv.single_action_space, actions, self.num_envs)


def _front(venv: BlockingVectorEnv | AsyncioVectorEnv[Any, Any]) -> AsyncioVectorEnv[Any, Any]:
    """The `aiovec.AsyncioVectorEnv` that makes ``venv``'s calls."""
    return venv.vector_env if isinstance(venv, BlockingVectorEnv) else venv


def _backend_of(venv: BlockingVectorEnv | AsyncioVectorEnv[Any, Any]) -> str:
    """The backend's name (``"inline"``, ``"process"``, ...)."""
    return _front(venv).backend


def _envs_in_this_process(venv: BlockingVectorEnv | AsyncioVectorEnv[Any, Any]) -> bool:
    """Whether the envs are objects of this process (``inline``, ``thread``)."""
    try:
        return venv.envs is not None
    except AttributeError:
        return False


async def _completed(method: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    """``method(*args, **kwargs)``, awaited if it returns an awaitable (run on the loop)."""
    result = method(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result
