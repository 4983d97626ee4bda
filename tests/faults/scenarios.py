"""The faults the suite injects, where each one can run, and how results are compared.

A :class:`Fault` says which env fails, on which call, how (a factory of the
faulty env), which ``EnvError`` subclass the vector env must raise and which
envs it must name.  Every faulty env wraps a :class:`~aiovec.testing.SpaceEnv`;
the oracle (gymnasium's ``SyncVectorEnv``) runs the same ``SpaceEnv`` without
the fault, so every row that the fault does not touch must be identical.
"""

from __future__ import annotations

import functools
import os
import random
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import pytest
from conftest import assert_same

import aiovec
from aiovec.testing import (
    MALFORMED,
    AsyncHangingEnv,
    AsyncTwin,
    FaultyEnv,
    HangingEnv,
    KillingEnv,
    MalformedEnv,
    SpaceEnv,
)

NUM_ENVS = 4
NUM_WORKERS = 2  # process and ray backends: envs 0-1 share a worker, and envs 2-3
# Backends whose workers (processes, Ray actors) each host a contiguous group of envs
GROUP_BACKENDS = ("process", "ray")
STEP_TIMEOUT = 0.5  # seconds; only the hanging faults wait for it
RESET_TIMEOUT = 10.0
LONG = (50, 50)  # episode lengths that never end within a test
SHORT = (1, 4)  # random terminations and truncations every few steps

# A faulty env may have started a different number of episodes than the oracle's
# (a failed reset, a rebuilt env): the info keys that count episodes then differ.
EPISODE_COUNTERS = frozenset({("nested", "episodes"), ("label",)})

EnvFn = Callable[[], Any]
Setup = tuple[str, str]  # (backend, flavour)

SYNC_SETUPS = [("inline", "sync"), ("thread", "sync"), ("process", "sync"), ("ray", "sync")]
ASYNC_SETUPS = [("inline", "async"), ("process", "async"), ("ray", "async")]
ALL_SETUPS = SYNC_SETUPS + ASYNC_SETUPS
# A sync env that blocks on the inline backend blocks the event loop itself, so
# no timeout can fire (that is what backend="thread" is for): no sync hang there.
HANG_SETUPS = [s for s in ALL_SETUPS if s != ("inline", "sync")]
PROCESS_SETUPS = [("process", "sync"), ("process", "async")]
GROUP_SETUPS = [*PROCESS_SETUPS, ("ray", "sync"), ("ray", "async")]


def space_env(lengths: tuple[int, int]) -> SpaceEnv:
    return SpaceEnv(min_len=lengths[0], max_len=lengths[1])


class Once:
    """Taken by the first caller only, across threads and processes (an exclusive file).

    A fault's factory builds the faulty env only when it takes its token, so
    the env rebuilt by a restart is a healthy one, even in a new worker process.
    """

    def __init__(self, directory: Any) -> None:
        self.path = os.path.join(os.fspath(directory), f"once-{uuid.uuid4().hex}")

    def take(self) -> bool:
        try:
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


@dataclass(frozen=True)
class Ctx:
    """What a fault's factory may use."""

    flavour: str
    at: int
    lengths: tuple[int, int]
    gates: Any  # the ``gates`` fixture: ``gates()`` makes a Gate, ``gates.once()`` a Once
    every_build: bool = False  # the faulty env on every build, not only the first


Wrap = Callable[[gymnasium.Env[Any, Any]], Any]


def _faulty(ctx: Ctx, wrap: Wrap) -> EnvFn:
    """The factory of the faulty env: ``wrap(SpaceEnv)`` in the context's flavour."""
    once = None if ctx.every_build else ctx.gates.once()
    return functools.partial(_build, once, wrap, ctx.lengths, ctx.flavour)


