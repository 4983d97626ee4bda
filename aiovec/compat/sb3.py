"""Stable-Baselines3 adapter: an aiovec vector env as an SB3 ``VecEnv``.

Example:
    >>> from stable_baselines3 import PPO  # doctest: +SKIP
    >>> from aiovec.compat.sb3 import make_sb3_env
    >>> venv = make_sb3_env([lambda: gymnasium.make("CartPole-v1")] * 8)
    >>> PPO("MlpPolicy", venv).learn(10_000)

Theory of operation
-------------------
SB3's ``VecEnv`` API differs from gymnasium's vector API in five ways; the
adapter translates each and keeps no rule of its own:

1. **Autoreset.**  An SB3 env that ends is reset inside that same step: the
   step returns the new episode's first observation, the last one travels in
   ``infos[i]["terminal_observation"]`` and the reset's info lands in
   ``reset_infos[i]``.  That is gymnasium's ``SAME_STEP`` mode, so the adapter
   requires it (`make_sb3_env` sets it) and moves ``final_obs`` and
   ``final_info`` to where SB3 wants them.
2. **Results.**  ``dones = terminations | truncations``; rewards are float32
   (as ``DummyVecEnv``'s); ``infos`` is a list of one dict per env (gymnasium's
   dict of arrays with ``_key`` masks, unbatched), each with
   ``"TimeLimit.truncated"`` set to ``truncated and not terminated``.
3. **Seeds and options** are stored by ``seed()`` and ``set_options()`` and
   used once, by the next ``reset()``.  aiovec resets every env with the same
   options, so per-env options that differ are refused.
4. **``step_async``/``step_wait``** are aiovec's ``send``/``recv``: the envs
   run between the two calls where they can (threads, worker processes).  A
   ``reset()`` after ``step_async`` first collects the steps in flight (SB3
   says they are cancelled; their results are discarded).
5. **Indices.**  aiovec's ``get_attr``/``set_attr``/``call`` address every env.
   Reads (``get_attr``, ``env_is_wrapped``) accept any subset; ``set_attr`` and
   ``env_method`` refuse a strict subset rather than touch envs they should not.

An `aiovec.AsyncioVectorEnv` is driven through the runner that
`aiovec.BlockingVectorEnv` uses: SB3 is synchronous code.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode

from aiovec._blocking import BlockingVectorEnv
from aiovec._errors import EnvError
from aiovec._runner import Runner
from aiovec._vector import AsyncioVectorEnv

try:
    from stable_baselines3.common.env_util import is_wrapped
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
            ``autoreset_mode``.

    Returns:
        The SB3 ``VecEnv``.
    """
    if "autoreset_mode" in kwargs:
        raise TypeError("make_sb3_env sets autoreset_mode itself (SB3 needs SAME_STEP)")
    venv = BlockingVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)
    try:
        return SB3VecEnv(venv)
    except BaseException:
        venv.close()
        raise


