"""Argument checks: every bad input is refused here, before any env is touched.

Each function takes what the user gave and returns the normalised value, or
raises ``TypeError``/``ValueError`` naming the argument, what was expected and
what came.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from aiovec._errors import SpacesDifferError

__all__ = (
    "BACKENDS",
    "DICT_TYPES",
    "FLAG_TYPES",
    "OBSERVATION_MODES",
    "ON_ERROR",
    "REWARD_TYPES",
    "SHARED_LIMITER_BACKENDS",
    "ObservationMode",
    "StepChecker",
    "action_checker",
    "check_actions",
    "check_autoreset_mode",
    "check_backend_options",
    "check_bool_or_none",
    "check_choice",
    "check_distinct_envs",
    "check_env_fns",
    "check_env_ids",
    "check_max_concurrency",
    "check_min_envs",
    "check_num_workers",
    "check_observation_mode",
    "check_options",
    "check_seeds",
    "check_spaces",
    "check_timeout",
    "check_values",
    "describe",
    "is_reward",
    "observation_fits",
    "reset_result_checker",
    "step_result_checker",
)

BACKENDS = ("inline", "thread", "process", "ray", "remote")
SHARED_LIMITER_BACKENDS = ("inline", "thread")
"""The backends that may take a shared ``anyio.CapacityLimiter`` as ``max_concurrency``."""
ON_ERROR = ("raise", "restart")


def describe(value: object) -> str:
    """A short description of a value for error messages."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def _looks_like_env(value: object) -> bool:
    """An env object (not an env class, which is a fine factory)."""
    return not isinstance(value, type) and hasattr(value, "step") and hasattr(value, "reset")


def check_env_fns(env_fns: object) -> list[Callable[[], Any]]:
    """``env_fns``: a non-empty sequence of zero-argument callables that build envs."""
    if _looks_like_env(env_fns):
        raise TypeError(
            f"env_fns must be a sequence of zero-argument callables that build envs, got an env "
            f"({type(env_fns).__name__}) itself; pass factories instead, e.g. "
            f"`[make_env] * n` or `[lambda: MyEnv() for _ in range(n)]`"
        )
    if callable(env_fns) or not isinstance(env_fns, Sequence) or isinstance(env_fns, str | bytes):
        raise TypeError(
            f"env_fns must be a sequence (list or tuple) of zero-argument callables, got "
            f"{describe(env_fns)}; wrap a single factory in a list: `[make_env] * n`"
        )
    if len(env_fns) == 0:
        raise ValueError("env_fns must hold at least one env factory, got an empty sequence")
    for i, fn in enumerate(env_fns):
        if _looks_like_env(fn):
            raise TypeError(
                f"env_fns[{i}] is an env ({type(fn).__name__}), not a factory; pass "
                f"`lambda: {type(fn).__name__}(...)` so that each vector env builds its own"
            )
        if not callable(fn):
            raise TypeError(f"env_fns[{i}] must be a zero-argument callable, got {describe(fn)}")
    return list(env_fns)


def check_autoreset_mode(mode: object) -> AutoresetMode:
    """``autoreset_mode``: an ``AutoresetMode`` or its string value."""
    if isinstance(mode, AutoresetMode):
        return mode
    try:
        return AutoresetMode(mode)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in AutoresetMode)
        raise ValueError(
            f"autoreset_mode must be a gymnasium AutoresetMode or one of {allowed}, "
            f"got {describe(mode)}"
        ) from None


def check_choice(name: str, value: object, allowed: Sequence[str]) -> str:
    """A string option out of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {options}, got {describe(value)}")
    return value


def check_timeout(name: str, value: object) -> float | None:
    """A positive number of seconds, or ``None`` for no limit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a positive number of seconds or None, got {describe(value)}"
        )
    seconds = float(value)
    if not seconds > 0 or math.isinf(seconds) or math.isnan(seconds):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return seconds