def _build(once: Once | None, wrap: Wrap, lengths: tuple[int, int], flavour: str) -> Any:
    env = space_env(lengths)
    if once is None or once.take():
        env = wrap(env)
        if isinstance(env, aiovec.AsyncEnv):
            return env
    return AsyncTwin(env, max_yields=2, seed=1) if flavour == "async" else env


def _raising(method: str, ctx: Ctx) -> EnvFn:
    return _faulty(ctx, functools.partial(FaultyEnv, method=method, at=ctx.at))


def _hanging(ctx: Ctx) -> EnvFn:
    cls = AsyncHangingEnv if ctx.flavour == "async" else HangingEnv
    return _faulty(ctx, functools.partial(cls, gate=ctx.gates(), at=ctx.at))


def _malformed(kind: str, ctx: Ctx) -> EnvFn:
    return _faulty(ctx, functools.partial(MalformedEnv, kind=kind, at=ctx.at))


def _killing(ctx: Ctx) -> EnvFn:
    return _faulty(ctx, functools.partial(KillingEnv, spare=os.getpid(), at=ctx.at))


@dataclass(frozen=True)
class Fault:
    """One way for an env to fail.

    Attributes:
        name: The test id.
        make: The faulty env's factory, given the context.
        error: The ``EnvError`` subclass the failing call must raise.
        cause: What ``.errors[i]`` must be an instance of.
        setups: The (backend, flavour) pairs it runs on.
        env: Which env fails (``None``: drawn at random per test).
        at: Which of its calls fails (``None``: drawn at random per test).
        step: The vector step on which that happens (``None``: ``at``).
        lengths: Episode lengths of every env.
        whole_worker: On a group backend the worker's other envs fail too (not
            where a process worker runs the faulty env as an async task).
        blocks: A hang: the step blames the faulty env (``env_index``).  On a
            group backend a sync env blocks its worker, and the worker's other
            envs are lost with it (`LostWithWorkerError`); an async env is
            cancelled in its worker, which goes on: its other envs keep their
            results.
        timeout: Needs ``step_timeout``.
        bug: Why aiovec does not yet handle it (the tests are strict xfails).
    """

    name: str
    make: Callable[[Ctx], EnvFn]
    error: type[aiovec.EnvError] = aiovec.EnvError
    cause: type[BaseException] | tuple[type[BaseException], ...] = RuntimeError
    setups: tuple[Setup, ...] = tuple(ALL_SETUPS)
    env: int | None = 1
    at: int | None = 3
    step: int | None = None
    lengths: tuple[int, int] = LONG
    whole_worker: bool = False
    blocks: bool = False
    timeout: bool = False
    bug: str | None = None

    def place(self, seed_text: str) -> tuple[int, int, int]:
        """``(env, call, step)`` of the failure: fixed, or drawn from the test id."""
        draw = random.Random(zlib.crc32(seed_text.encode()))
        env = self.env if self.env is not None else draw.randrange(NUM_ENVS)
        at = self.at if self.at is not None else draw.randint(1, 6)
        return env, at, self.step or at

    def failing(self, env: int, backend: str, flavour: str) -> set[int]:
        """The envs the error must name.

        A process worker publishes its other (sync) envs' results before an
        async faulty env runs on its loop, and cancels that env's late call:
        there, only the faulty env fails.  A hang (``blocks``) takes its
        worker's other envs along only where it blocks the worker: a sync env.
        """
        taken_along = backend in GROUP_BACKENDS and not (
            backend == "process" and flavour == "async"
        )
        if self.blocks:
            taken_along = backend in GROUP_BACKENDS and flavour == "sync"
        if self.whole_worker and taken_along:
            return set(worker_group(env))
        return {env}

    def kwargs(self) -> dict[str, Any]:
        """Vector env arguments for this fault."""
        return (
            {"step_timeout": STEP_TIMEOUT, "reset_timeout": RESET_TIMEOUT} if self.timeout else {}
        )


def worker_group(env: int) -> range:
    """The envs sharing env ``env``'s worker (contiguous groups, as docs/process.md says)."""
    size = NUM_ENVS // NUM_WORKERS
    first = env // size * size
    return range(first, first + size)


