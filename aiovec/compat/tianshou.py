"""Tianshou adapter: an aiovec vector env as a Tianshou vector env.

Example:
    >>> from tianshou.data import Collector, VectorReplayBuffer  # doctest: +SKIP
    >>> from aiovec.compat.tianshou import make_tianshou_env
    >>> envs = make_tianshou_env([lambda: gymnasium.make("CartPole-v1")] * 8)
    >>> collector = Collector(policy, envs, VectorReplayBuffer(20_000, len(envs)))

Theory of operation
-------------------
Tianshou's ``BaseVectorEnv`` differs from gymnasium's vector API in the ways
below; the adapter translates each and keeps no rule of its own:

1. **Resets.**  Tianshou resets the envs that ended itself
   (``reset(env_id=ids)``) and never steps an env that ended: that is
   gymnasium's ``DISABLED`` autoreset, which the adapter requires
   (`make_tianshou_env` sets it); a reset of some envs is aiovec's
   ``reset_mask``.  Each env gets the options its caller gave, ``None`` when
   none: the vector env's reset-options hook answers ``None`` for every env,
   and a masked reset with no options of its own takes the hook's answer.
   ``reset(seed=s)`` seeds env ``i`` with ``s + i``, as ``seed(s)`` does.
2. **Subsets.**  ``step(actions, id)`` steps the envs ``id`` only, and
   returns their rows in that order; infos are an array of one dict per env,
   each with its ``env_id``.  Observations are stacked per env as Tianshou
   stacks them: arrays for array spaces, an object array of dicts for a
   ``Dict`` space.
3. **Asynchronous mode** (``wait_num``/``timeout``): ``step`` sends the
   actions of ``id`` and returns as soon as ``wait_num`` envs in flight have
   finished, or ``timeout`` seconds passed and at least one has: aiovec's
   ``send``/``recv``.  The envs still in flight are ``waiting_id``; the ready
   ones may be reset meanwhile (a masked reset amid sent envs).
4. **Actions.**  Tianshou's policies may hand ``Discrete`` (and
   ``MultiDiscrete``, ``MultiBinary``) actions as floats: whole numbers are
   cast to the space's dtype, anything else is refused before any env steps.
5. **Results the spaces do not describe.**  Tianshou stacks whatever each env
   returns; aiovec batches by the spaces.  `make_tianshou_env` runs each env
   behind a thin wrapper (where the env lives, worker processes included) that
   passes on, in the info, an observation that does not batch into its space
   and a reward that is not a number (a multi-agent reward array); the adapter
   puts them back in their rows.  Results that fit the spaces take aiovec's
   usual path (shared memory on the process backend).
6. **Spaces and attributes.**  ``action_space`` and ``observation_space`` are
   lists, one space per env; ``get_env_attr``/``set_env_attr`` are aiovec's
   ``get_attr``/``set_attr`` on the envs named.

The vector env is an `aiovec.BlockingVectorEnv`: Tianshou is synchronous code.
"""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, create_empty_array, iterate

from aiovec._blocking import BlockingVectorEnv
from aiovec._core.lifecycle import State
from aiovec._core.validate import describe, is_reward, observation_fits
from aiovec._errors import EnvError
from aiovec.compat._shared import batch_per_env, own_error, per_env_values, unbatch_infos

try:
    from tianshou.env import BaseVectorEnv
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        'aiovec.compat.tianshou needs Tianshou: pip install "aiovec[tianshou]"'
    ) from exc

__all__ = ("TianshouVectorEnv", "make_tianshou_env")

_RAW_OBS = "aiovec.tianshou.observation"
_RAW_REWARD = "aiovec.tianshou.reward"
_WHOLE = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)
_LOCAL = ("action_space", "observation_space")