def check_bool_or_none(name: str, value: object) -> bool | None:
    """A ``True``/``False``/``None`` option."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be True, False or None, got {describe(value)}")
    return value


def check_backend_options(
    value: object, backend: str, allowed: frozenset[str]
) -> dict[str, Any] | None:
    """``backend_options``: ``None`` or a mapping of the options ``backend`` takes."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"backend_options must be a dict or None, got {describe(value)}")
    if not value:
        return None
    if not allowed:
        raise ValueError(
            f"backend_options are not taken by backend={backend!r} (backend='ray' takes Ray "
            f"actor options such as num_cpus, backend='process' takes cpus), got {dict(value)!r}"
        )
    unknown = sorted(map(str, set(value) - allowed))
    if unknown:
        raise ValueError(
            f"backend_options has unknown option(s) {', '.join(unknown)} for "
            f"backend={backend!r}; expected some of: {', '.join(sorted(allowed))}"
        )
    return dict(value)


def check_cpus(value: object) -> tuple[int, ...] | str | None:
    """``backend_options["cpus"]``: ``"auto"``, ``None``, or CPU ids this process may run on."""
    if value is None:
        return None
    if value == "auto":
        return "auto"
    name = 'backend_options["cpus"]'
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(
            f'{name} must be "auto", None or a sequence of CPU ids, got {describe(value)}'
        )
    if not value:
        raise ValueError(f"{name} must name at least one CPU, got {value!r}")
    for cpu in value:
        if isinstance(cpu, bool) or not isinstance(cpu, numbers.Integral):
            raise TypeError(f"{name} must hold ints (CPU ids), got {describe(cpu)}")
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"{name} needs os.sched_setaffinity, which this platform lacks")
    allowed = os.sched_getaffinity(0)
    outside = sorted({int(cpu) for cpu in value} - allowed)
    if outside:
        raise ValueError(
            f"{name} has CPU(s) {outside} that this process may not run on; "
            f"it may run on {sorted(allowed)}"
        )
    return tuple(int(cpu) for cpu in value)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def check_num_workers(value: object, num_envs: int) -> int | None:
    """``num_workers``: ``None`` or a positive int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"num_workers must be a positive int or None, got {describe(value)}")
    if int(value) < 1:
        raise ValueError(f"num_workers must be at least 1, got {value!r}")
    return min(int(value), num_envs)


def _check_seed(name: str, seed: object) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 0 or None, got {describe(seed)}")
    if int(seed) < 0:
        raise ValueError(f"{name} must be an int >= 0 or None, got {seed!r}")
    return int(seed)


def check_seeds(seed: object, num_envs: int) -> list[int | None]:
    """``seed``: ``None``, an int (env i gets ``seed + i``) or one seed per env."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        base = _check_seed("seed", seed)
        assert base is not None
        return [base + i for i in range(num_envs)]
    if isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str | bytes):
        if len(seed) != num_envs:
            raise ValueError(
                f"seed must be an int, None, or a list of num_envs={num_envs} seeds, "
                f"got a list of length {len(seed)}"
            )
        return [_check_seed(f"seed[{i}]", s) for i, s in enumerate(seed)]
    raise TypeError(f"seed must be an int, None, or a list of seeds, got {describe(seed)}")


def check_options(
    options: object, num_envs: int
) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """``options``: ``None`` or a dict; ``reset_mask`` is taken out and checked.

    A mask's errors are gymnasium's, word for word (its tests pin them).  A
    mask of all True is a full reset, as in gymnasium: it is allowed where a
    full reset is (before the first reset, after a failure).

    Returns:
        The options to pass to each env (the caller's dict is never modified)
        and the reset mask, or ``None`` when every env is reset.
    """
    if options is None:
        return None, None
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict or None, got {describe(options)}")
    if "reset_mask" not in options:
        return dict(options), None
    mask = options["reset_mask"]
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(
            f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}"
        )
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True "
            f"value, got reset_mask={mask}"
        )
    rest = {k: v for k, v in options.items() if k != "reset_mask"}
    return rest, None if mask.all() else mask.copy()