FAULTS = [
    Fault("raise-in-step", lambda ctx: _raising("step", ctx)),
    Fault("raise-in-step-at-random", lambda ctx: _raising("step", ctx), env=None, at=None),
    # episodes of 2 steps: the 2nd reset is the autoreset inside step 3
    Fault(
        "raise-in-autoreset",
        lambda ctx: _raising("reset", ctx),
        env=2,
        at=2,
        step=3,
        lengths=(2, 2),
    ),
    Fault(
        "hang",
        _hanging,
        error=aiovec.EnvTimeoutError,
        cause=TimeoutError,
        setups=tuple(HANG_SETUPS),
        whole_worker=True,
        blocks=True,
        timeout=True,
    ),
    Fault(
        "worker-killed",
        _killing,
        error=aiovec.WorkerDiedError,
        cause=Exception,
        setups=tuple(GROUP_SETUPS),
        whole_worker=True,
    ),
    *(
        Fault(
            f"malformed-{kind}",
            functools.partial(_malformed, kind),
            cause=(ValueError, TypeError),
            setups=tuple(SYNC_SETUPS),
            env=2,
        )
        for kind in MALFORMED
    ),
]


def fault_cases(faults: list[Fault] = FAULTS, bugs: Mapping[str, str] | None = None) -> list[Any]:
    """``pytest.param(fault, backend, flavour)`` for every fault and every setup it runs on.

    ``bugs`` maps fault names to extra xfail reasons (for one test only).
    """
    cases = []
    for fault in faults:
        reason = fault.bug or (bugs or {}).get(fault.name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        for backend, flavour in fault.setups:
            cases.append(
                pytest.param(
                    fault, backend, flavour, marks=marks, id=f"{fault.name}-{backend}-{flavour}"
                )
            )
    return cases


# --------------------------------------------------------------------------- rows


def env_info(infos: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s own info, taken out of gymnasium's batched infos (``_key`` masks)."""
    own: dict[str, Any] = {}
    for key, value in infos.items():
        mask = infos.get(f"_{key}")
        if key.startswith("_") or mask is None or not mask[i]:
            continue
        own[key] = env_info(value, i) if isinstance(value, dict) else value[i]
    return own


def assert_rows_equal(got: tuple[Any, ...], want: tuple[Any, ...], rows: Any) -> None:
    """Step results agree on ``rows``: observation, reward, flags and the env's own info."""
    obs, rewards, terminations, truncations, infos = got
    for i in rows:
        where = f"env {i}"
        assert_same(obs[i], want[0][i], (where, "obs"))
        assert_same(rewards[i], want[1][i], (where, "reward"))
        assert_same(terminations[i], want[2][i], (where, "terminated"))
        assert_same(truncations[i], want[3][i], (where, "truncated"))
        assert_same(env_info(infos, i), env_info(want[4], i), (where, "info"))


def assert_restarted_row(got: tuple[Any, ...], i: int, space: Any, cause: str) -> None:
    """Env ``i``'s row is a restart, as the contract says."""
    obs, rewards, terminations, truncations, infos = got
    assert space.contains(obs[i]), f"env {i}'s restart observation {obs[i]!r} is not in {space}"
    assert (rewards[i], terminations[i], truncations[i]) == (0.0, False, True)
    assert infos["_error"][i], f"env {i}'s restart is not marked in infos['_error']"
    assert cause in infos["error"][i], f"{cause!r} not in {infos['error'][i]!r}"
    assert "rebuilt" in infos["error"][i]


def oracle_fns(lengths: tuple[int, int]) -> list[EnvFn]:
    return [functools.partial(space_env, lengths)] * NUM_ENVS


def actions_for(step: int) -> np.ndarray:
    """A fixed, different batch of actions for every step."""
    return (np.arange(NUM_ENVS, dtype=np.int64) + step) % 3