def make_tianshou_env(
    env_fns: Sequence[Callable[[], Any]],
    *,
    backend: str = "inline",
    wait_num: int | None = None,
    timeout: float | None = None,
    **options: Any,
) -> TianshouVectorEnv:
    """Build an `aiovec.BlockingVectorEnv` for Tianshou and wrap it as Tianshou's vector env.

    Args:
        env_fns: Env factories, as for `aiovec.BlockingVectorEnv`
            (gymnasium envs or aiovec's async envs).
        backend: aiovec's backend (``"inline"`` for ``DummyVectorEnv``,
            ``"process"`` for ``SubprocVectorEnv``/``ShmemVectorEnv``, or
            ``"thread"``, ``"ray"``).
        wait_num: Tianshou's asynchronous mode: ``step`` returns once this
            many envs in flight are done (``None``: all of them).
        timeout: Tianshou's asynchronous mode: ``step`` returns after this
            many seconds with the envs done by then (at least one).
        **options: Any other argument of `aiovec.BlockingVectorEnv`, except
            ``autoreset_mode`` (Tianshou resets envs itself) and
            ``reset_options``.  ``observation_mode`` defaults to
            ``"different"`` (Tianshou stacks envs whose bounds differ), and
            ``check_observations`` to ``False`` (Tianshou's vector envs pass
            observations outside their space on).  On
            the process backend in asynchronous mode, ``num_workers``
            defaults to one worker per env, as ``SubprocVectorEnv`` has a
            process per env: a worker steps its sync envs one after another.

    Returns:
        The Tianshou vector env.

    Raises:
        Exception: A factory's own exception, as Tianshou's vector envs raise
            it (its note names the env), where aiovec raises `aiovec.EnvError`.
    """
    for taken in ("autoreset_mode", "reset_options"):
        if taken in options:
            raise TypeError(
                f"make_tianshou_env sets {taken} itself (Tianshou resets envs that ended itself)"
            )
    fns = list(env_fns) if isinstance(env_fns, Sequence) else env_fns
    if isinstance(fns, list) and all(callable(fn) for fn in fns):
        fns = [functools.partial(_conforming, fn) for fn in fns]
    options.setdefault("observation_mode", "different")
    options.setdefault("check_observations", False)
    asynchronous = wait_num is not None or timeout is not None
    if backend == "process" and asynchronous and isinstance(fns, list):
        options.setdefault("num_workers", len(fns))
    try:
        venv = BlockingVectorEnv(
            fns,  # checked there, as any vector env's factories
            backend=backend,
            autoreset_mode=AutoresetMode.DISABLED,
            reset_options=_no_options,
            **options,
        )
    except EnvError as error:
        raise own_error(error, "make_tianshou_env", "Tianshou") from None
    try:
        return TianshouVectorEnv(venv, wait_num=wait_num, timeout=timeout)
    except BaseException:
        venv.close()
        raise


def _no_options(env_id: int, episode: int) -> None:
    """The reset-options hook: no options of its own (a reset gets its caller's, or ``None``)."""
    return