def check_env_ids(env_ids: object, num_envs: int) -> list[int]:
    """``env_ids``: distinct env indices (``None`` means every env)."""
    if env_ids is None:
        return list(range(num_envs))
    ids = np.asarray(env_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(f"env_ids must be a 1-D sequence of env indices, got {describe(env_ids)}")
    if ids.size == 0:
        raise ValueError("env_ids must name at least one env, got an empty sequence")
    found = [int(i) for i in ids.tolist()]
    bad = [i for i in found if not 0 <= i < num_envs]
    if bad:
        raise ValueError(f"env_ids must be in range(num_envs={num_envs}), got {bad}")
    if len(set(found)) != len(found):
        raise ValueError(f"env_ids must be distinct, got {found}")
    return found


def check_min_envs(min_envs: object, in_flight: int) -> int:
    """``min_envs`` for ``recv``: 1..(envs in flight); ``None`` means all of them."""
    if min_envs is None:
        return in_flight
    if isinstance(min_envs, bool) or not isinstance(min_envs, numbers.Integral):
        raise TypeError(f"min_envs must be an int or None, got {describe(min_envs)}")
    if not 1 <= int(min_envs) <= in_flight:
        raise ValueError(
            f"min_envs must be between 1 and the {in_flight} env(s) in flight, got {min_envs}"
        )
    return int(min_envs)


def check_max_concurrency(value: object, backend: str = "inline") -> Any:
    """``max_concurrency``: ``None``, an int >= 1, or a limiter (``anyio.CapacityLimiter``).

    A limiter (which may be shared by several vector envs) only where the envs'
    calls start in this process (`SHARED_LIMITER_BACKENDS`): a worker process
    or a Ray actor cannot take a token from it.  Returns the int, or the
    limiter as it is; the caller makes a limiter of an int.
    """
    if value is None:
        return None
    if hasattr(value, "acquire_on_behalf_of_nowait") and hasattr(value, "release_on_behalf_of"):
        if backend not in SHARED_LIMITER_BACKENDS:
            raise ValueError(
                f"max_concurrency cannot be a shared {type(value).__name__} with "
                f"backend={backend!r}: its limit holds in this process only, and the "
                f"{backend} backend's envs run in workers of their own; pass an int "
                "instead (max_concurrency=K: at most K env calls at once across this "
                "vector env's workers), or use backend 'inline' or 'thread' to share a "
                "limiter between vector envs"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"max_concurrency must be an int >= 1, an anyio.CapacityLimiter or None, "
            f"got {describe(value)}"
        )
    if int(value) < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {value!r}")
    return int(value)


def check_values(values: object, num_envs: int, count_of: str = "") -> list[Any]:
    """``set_attr`` values: one per env as a list/tuple, or one value for all.

    ``count_of`` names what ``num_envs`` counts when it is not every env
    (``"len(env_ids)"``).
    """
    if not isinstance(values, list | tuple):
        return [values] * num_envs
    if len(values) != num_envs:
        raise ValueError(
            f"values must be a list or tuple of {count_of or 'num_envs'}={num_envs} values "
            f"(or a single value), got length {len(values)}"
        )
    return list(values)


_INT_KINDS = "iu"
_KINDS: dict[type[spaces.Space[Any]], tuple[str, str]] = {
    spaces.Box: ("biuf", "numbers"),
    spaces.Discrete: (_INT_KINDS, "integers"),
    spaces.MultiDiscrete: (_INT_KINDS, "integers"),
    spaces.MultiBinary: ("biu", "integers or bools"),
}


def check_actions(space: spaces.Space[Any], actions: object, num_envs: int, path: str) -> None:
    """Check a batch of actions against the *single* action space (see `action_checker`)."""
    action_checker(space, num_envs, path)(actions)


def action_checker(
    space: spaces.Space[Any], num_envs: int, path: str = "actions"
) -> Callable[[object], None]:
    """A function checking batches of actions for ``space`` (built once per vector env).

    Shapes and dtypes are checked for the fundamental spaces (recursively
    through Dict and Tuple); other spaces only need one action per env.
    Values are not checked against bounds, as gymnasium does not.
    """
    if isinstance(space, spaces.Dict):
        return _dict_checker(space.spaces, num_envs, path)
    if isinstance(space, spaces.Tuple):
        return _tuple_checker(space.spaces, num_envs, path)
    kinds = _KINDS.get(type(space))
    if kinds is None:
        return lambda actions: _check_length(actions, num_envs, path)
    expected = (num_envs, *(space.shape or ()))
    allowed, words = kinds

    def check(actions: object) -> None:
        array = np.asarray(actions)
        if array.shape != expected:
            if not array.ndim:  # one action for the whole batch: the wrong type, as gymnasium
                raise TypeError(f"{path} must be a batch of shape {expected}, got a scalar")
            hint = ""
            if array.shape[0] != num_envs:
                hint = f" (one action per env: num_envs={num_envs})"
            raise ValueError(f"{path} must have shape {expected}{hint}, got {array.shape}")
        if array.dtype.kind not in allowed:
            raise TypeError(
                f"{path} for a {type(space).__name__} action space must hold {words}, "
                f"got dtype {array.dtype}"
            )

    return check


def _dict_checker(
    parts: Mapping[str, spaces.Space[Any]], num_envs: int, path: str
) -> Callable[[object], None]:
    subs = {k: action_checker(sub, num_envs, f"{path}[{k!r}]") for k, sub in parts.items()}

    def check(actions: object) -> None:
        if not isinstance(actions, Mapping):
            raise TypeError(f"{path} must be a dict of batched actions, got {describe(actions)}")
        if set(actions) != set(subs):
            raise ValueError(f"{path} must have keys {sorted(subs)}, got keys {sorted(actions)}")
        for key, sub in subs.items():
            sub(actions[key])

    return check


def _tuple_checker(
    parts: Sequence[spaces.Space[Any]], num_envs: int, path: str
) -> Callable[[object], None]:
    subs = [action_checker(sub, num_envs, f"{path}[{k}]") for k, sub in enumerate(parts)]

    def check(actions: object) -> None:
        if not isinstance(actions, tuple | list) or len(actions) != len(subs):
            raise TypeError(
                f"{path} must be a tuple of {len(subs)} batched actions, got {describe(actions)}"
            )
        for sub, part in zip(subs, actions, strict=True):
            sub(part)

    return check


def _check_length(actions: object, num_envs: int, path: str) -> None:
    try:
        length = len(actions)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{path} must hold one action per env (num_envs={num_envs}), got {describe(actions)}"
        ) from None
    if length != num_envs:
        raise ValueError(f"{path} must hold num_envs={num_envs} actions, got {length}")


