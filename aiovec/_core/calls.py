"""What a vector env asks one env to do, and the per-env flows that sequence it.

A *call* is one method invocation on one env (``Reset``, ``STEP``, ...).  A
*flow* is a generator that yields calls and receives their results, giving
the env's part of a vector step; any driver can push it (inline with
``await``, a worker process in a loop, a thread).  Autoreset lives in
`step_flow`, once, for every backend.  Every other vector call is a
single call per env and needs no flow.

``STEP`` carries no action: the driver steps the env with the one action it was
given for that env in this vector call.  This keeps the hot path free of
per-env allocations (a frozen dataclass per env-step would be a noticeable
share of a cheap env-step).
"""

from __future__ import annotations

from collections.abc import Generator, MutableSequence
from dataclasses import dataclass
from typing import Any

from gymnasium.vector import AutoresetMode

__all__ = (
    "AUTORESET",
    "CLOSE",
    "KEEP_ENDED",
    "RENDER",
    "STEP",
    "Autoreset",
    "CallMethod",
    "Close",
    "EnvCall",
    "GetAttr",
    "IsWrapped",
    "KeepEnded",
    "Render",
    "Reset",
    "SetAttr",
    "Step",
    "StepFlow",
    "Transition",
    "flow_at",
    "new_step_flow",
    "step_flow",
)


@dataclass(frozen=True, slots=True)
class Reset:
    """``env.reset(seed=seed, options=options)``."""

    seed: int | None = None
    options: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """``env.step(action)`` with the action the driver holds for this env."""


@dataclass(frozen=True, slots=True)
class Render:
    """``env.render()``."""


@dataclass(frozen=True, slots=True)
class Close:
    """``env.close()``."""


@dataclass(frozen=True, slots=True)
class GetAttr:
    """Read attribute ``name`` (through gymnasium wrappers where there are any)."""

    name: str


@dataclass(frozen=True, slots=True)
class CallMethod:
    """Call method ``name(*args, **kwargs)``, or read it if it is not callable."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SetAttr:
    """Set attribute ``name`` to ``value`` (through gymnasium wrappers)."""

    name: str
    value: Any


@dataclass(frozen=True, slots=True)
class IsWrapped:
    """Whether the env is, or is wrapped in, an instance of ``wrapper`` (a class).

    The env's gymnasium wrappers are followed through ``.env`` from the outside
    in, as Stable-Baselines3's ``is_wrapped`` does.
    """

    wrapper: type


@dataclass(frozen=True, slots=True)
class Autoreset:
    """An env's ``reset_first`` when its autoreset has options (a reset-options hook).

    It stands where `step_flow` takes a plain flag: it is true when ``now``
    is (``NEXT_STEP``: reset instead of stepping), and ``call`` is the reset to
    make, now or, under ``SAME_STEP``, when the env ends within this step.
    """

    call: Reset
    now: bool

    def __bool__(self) -> bool:
        return self.now


@dataclass(frozen=True, slots=True)
class KeepEnded:
    """An env's ``reset_first`` when its caller resets it itself once it ends (false).

    Under ``SAME_STEP``, an env that ends within the step is not reset there:
    its last observation and info are the step's (as under ``DISABLED``).  The
    `aiovec.EpisodeCollector` sends its steps so, and starts the env's next
    episode with a reset of its own (the next member's seed and task): one
    reset per episode, not two.
    """

    def __bool__(self) -> bool:
        return False


KEEP_ENDED = KeepEnded()


EnvCall = Reset | Step | Render | Close | GetAttr | CallMethod | SetAttr | IsWrapped

STEP = Step()
RENDER = Render()
CLOSE = Close()
AUTORESET = Reset()
"""The reset an autoreset performs: no seed (the env's generator continues), no options.

Where a reset-options hook gives an episode options, the flow is sent an
`Autoreset` instead of a plain flag, and makes its ``call`` instead.
"""

Transition = tuple[Any, Any, Any, Any, dict[str, Any], dict[str, Any] | None]
"""One env's part of a step: ``(obs, reward, terminated, truncated, info, final)``.

``final`` is ``{"final_obs": ..., "final_info": ...}`` when the env was reset
inside this step (``SAME_STEP``), else ``None``.
"""


StepFlow = Generator[EnvCall | Transition | None, Any, None]
"""A `step_flow` generator."""


def step_flow(mode: AutoresetMode) -> StepFlow:
    """One env's steps, for the env's whole life, under gymnasium 1.x autoreset rules.

    Protocol (one flow per env, made once; ``next(flow)`` primes it):
    ``flow.send(reset_first)`` starts a step and yields the first call; send
    each call's result back; a ``tuple`` coming out is the env's transition,
    and the flow is ready for the next step.  If a call raises, discard the
    flow and make a new one (it still expects that call's result).

    ``reset_first`` is True when the env ended on its previous step and the
    mode is ``NEXT_STEP``: this step resets it instead of stepping it (the
    action is ignored; reward 0, both flags False).  Under ``SAME_STEP`` an
    env that ends is reset within the step, and its last observation and
    info travel in ``final``.  ``reset_first`` may be an `Autoreset` (it
    tests as its flag): the autoreset, in either mode, is then its ``call``;
    or `KEEP_ENDED` (false): an env that ends is not reset within the step.

    A flow lives across steps (rather than one generator per step) because
    creating and finishing a generator per env-step costs more than stepping
    a cheap env.
    """
    same_step = mode is AutoresetMode.SAME_STEP
    transition: Transition | None = None
    while True:
        reset_first = yield transition
        if reset_first:
            obs, info = yield reset_first.call if type(reset_first) is Autoreset else AUTORESET
            transition = (obs, 0.0, False, False, info, None)
            continue
        obs, reward, terminated, truncated, info = yield STEP
        if same_step and (terminated or truncated) and type(reset_first) is not KeepEnded:
            final = {"final_obs": obs, "final_info": info}
            obs, info = yield reset_first.call if type(reset_first) is Autoreset else AUTORESET
            transition = (obs, reward, terminated, truncated, info, final)
        else:
            transition = (obs, reward, terminated, truncated, info, None)


def new_step_flow(mode: AutoresetMode) -> StepFlow:
    """A primed `step_flow`, ready for ``send(reset_first)``."""
    flow = step_flow(mode)
    next(flow)
    return flow


def flow_at(flows: MutableSequence[StepFlow | None], i: int, mode: AutoresetMode | str) -> StepFlow:
    """Env ``i``'s flow: ``flows[i]``, or a new one stored there if it has none.

    Every driver keeps one flow per env in such a list and sets an env's entry
    to ``None`` when a call on it raises.  Hot loops write
    ``flows[i] or flow_at(flows, i, mode)`` to skip the call.
    """
    flow = flows[i]
    if flow is None:
        flow = flows[i] = new_step_flow(AutoresetMode(mode))
    return flow