class TianshouVectorEnv(BaseVectorEnv):
    """An `aiovec.BlockingVectorEnv` as Tianshou's vector env (``BaseVectorEnv``).

    Tianshou's ``Collector`` and ``AsyncCollector`` take it as they take
    ``DummyVectorEnv`` or ``SubprocVectorEnv``; see the module for what is
    translated.

    Args:
        venv: A `aiovec.BlockingVectorEnv` built with
            ``autoreset_mode=AutoresetMode.DISABLED`` and a reset-options hook
            (`make_tianshou_env` builds one).  The adapter owns it from now on.
        wait_num: Return from ``step`` once this many envs in flight are
            done (Tianshou's asynchronous mode; ``None``: all of them).
        timeout: Return from ``step`` after this many seconds with the envs
            done by then, at least one (asynchronous mode; ``None``: no limit).

    Raises:
        TypeError: ``venv`` is not a `aiovec.BlockingVectorEnv`.
        ValueError: ``venv`` autoresets, has no reset-options hook, or
            ``wait_num``/``timeout`` are out of range.
    """

    def __init__(
        self, venv: BlockingVectorEnv, wait_num: int | None = None, timeout: float | None = None
    ) -> None:
        # Tianshou's own __init__ builds workers: the envs live in aiovec's backend instead.
        if not isinstance(venv, BlockingVectorEnv):
            raise TypeError(
                "TianshouVectorEnv wraps an aiovec.BlockingVectorEnv, got "
                f"{type(venv).__name__}; or build one with make_tianshou_env(env_fns)"
            )
        if venv.autoreset_mode is not AutoresetMode.DISABLED or venv.reset_options is None:
            raise ValueError(
                "Tianshou resets the envs that ended itself: build the vector env with "
                "autoreset_mode=AutoresetMode.DISABLED and a reset_options hook (got "
                f"{venv.autoreset_mode}), or use make_tianshou_env(env_fns)"
            )
        num = venv.num_envs
        if wait_num is not None and not (
            isinstance(wait_num, int | np.integer) and 1 <= wait_num <= num
        ):
            raise ValueError(f"wait_num must be an int in [1, {num}] or None, got {wait_num!r}")
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout must be a positive number or None, got {timeout!r}")
        self.venv = venv
        self.env_num = num
        self.wait_num = int(wait_num or num)
        self.timeout = timeout
        self.is_async = self.wait_num != num or timeout is not None
        self.waiting_id: list[int] = []
        self.ready_id = list(range(num))
        self.is_closed = False
        # each env's own copy, so that seeding one env's sampler leaves the others alone
        self._spaces = {
            "action_space": [copy.deepcopy(venv.single_action_space) for _ in range(num)],
            "observation_space": list(venv.get_attr("observation_space")),
        }
        self._whole = isinstance(venv.single_action_space, _WHOLE)

    def __len__(self) -> int:
        """The number of envs."""
        return self.env_num

    def __enter__(self) -> TianshouVectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- Tianshou's API ---------------------------------------------------------------

    def reset(
        self, env_id: int | list[int] | np.ndarray | None = None, **kwargs: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reset the envs ``env_id`` (all when ``None``); their observations and infos.

        Args:
            env_id: An env index, a list or array of them, or ``None``.
            **kwargs: ``seed`` (``s``: env ``i`` gets ``s + i``; or one seed
                per env of ``env_id``) and ``options`` (every env of
                ``env_id`` gets them; ``None`` when not given).

        Returns:
            ``(obs, infos)``: rows in the order of ``env_id``; infos an array
            of dicts.
        """
        ids = self._ids(env_id)
        unknown = set(kwargs) - {"seed", "options"}
        if unknown:
            raise TypeError(
                f"reset() takes seed and options (passed to each env), got {sorted(unknown)}"
            )
        seed = self._seeds(kwargs.get("seed"), ids)
        options = kwargs.get("options")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict or None, got {describe(options)}")
        venv = self.venv
        if (len(ids) == self.env_num and not self.waiting_id) or venv.state is State.NEEDS_RESET:
            obs, infos = venv.reset(seed=seed, options=options)
        else:
            mask = np.zeros(self.env_num, np.bool_)
            mask[ids] = True
            obs, infos = venv.reset(seed=seed, options={**(options or {}), "reset_mask": mask})
        per_env = unbatch_infos(infos, self.env_num)
        rows = self._rows(obs, per_env, list(range(self.env_num)), ids)
        return rows, _dicts([per_env[i] for i in ids])

    def step(
        self,
        action: np.ndarray | Any | None,
        id: int | list[int] | np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step the envs ``id`` (all when ``None``) with ``action``, one row per env.

        In asynchronous mode the envs ``id`` are sent and the envs done by
        ``wait_num``/``timeout`` come back, ``action=None`` only waits; infos
        say each row's ``env_id``.

        Returns:
            ``(obs, rewards, terminated, truncated, infos)``.

        Raises:
            ValueError: A whole-number action space got an action that is not
                a whole number, or not one action per env.
        """
        ids = self._ids(id)
        venv = self.venv
        if venv.state is State.NEEDS_RESET:  # Tianshou steps envs never reset: reset them first
            self.reset()
        if action is None:
            if not self.is_async:
                raise ValueError("action must not be None for a vector env that is not async")
        else:
            actions = self._actions(action, ids)
            if not self.is_async and ids == list(range(self.env_num)):
                return self._result(venv.step(actions), ids, ids)
            venv.send(actions, ids)
            self.waiting_id += ids
        return self._receive(ids if not self.is_async else None)

    def seed(self, seed: int | list[int] | None = None) -> list[list[int] | None]:
        """Seed every env and its action space sampler: reset each env with its seed.

        ``None`` leaves them alone; an int ``s`` seeds env ``i`` with ``s + i``;
        a list gives each env its own.  Tianshou's workers reset an env to seed
        it; so does this.
        """
        seeds = self._seeds(seed, list(range(self.env_num)))
        per_env = seeds if isinstance(seeds, list) else [seeds] * self.env_num
        if isinstance(seeds, int | np.integer):
            per_env = [int(seeds) + i for i in range(self.env_num)]
        for space, s in zip(self._spaces["action_space"], per_env, strict=True):
            space.seed(s)
        self.venv.reset(seed=seeds)
        return [[s] if s is not None else None for s in per_env]

    def render(self, **kwargs: Any) -> list[Any]:
        """Each env's frame (``kwargs`` are not taken: gymnasium's envs render without)."""
        if kwargs:
            raise TypeError(f"render() takes no arguments (gymnasium envs), got {sorted(kwargs)}")
        return list(self.venv.render())

    def close(self) -> None:
        """Close every env and the vector env (a second close does nothing).

        Steps still in flight (asynchronous mode) are cancelled without a
        warning, as Tianshou's vector envs drop them.
        """
        self.is_closed = True
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Calling `close` while waiting", UserWarning)
            self.venv.close()

    def get_env_attr(
        self,
        key: str,
        id: int | list[int] | np.ndarray | None = None,
    ) -> list[Any]:
        """Attribute ``key`` of the envs ``id`` (all when ``None``), in that order."""
        ids = self._ids(id)
        if key in _LOCAL:
            return [self._spaces[key][i] for i in ids]
        return list(self.venv.get_attr(key, env_ids=ids))

    def set_env_attr(
        self,
        key: str,
        value: Any,
        id: int | list[int] | np.ndarray | None = None,
    ) -> None:
        """Set attribute ``key`` to ``value`` on the envs ``id`` (all when ``None``)."""
        ids = self._ids(id)
        self.venv.set_attr(key, [value] * len(ids), env_ids=ids)

    # -- machinery ---------------------------------------------------------------------

    def _ids(self, env_id: int | list[int] | np.ndarray | None) -> list[int]:
        """Tianshou's ``id``: ``None`` (all), an index, or a list or array of them."""
        if env_id is None:
            return list(range(self.env_num))
        if np.isscalar(env_id):
            return [int(env_id)]  # type: ignore[arg-type]
        return [int(i) for i in env_id]  # type: ignore[union-attr]

    def _seeds(self, seed: Any, ids: list[int]) -> Any:
        """A seed for aiovec: ``None``, an int (env ``i``: ``seed + i``), or one per env."""
        if seed is None or isinstance(seed, int | np.integer):
            return seed
        if not isinstance(seed, Sequence | np.ndarray) or len(seed) != len(ids):
            raise ValueError(
                f"seed must be an int, None, or one seed per env reset ({len(ids)}), "
                f"got {describe(seed)}"
            )
        full: list[int | None] = [None] * self.env_num
        for i, s in zip(ids, seed, strict=True):
            full[i] = s
        return full

    def _actions(self, action: Any, ids: list[int]) -> Any:
        """Tianshou's actions for the envs ``ids``, as aiovec takes them."""
        space = self.venv.single_action_space
        action = batch_per_env(space, action, len(ids))
        if not self._whole:
            return action
        array = np.asarray(action)
        if array.dtype.kind == "f":
            whole = np.isfinite(array) & (array == np.round(array))
            if not whole.all():
                row = int(np.argwhere(~whole)[0][0]) if array.ndim else 0
                env = ids[row] if row < len(ids) else row
                raise ValueError(
                    f"actions of a {space} space must be whole numbers: env {env} got "
                    f"{array[row] if array.ndim else array} (a float action is cast to "
                    f"{space.dtype} only when it is a whole number)"
                )
            return array.astype(space.dtype)
        return action

    def _receive(
        self, ids: list[int] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The envs sent (``ids`` in that order, or those done in asynchronous mode)."""
        venv, waiting = self.venv, len(self.waiting_id)
        if ids is not None:
            got = venv.recv(min_envs=waiting)
        else:
            got = venv.recv(min_envs=min(self.wait_num, waiting), timeout=self.timeout)
            if len(got[-1]) == 0:  # the timeout passed with none done: wait for one
                got = venv.recv(min_envs=1)
        done = got[-1].tolist()
        if ids is None:  # Tianshou's order: the order they were sent in
            ids = [i for i in self.waiting_id if i in done]
        self.waiting_id = [i for i in self.waiting_id if i not in done]
        self.ready_id = [i for i in range(self.env_num) if i not in self.waiting_id]
        return self._result(got[:5], done, ids)

    def _result(
        self, batch: tuple[Any, ...], rows: list[int], ids: list[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A step's ``batch`` whose rows are the envs ``rows``, as Tianshou wants envs ``ids``."""
        obs, rewards, terminated, truncated, infos = batch
        per_env = unbatch_infos(infos, len(rows))
        where = {env: k for k, env in enumerate(rows)}
        order = [where[i] for i in ids]
        stacked = self._rows(obs, per_env, rows, ids)
        raw = [per_env[k].pop(_RAW_REWARD, None) for k in order]
        if any(r is not None for r in raw):
            rew: np.ndarray = per_env_values(
                [rewards[k] if r is None else r for k, r in zip(order, raw, strict=True)]
            )
        else:
            rew = rewards[order]
        for k, i in zip(order, ids, strict=True):
            per_env[k]["env_id"] = i
        return (
            stacked,
            rew,
            terminated[order],
            truncated[order],
            _dicts([per_env[k] for k in order]),
        )

    def _rows(
        self, obs: Any, per_env: list[dict[str, Any]], rows: list[int], ids: list[int]
    ) -> np.ndarray:
        """The observations of envs ``ids`` (the batch's rows are envs ``rows``), per env.

        ``per_env`` are the rows' infos: an observation the wrapper passed on
        there replaces its row (and leaves the info).
        """
        where = {env: k for k, env in enumerate(rows)}
        order = [where[i] for i in ids]
        raw = {k: per_env[k].pop(_RAW_OBS) for k in order if _RAW_OBS in per_env[k]}
        if isinstance(obs, np.ndarray) and not raw:
            return obs[order]
        values = list(iterate(self.venv.observation_space, obs))
        return per_env_values([raw[k] if k in raw else values[k] for k in order])


def _dicts(infos: list[dict[str, Any]]) -> np.ndarray:
    """A list of dicts as an array of dicts (Tianshou's infos)."""
    array = np.empty(len(infos), dtype=object)
    for i, info in enumerate(infos):
        array[i] = info
    return array


# -- the wrapper: results the spaces do not describe travel in the info -----------------


def _conforming(fn: Callable[[], Any]) -> Any:
    """``fn()`` behind the wrapper that passes on what its spaces do not describe."""
    env = fn()
    if inspect.isawaitable(env):
        return _awaited(env)
    return _wrap(env)


async def _awaited(env: Any) -> Any:
    return _wrap(await env)


def _wrap(env: Any) -> Any:
    space = getattr(env, "observation_space", None)
    if not isinstance(space, spaces.Space):
        return env  # refused by the vector env, in its words
    if inspect.iscoroutinefunction(getattr(env, "step", None)):
        return _AsyncConforming(env)
    return _Conforming(env)


class _Results:
    """What one env returns, made to fit its spaces (the rest goes in the info)."""

    def __init__(self, space: spaces.Space[Any]) -> None:
        self.fits = observation_fits(space)
        placeholder = create_empty_array(space, 1, fn=np.zeros)
        self.placeholder = next(iter(iterate(batch_space(space, 1), placeholder)))

    def observation(self, obs: Any, info: Any) -> tuple[Any, Any]:
        if self.fits(obs) or not isinstance(info, dict):
            return obs, info
        return self.placeholder, {**info, _RAW_OBS: obs}

    def step(self, result: Any) -> Any:
        obs, reward, terminated, truncated, info = result
        obs, info = self.observation(obs, info)
        if not is_reward(reward) and isinstance(info, dict):
            reward, info = 0.0, {**info, _RAW_REWARD: reward}
        return obs, reward, terminated, truncated, info


class _Conforming(gymnasium.Wrapper[Any, Any, Any, Any]):
    """A gymnasium env whose results fit its spaces (see `_Results`)."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        super().__init__(env)
        self._results = _Results(env.observation_space)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The env's reset, its observation made to fit."""
        obs, info = self.env.reset(seed=seed, options=options)
        return self._results.observation(obs, info)

    def step(self, action: Any) -> Any:
        """The env's step, its observation and reward made to fit."""
        return self._results.step(self.env.step(action))


class _AsyncConforming:
    """An async env whose results fit its spaces (see `_Results`); the rest is the env's."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._results = _Results(env.observation_space)

    async def reset(self, **kwargs: Any) -> tuple[Any, Any]:
        obs, info = await self.env.reset(**kwargs)
        return self._results.observation(obs, info)

    async def step(self, action: Any) -> Any:
        return self._results.step(await self.env.step(action))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)