OBSERVATION_MODES = ("same", "different")

ObservationMode = str | tuple[spaces.Space[Any], spaces.Space[Any]]


def check_observation_mode(mode: object) -> ObservationMode:
    """``observation_mode``, as gymnasium's vector envs take it.

    ``"same"`` (every env has env 0's observation space), ``"different"``
    (spaces of one shape and dtype, bounds of their own: batched by gymnasium's
    ``batch_differing_spaces``) or a tuple ``(observation_space,
    single_observation_space)`` given as is.
    """
    if isinstance(mode, tuple) and len(mode) == 2:
        if not all(isinstance(space, spaces.Space) for space in mode):
            raise TypeError(
                "observation_mode as a tuple must be (observation_space, "
                f"single_observation_space), two gymnasium Spaces, got {describe(mode)}"
            )
        return mode
    if isinstance(mode, str) and mode in OBSERVATION_MODES:
        return mode
    # the words of gymnasium's own refusal, which code written for it may match
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and "
        f"batch observation space, actual got {mode}"
    )


def check_spaces(
    observation_spaces: Sequence[spaces.Space[Any]],
    action_spaces: Sequence[spaces.Space[Any]],
    observation_mode: ObservationMode = "same",
) -> tuple[spaces.Space[Any], spaces.Space[Any]]:
    """The envs' spaces must agree as ``observation_mode`` says; the lowest mismatch is named.

    Every env must have env 0's action space.  Its observation space must be
    env 0's (``"same"``), or of the same shape and dtype as env 0's
    (``"different"``) or as the single space given (a tuple).

    Returns:
        ``(single_observation_space, observation_space)``: the single and the
        batched observation space.

    Raises:
        TypeError: A space is not a gymnasium Space.
        SpacesDifferError: The spaces differ (a ``ValueError`` and, as
            gymnasium's vector envs raise there, a ``RuntimeError``).
    """
    for i, pair in enumerate(zip(observation_spaces, action_spaces, strict=True)):
        for kind, space in zip(("observation_space", "action_space"), pair, strict=True):
            if not isinstance(space, spaces.Space):
                raise TypeError(
                    f"env {i}'s {kind} must be a gymnasium Space, got {describe(space)}"
                )
    first = action_spaces[0]
    for i, space in enumerate(action_spaces):
        if space != first:
            raise SpacesDifferError(
                f"all envs must share one action_space: env {i} has {space} but env 0 has {first}"
            )
    if isinstance(observation_mode, tuple):
        batched, single = observation_mode
        _check_shapes(observation_spaces, single, "the single observation space given")
        return single, batched
    single = observation_spaces[0]
    if observation_mode == "same":
        for i, space in enumerate(observation_spaces):
            if space != single:
                raise SpacesDifferError(
                    f"all envs must share one observation_space (observation_mode='same'): env "
                    f"{i} has {space} but env 0 has {single}; the sub-environments observation "
                    "spaces are not equivalent. If this is intentional, use "
                    "`observation_mode='different'` instead (spaces of one shape and dtype)"
                )
        return single, batch_space(single, len(observation_spaces))
    _check_shapes(observation_spaces, single, "env 0's")
    return single, batch_differing_spaces(observation_spaces)


