"""What the adapters share: infos per env, a factory's own error, per-env actions batched.

No third-party import here (only gymnasium and numpy, aiovec's own dependencies):
each adapter module imports its library, this one imports none.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array

from aiovec._errors import EnvError, LostWithWorkerError, describe_error
from aiovec._log import say_envs

__all__ = ("batch_per_env", "own_error", "per_env_values", "unbatch_infos")

_COMPOSITE = (spaces.Dict, spaces.Tuple)


def unbatch_infos(
    infos: dict[str, Any], num_envs: int, *, copy: bool = False
) -> list[dict[str, Any]]:
    """Gymnasium's vector infos (arrays with ``_key`` masks) as one dict per env.

    A key without a mask belongs to every env; nested dicts are unbatched too.

    Args:
        infos: A vector env's infos.
        num_envs: The number of envs (rows) the infos cover.
        copy: Deep-copy what an object array holds (``final_obs``, ``final_info``,
            any info value that is not a number): the very objects the envs
            returned, where they live in this process.  Numbers come out of
            arrays that batching made, so they are never an env's own.
    """
    per_env: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if isinstance(value, dict):
            values: Any = unbatch_infos(value, num_envs, copy=copy)
        elif copy and isinstance(value, np.ndarray) and value.dtype == object:
            values = [
                _copy.deepcopy(v) if mask is None or mask[i] else None for i, v in enumerate(value)
            ]
        else:
            values = value
        for i, env_info in enumerate(per_env):
            if mask is None or mask[i]:
                env_info[key] = values[i]
    return per_env


def own_error(error: EnvError, builder: str, adapter: str) -> BaseException:
    """The env's own exception, noted with its env, from aiovec's report of it.

    As the peers' in-process vector envs let it through.  ``builder`` names
    what built the envs (``"make_sb3_env"``), for a factory's exception, and
    ``adapter`` the adapter (``"SB3"``), for any other.  aiovec's own failures (a
    timeout, a worker that died, an env lost with its worker) stay
    `aiovec.EnvError`.
    """
    i = error.env_index
    cause = error.errors[i]
    if type(error) is not EnvError or isinstance(cause, LostWithWorkerError):
        return error
    if error.operation == f"env_fns[{i}]()":
        note = f"(raised by env_fns[{i}](), as {builder} built env {i})"
    else:
        note = f"(raised by env {i} in {error.operation}, under aiovec's {adapter} adapter)"
    others = [j for j in error.errors if j != i]
    if others:
        note += f"; {say_envs(others)} failed in that call too: " + "; ".join(
            f"env {j}: {describe_error(error.errors[j])}" for j in others[:_SHOWN]
        )
    cause.add_note(note)
    return cause


_SHOWN = 5
"""How many other failing envs the note of an env's own exception describes."""


def batch_per_env(space: spaces.Space[Any], actions: Any, count: int) -> Any:
    """``count`` per-env actions of a ``Dict``/``Tuple`` space, batched.

    Per-env actions come as a list, a tuple or an object array.

    Anything else (arrays, a dict of batched arrays) is returned as it is: it
    is aiovec's own input, checked there.

    Raises:
        ValueError: The actions are not one per env.
    """
    per_env = isinstance(actions, list | tuple) or (
        isinstance(actions, np.ndarray) and actions.dtype == object
    )
    if not per_env or not isinstance(space, _COMPOSITE):
        return actions
    if len(actions) != count:
        raise ValueError(
            f"actions must hold one action per env (num_envs={count}), got {len(actions)}"
        )
    batch = create_empty_array(space, count)
    assert batch is not None  # a Dict or Tuple space
    return concatenate(space, list(actions), batch)


def per_env_values(values: Sequence[Any]) -> np.ndarray:
    """Per-env values stacked along a first axis, or an object array where they do not stack."""
    try:
        return np.stack(values)
    except ValueError:  # shapes differ
        stacked = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            stacked[i] = value
        return stacked