def unbatch_infos(infos: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Gymnasium's vector infos (arrays with ``_key`` masks) as one dict per env.

    A key without a mask belongs to every env; nested dicts are unbatched too.
    """
    per_env: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        values = unbatch_infos(value, num_envs) if isinstance(value, dict) else value
        for i, env_info in enumerate(per_env):
            if mask is None or mask[i]:
                env_info[key] = values[i]
    return per_env


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
        self._runner = Runner() if isinstance(venv, AsyncioVectorEnv) else None
        self._sent = False
        try:
            super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        except BaseException:
            if self._runner is not None:
                self._runner.close()
            raise

    # -- the VecEnv API ------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        """Reset every env with the seeds and options stored since the last reset."""
        seeds, options = self._seeds, self._options
        self._reset_seeds()
        self._reset_options()
        if any(option != options[0] for option in options):
            raise NotImplementedError(
                "aiovec resets every env with the same options; set_options(dict) works, "
                "a list of different options does not"
            )
        self._collect_sent()
        seed = None if all(s is None for s in seeds) else list(seeds)
        obs: VecEnvObs
        obs, infos = self._do("reset", seed=seed, options=options[0] or None)
        self.reset_infos = unbatch_infos(infos, self.num_envs)
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Start a step of every env (aiovec's ``send``)."""
        self._do("send", actions)
        self._sent = True

    def step_wait(self) -> VecEnvStepReturn:
        """Wait for the step started by `step_async` (aiovec's ``recv``)."""
        self._sent = False
        obs, rewards, terminations, truncations, infos, _ids = self._do("recv")
        dones = terminations | truncations
        per_env = unbatch_infos(infos, self.num_envs)
        for i in np.flatnonzero(dones).tolist():
            per_env[i] = self._ended(i, per_env[i])
        for i, info in enumerate(per_env):
            info["TimeLimit.truncated"] = bool(truncations[i] and not terminations[i])
        return obs, rewards.astype(np.float32), dones, per_env

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
        try:
            values = self._do("get_attr", attr_name)
        except EnvError as exc:
            if all(isinstance(e, AttributeError) for e in exc.errors.values()):
                raise AttributeError(str(exc)) from exc
            raise
        return [values[i] for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set ``attr_name`` to ``value`` on every env (``indices`` must cover them all)."""
        self._every_env(indices, "set_attr")
        self._do("set_attr", attr_name, [value] * self.num_envs)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Call ``method_name`` on every env (``indices`` must cover them all)."""
        self._every_env(indices, "env_method")
        return list(self._do("call", method_name, *method_args, **method_kwargs))

    def env_is_wrapped(
        self,
        wrapper_class: type[gymnasium.Wrapper[Any, Any, Any, Any]],
        indices: VecEnvIndices = None,
    ) -> list[bool]:
        """Whether each env in ``indices`` is wrapped in ``wrapper_class``.

        Raises:
            NotImplementedError: On ``backend="process"``, whose envs live in
                workers (wrap the vector env in ``VecMonitor`` instead of
                checking for ``Monitor``).
        """
        try:
            envs = self.venv.envs
        except AttributeError as exc:
            raise NotImplementedError(
                "env_is_wrapped needs the env objects, which this backend "
                "keeps in its workers; wrap this VecEnv in VecMonitor rather than each env in "
                "Monitor"
            ) from exc
        return [is_wrapped(envs[i], wrapper_class) for i in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's ``render()`` frame."""
        return list(self._do("render"))

    # -- machinery -----------------------------------------------------------------

    def _do(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` on the blocking front end, or run it on the runner (await API)."""
        method = getattr(self.venv, name)
        if self._runner is None:
            return method(*args, **kwargs)
        return self._runner.run(_completed(method, args, kwargs))

    def _collect_sent(self) -> None:
        if self._sent:
            self._sent = False
            self._do("recv")

    def _ended(self, i: int, info: dict[str, Any]) -> dict[str, Any]:
        """SB3's info of env ``i``, which ended and was reset in this step."""
        self.reset_infos[i] = {k: v for k, v in info.items() if k not in _FINAL}
        ended = dict(info.get("final_info", {}))
        if "final_obs" in info:  # absent for an env restarted by on_error="restart"
            ended["terminal_observation"] = info["final_obs"]
        return ended

    def _every_env(self, indices: VecEnvIndices, method: str) -> None:
        if sorted(self._get_indices(indices)) != list(range(self.num_envs)):
            raise NotImplementedError(
                f"{method} with indices={indices!r}: aiovec calls every env at once, so "
                "only indices=None (or all of them) is supported"
            )

    def _get_indices(self, indices: VecEnvIndices) -> Iterable[int]:
        if isinstance(indices, np.integer):
            indices = int(indices)
        return super()._get_indices(indices)


async def _completed(method: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> Any:
    """``method(*args, **kwargs)``, awaited if it returns an awaitable (run on the loop)."""
    result = method(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result