def _check_shapes(
    observation_spaces: Sequence[spaces.Space[Any]], single: spaces.Space[Any], whose: str
) -> None:
    """Every observation space has the shape and dtype of ``single`` (``whose`` it is)."""
    for i, space in enumerate(observation_spaces):
        if not is_space_dtype_shape_equiv(space, single):
            raise SpacesDifferError(
                f"observation_mode='different' (or a tuple of spaces) batches spaces of one "
                f"shape and dtype: env {i} has {space}, {whose} is {single}"
            )


def check_distinct_envs(envs: Sequence[Any], first: int = 0) -> None:
    """Each factory must have built an env of its own; ``envs[0]`` is env ``first``.

    Two "envs" that are one object would step together, each step stepping both.
    Envs are compared unwrapped (``env.unwrapped`` where there is one), as SB3's
    vec envs compare them: new wrappers around one env are still one env.
    """
    seen: dict[int, int] = {}
    for j, env in enumerate(envs):
        inner = _unwrapped(env)
        earlier = seen.setdefault(id(inner), j)
        if earlier != j:
            raise ValueError(
                f"env_fns[{first + earlier}]() and env_fns[{first + j}]() returned the same env "
                f"object ({type(inner).__name__}); each factory must build a new env "
                "(e.g. `lambda: make_env()`, not `lambda: env`)"
            )


def _unwrapped(env: Any) -> Any:
    try:
        inner = env.unwrapped
    except Exception:  # no such attribute, or one that fails: the env is its own
        return env
    return env if inner is None else inner


# --------------------------------------------------------------------------- env results

REWARD_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})
"""The reward types taken as they are (a worker writes them straight into shared rows)."""
FLAG_TYPES = frozenset({bool, np.bool_})
"""The ``terminated``/``truncated`` types taken as they are."""
DICT_TYPES = frozenset({dict})
"""The info types taken as they are."""
_NDARRAYS = frozenset({np.ndarray})
_INTS = frozenset({int, np.int64})
_ARRAYS = (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")

AllFit = Callable[[Sequence[Any]], bool]


def step_result_checker(observation_space: spaces.Space[Any]) -> StepChecker:
    """A `StepChecker`: it finds the malformed step results among transitions by env."""
    return StepChecker(observation_space)


Columns = tuple[tuple[Any, ...], ...]
"""A step's transitions transposed: observations, rewards, terminations, truncations,
infos and finals, each a tuple in the transitions' order."""


class StepChecker:
    """Finds the malformed step results among transitions by env.

    A transition is malformed when its observation does not batch into
    ``observation_space`` (wrong shape, a dtype that ``same_kind`` casting
    refuses), its reward is not a real number, a flag is not a bool, or its
    info is not a dict.  The common case (exact types, the space's own shape
    and dtype in every env) is recognised for the whole batch at once, at C
    speed (``frozenset.issuperset`` over ``map``; a ``Box`` space's
    observations stacked by ``np.asarray`` and the stack's shape and dtype
    compared); only a batch that misses it is looked at env by env, and a
    result that merely differs (a list observation, a float64 one for a
    float32 space) passes, as the batcher accepts it.

    What the whole-batch test made (the transitions transposed, a ``Box``
    space's observations stacked) is kept for the batcher, which would make
    it again: `clean_columns` hands it over once.

    Args:
        observation_space: The single observation space.
    """

    __slots__ = ("_all_fit", "_box", "_clean", "_space")

    def __init__(self, observation_space: spaces.Space[Any]) -> None:
        self._space = observation_space
        self._all_fit = _all_fit(observation_space)
        self._box: tuple[tuple[int, ...], Any] | None = None
        if type(observation_space) is spaces.Box:
            self._box = (observation_space.shape, observation_space.dtype)
        self._clean: tuple[Mapping[int, Any], tuple[int, ...], Columns, Any] | None = None

    def __call__(self, transitions: Mapping[int, Any]) -> dict[int, Exception]:
        """``{env: ValueError or TypeError}`` for the malformed transitions (empty: none)."""
        self._clean = None
        if not transitions:
            return {}
        columns = tuple(zip(*transitions.values(), strict=True))
        obs, rewards, terminations, truncations, infos, _ = columns
        if (
            REWARD_TYPES.issuperset(map(type, rewards))
            and FLAG_TYPES.issuperset(map(type, terminations))
            and FLAG_TYPES.issuperset(map(type, truncations))
            and DICT_TYPES.issuperset(map(type, infos))
        ):
            stacked = self._stacked(obs) if self._box is not None else None
            if stacked is not None or (self._box is None and self._all_fit(obs)):
                self._clean = (transitions, tuple(transitions), columns, stacked)
                return {}
        return _refused(transitions, _check_step_result, self._space)

    def forget(self) -> None:
        """Drop what the last check made (results of it were refused since)."""
        self._clean = None

    def _stacked(self, obs: tuple[Any, ...]) -> np.ndarray | None:
        """A ``Box`` space's observations stacked, if each is an array of its shape and dtype."""
        assert self._box is not None
        shape, dtype = self._box
        if not _NDARRAYS.issuperset(map(type, obs)):
            return None
        try:
            stacked = np.asarray(obs)
        except ValueError:  # shapes differ
            return None
        if stacked.dtype != dtype or stacked.shape != (len(obs), *shape):
            return None
        return stacked

    def clean_columns(
        self, transitions: Mapping[int, Any], order: tuple[int, ...]
    ) -> tuple[Columns, Any] | None:
        """What the last check made of ``transitions``, if they were clean and are in ``order``.

        Returns ``(columns, stacked)`` (``stacked``: a ``Box`` space's
        observations, a new array; else ``None``) once, and only for the very
        mapping checked last, with the envs of ``order`` in that order (a
        mapping that gained envs since, a restart's rows, is not).
        """
        clean, self._clean = self._clean, None
        if clean is None or clean[0] is not transitions or clean[1] != order:
            return None
        return clean[2], clean[3]


def reset_result_checker(
    observation_space: spaces.Space[Any],
) -> Callable[[Mapping[int, Any]], dict[int, Exception]]:
    """`step_result_checker` for reset results: ``(observation, info)`` pairs by env.

    A pair is malformed when it is not a pair, its info is not a dict or its
    observation does not batch into ``observation_space``.
    """
    all_fit = _all_fit(observation_space)

    def check(results: Mapping[int, Any]) -> dict[int, Exception]:
        if not results:
            return {}
        pairs = results.values()
        if all(type(pair) is tuple and len(pair) == 2 for pair in pairs):
            obs, infos = zip(*pairs, strict=True)
            if DICT_TYPES.issuperset(map(type, infos)) and all_fit(obs):
                return {}
        return _refused(results, _check_reset_result, observation_space)

    return check


def _refused(
    results: Mapping[int, Any],
    check_one: Callable[[spaces.Space[Any], Any], None],
    space: spaces.Space[Any],
) -> dict[int, Exception]:
    """``{env: error}`` of the results that ``check_one(space, result)`` refuses, env by env."""
    bad: dict[int, Exception] = {}
    for i, result in results.items():
        try:
            check_one(space, result)
        except (TypeError, ValueError) as exc:
            bad[i] = exc
    return bad


def _check_reset_result(space: spaces.Space[Any], pair: Any) -> None:
    """Raise ``TypeError``/``ValueError`` saying what is wrong with one env's reset result."""
    try:
        obs, info = pair
    except (TypeError, ValueError):
        raise TypeError(
            f"the reset result must be a pair (observation, info), got {describe(pair)}"
        ) from None
    if not isinstance(info, dict):
        raise TypeError(f"the reset result's info must be a dict, got {describe(info)}")
    _check_observation(space, obs, "the reset result's observation")


def observation_fits(space: spaces.Space[Any]) -> Callable[[Any], bool]:
    """A test of one observation: whether it batches into ``space`` (the step checker's rule)."""
    all_fit = _all_fit(space)

    def fits(obs: Any) -> bool:
        if all_fit((obs,)):
            return True
        try:
            _check_observation(space, obs, "observation")
        except (TypeError, ValueError):
            return False
        return True

    return fits


def _all_fit(space: spaces.Space[Any]) -> AllFit:
    """A quick test that observations are exactly what ``space`` batches (never a false yes)."""
    if isinstance(space, _ARRAYS):
        shapes, dtypes = frozenset({space.shape}), frozenset({id(space.dtype)})
        return lambda obs: (
            _NDARRAYS.issuperset(map(type, obs))
            and shapes.issuperset(map(_shape, obs))
            and dtypes.issuperset(map(id, map(_dtype, obs)))  # builtin dtypes are singletons
        )
    if isinstance(space, spaces.Discrete):
        return lambda obs: _INTS.issuperset(map(type, obs))
    if isinstance(space, spaces.Dict):
        parts = {key: _all_fit(sub) for key, sub in space.spaces.items()}
        keys = frozenset(parts)
        return lambda obs: (
            DICT_TYPES.issuperset(map(type, obs))
            and all(o.keys() == keys for o in obs)
            and all(fit([o[key] for o in obs]) for key, fit in parts.items())
        )
    if isinstance(space, spaces.Tuple):
        subs = [_all_fit(sub) for sub in space.spaces]
        size = len(subs)
        return lambda obs: (
            all(type(o) is tuple and len(o) == size for o in obs)
            and all(fit([o[k] for o in obs]) for k, fit in enumerate(subs))
        )
    return lambda obs: True  # other spaces: batched by gymnasium's own rules only


def _check_step_result(space: spaces.Space[Any], transition: Any) -> None:
    """Raise ``TypeError``/``ValueError`` saying what is wrong with one env's step result."""
    obs, reward, terminated, truncated, info, _ = transition
    if not is_reward(reward):
        raise TypeError(f"the step result's reward must be a real number, got {describe(reward)}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool | np.bool_):
            raise TypeError(f"the step result's {name} must be a bool, got {describe(flag)}")
    if not isinstance(info, dict):
        raise TypeError(f"the step result's info must be a dict, got {describe(info)}")
    _check_observation(space, obs, "the step result's observation")


def is_reward(value: Any) -> bool:
    """Whether ``value`` is a reward: an int or float (Python or numpy), or a 0-d array of one.

    gymnasium's env checker asks for "a float, int, np.integer or np.floating":
    a ``bool`` (or ``np.bool_``) is not a reward, though Python counts it an int.
    """
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "iuf"
    return isinstance(value, numbers.Real | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _check_observation(space: spaces.Space[Any], obs: Any, path: str) -> None:
    """An observation (part ``path``) batches into ``space``, or a clear error."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, Mapping) or set(obs) != set(space.spaces):
            raise TypeError(
                f"{path} must be a dict with keys {sorted(space.spaces)}, got {describe(obs)}"
            )
        for key, sub in space.spaces.items():
            _check_observation(sub, obs[key], f"{path}[{key!r}]")
        return
    if isinstance(space, spaces.Tuple):
        if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
            raise TypeError(f"{path} must be a tuple of {len(space.spaces)}, got {describe(obs)}")
        for k, (sub, part) in enumerate(zip(space.spaces, obs, strict=True)):
            _check_observation(sub, part, f"{path}[{k}]")
        return
    if not isinstance(space, (*_ARRAYS, spaces.Discrete)):
        return  # batched by gymnasium's own rules, which say what is wrong
    try:
        array = np.asarray(obs)
    except ValueError as exc:  # ragged nesting
        raise ValueError(f"{path} is not an array: {exc}") from None
    shape = space.shape or ()
    if array.shape != shape:
        raise ValueError(f"{path} must have shape {shape} ({space}), got shape {array.shape}")
    assert space.dtype is not None
    if not np.can_cast(array.dtype, space.dtype, "same_kind"):
        raise TypeError(
            f"{path} must have a dtype that casts to {space.dtype} ({space}), "
            f"got dtype {array.dtype}"
        )
