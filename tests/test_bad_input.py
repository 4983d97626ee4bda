"""Bad input fails clearly, before any env is touched, and leaves the vector env usable.

Each bad call must raise ``ValueError``/``TypeError`` naming the argument; the
SpaceEnv counters (episodes started, steps taken) prove no env ran; a valid
call afterwards still matches the oracle step for step.
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest
from conftest import (
    SYNC_ONLY_BACKENDS,
    Lockstep,
    counters,
    flavoured,
    open_front_end,
    space_env_fns,
)
from gymnasium import spaces

from aiovec.testing import SpaceEnv

NUM_ENVS = 3


@pytest.fixture
def lock(make_venv, make_oracle, request):
    """A reset aiovec + oracle pair over ``request.param``'s space, one step in."""
    space = getattr(request, "param", "box-discrete")
    fns = space_env_fns(NUM_ENVS, space, min_len=4, max_len=8)
    pair = Lockstep(make_venv(fns), make_oracle(fns), action_seed=1)
    pair.reset(seed=17)
    pair.step()
    return pair


def assert_rejected_untouched(lock, call, errors, match):
    """``call(venv)`` raises one of ``errors`` matching ``match``; nothing ran; still usable."""
    before = counters(lock.venv)
    with pytest.raises(errors, match=match):
        call(lock.venv)
    assert counters(lock.venv) == before, "a rejected call must not touch any env"
    lock.step()
    lock.step()


def _dict_actions(n, drop=None, y_rows=None):
    actions = {
        "x": np.zeros(n, dtype=np.int64),
        "y": (
            np.zeros((y_rows or n, 1), dtype=np.float32),
            np.zeros((y_rows or n, 2), dtype=np.int64),
        ),
    }
    if drop:
        del actions[drop]
    return actions


BAD_ACTIONS = {
    # name: (space pair, actions, accepted exception types)
    "too-few": ("box-discrete", np.array([0, 1]), (ValueError,)),
    "too-many": ("box-discrete", np.array([0, 1, 2, 0]), (ValueError,)),
    "scalar": ("box-discrete", np.int64(1), (ValueError, TypeError)),
    "float-for-discrete": ("box-discrete", np.array([0.0, 1.0, 2.0]), (TypeError, ValueError)),
    "half-for-discrete": ("box-discrete", np.array([0.5, 1.0, 2.0]), (TypeError, ValueError)),
    "box-too-few-rows": ("image-box", np.zeros((2, 2), np.float32), (ValueError,)),
    "box-wrong-shape": ("image-box", np.zeros((3, 3), np.float32), (ValueError,)),
    "box-missing-axis": ("image-box", np.zeros(3, np.float32), (ValueError,)),
    "dict-missing-key": ("nested-dict-of-tuple", _dict_actions(3, drop="x"), (ValueError,)),
    "dict-short-leaf": ("nested-dict-of-tuple", _dict_actions(3, y_rows=2), (ValueError,)),
}


@pytest.mark.parametrize(
    ("lock", "actions", "errors"),
    [pytest.param(s, a, e, id=name) for name, (s, a, e) in BAD_ACTIONS.items()],
    indirect=["lock"],
)
def test_bad_actions(lock, actions, errors):
    assert_rejected_untouched(lock, lambda v: v.step(actions), errors, r"(?i)action")


BAD_RESETS = {
    "seed-list-too-short": ({"seed": [1, 2]}, (ValueError,), r"(?i)seed"),
    "seed-list-too-long": ({"seed": [1, 2, 3, 4]}, (ValueError,), r"(?i)seed"),
    "seed-float": ({"seed": 1.5}, (TypeError, ValueError), r"(?i)seed"),
    "seed-str": ({"seed": "42"}, (TypeError, ValueError), r"(?i)seed"),
    "seed-list-with-float": ({"seed": [1, 2, 3.5]}, (TypeError, ValueError), r"(?i)seed"),
    "reset-mask-wrong-shape": (
        {"options": {"reset_mask": np.array([True, False])}},
        (ValueError,),
        r"reset_mask",
    ),
    "reset-mask-2d": (
        {"options": {"reset_mask": np.ones((NUM_ENVS, 1), dtype=bool)}},
        (ValueError,),
        r"reset_mask",
    ),
    "reset-mask-int-dtype": (
        {"options": {"reset_mask": np.array([1, 0, 1])}},
        (TypeError, ValueError),
        r"reset_mask",
    ),
    "reset-mask-all-false": (
        {"options": {"reset_mask": np.zeros(NUM_ENVS, dtype=bool)}},
        (ValueError,),
        r"reset_mask",
    ),
}


@pytest.mark.parametrize(
    ("kwargs", "errors", "match"),
    [pytest.param(*case, id=name) for name, case in BAD_RESETS.items()],
)
def test_bad_reset_arguments(lock, kwargs, errors, match):
    assert_rejected_untouched(lock, lambda v: v.reset(**kwargs), errors, match)


# --------------------------------------------------------------------------- construction


class Counting:
    """Factories that count how many envs they built."""

    def __init__(self, num_envs: int = 2) -> None:
        self.built = 0
        self.fns = [self.make] * num_envs

    def make(self) -> SpaceEnv:
        self.built += 1
        return SpaceEnv()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"autoreset_mode": "bogus"}, r"autoreset_mode", id="autoreset-mode-str"),
        pytest.param({"autoreset_mode": 3}, r"autoreset_mode", id="autoreset-mode-int"),
        pytest.param({"backend": "bogus"}, r"backend", id="backend"),
        pytest.param({"on_error": "ignore"}, r"on_error", id="on-error"),
        pytest.param({"step_timeout": -1.0}, r"step_timeout", id="step-timeout-negative"),
    ],
)
def test_bad_options_fail_before_any_env_is_built(make_venv, kwargs, match):
    factories = Counting()
    with pytest.raises((ValueError, TypeError), match=match):
        make_venv(factories.fns, **kwargs)
    assert factories.built == 0


def test_empty_env_fns(make_venv):
    with pytest.raises(ValueError, match=r"env_fns"):
        make_venv([])


@pytest.mark.parametrize(
    "env_fns",
    [pytest.param(42, id="int"), pytest.param(SpaceEnv, id="one-factory-not-a-list")],
)
def test_env_fns_not_a_sequence(make_venv, env_fns):
    with pytest.raises(TypeError, match=r"env_fns"):
        make_venv(env_fns)


@pytest.mark.parametrize(
    "env_fns",
    [
        pytest.param(lambda: [SpaceEnv(), SpaceEnv()], id="list-of-envs"),
        pytest.param(SpaceEnv, id="one-env"),
    ],
)
def test_env_instances_instead_of_factories(backend, front_end, env_fns):
    """An env where a factory belongs: the message hints at passing factories."""
    with pytest.raises(TypeError, match=r"(?i)factor|callable|lambda"):
        open_front_end(front_end, env_fns(), backend=backend)


def test_factory_returning_a_non_env(backend, front_end):
    fns = [SpaceEnv, lambda: 42]
    with pytest.raises(TypeError, match=r"(?i)env"):
        open_front_end(front_end, fns, backend=backend)


class SpacesAsMethods:
    """A multi-agent env whose per-agent spaces are methods (without ``possible_agents``)."""

    metadata: dict = {}  # noqa: RUF012  (PettingZoo's class attribute)

    def __init__(self):
        self.agents = ["a", "b"]

    def observation_space(self, agent):
        return spaces.Discrete(3)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return dict.fromkeys(self.agents, 0), {a: {} for a in self.agents}

    def step(self, actions):
        zero = dict.fromkeys(self.agents, 0)
        return zero, zero, zero, zero, {a: {} for a in self.agents}

    def close(self):
        pass


class ParallelEnvLike(SpacesAsMethods):
    """Shaped like a PettingZoo ``ParallelEnv``."""

    possible_agents = ("a", "b")


@pytest.mark.parametrize("env_cls", [ParallelEnvLike, SpacesAsMethods])
def test_a_multi_agent_env_is_refused_saying_how_to_flatten_it(backend, front_end, env_cls):
    with pytest.raises(TypeError) as info:
        open_front_end(front_end, [env_cls, env_cls], backend=backend)
    message = str(info.value)
    assert f"returned a multi-agent env ({env_cls.__name__}" in message
    assert "aiovec vectorizes single-agent gymnasium envs" in message
    assert "SuperSuit" in message
    assert "Dict spaces keyed by agent" in message


def _mismatched(index, space, *, also_obs_at=None):
    """SpaceEnv factories where env ``index`` has a different ``space`` space."""
    fns = space_env_fns(max(4, (also_obs_at or 0) + 1))
    obs, act = spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3)
    if space == "observation":
        obs = spaces.Box(-1.0, 1.0, (4,), np.float32)
    else:
        act = spaces.Discrete(5)
    fns[index] = functools.partial(SpaceEnv, obs, act)
    if also_obs_at is not None:
        fns[also_obs_at] = functools.partial(SpaceEnv, spaces.Discrete(7), spaces.Discrete(3))
    return fns


@pytest.mark.parametrize("space", ["observation", "action"])
def test_mismatched_spaces_are_named(make_venv, space):
    with pytest.raises((ValueError, TypeError)) as info:
        make_venv(_mismatched(2, space))
    message = str(info.value)
    assert space in message.lower()
    assert "2" in message.replace("float32", ""), f"index 2 not named in {message!r}"


def test_the_first_mismatch_is_the_lowest_env_index(make_venv):
    """As SyncVectorEnv: envs are checked in order, each env's spaces together."""
    with pytest.raises((ValueError, TypeError)) as info:
        make_venv(_mismatched(2, "action", also_obs_at=4))
    message = str(info.value)
    assert "action" in message.lower()
    assert "Discrete(7)" not in message, "only the first mismatch is named"


@pytest.mark.parametrize("backend", sorted(SYNC_ONLY_BACKENDS))
def test_async_envs_on_a_sync_only_backend_are_refused_naming_the_fix(
    backend, front_end, leak_check
):
    """The suite runs no async env there (tests/conftest.py); this is what a user gets."""
    with pytest.raises(TypeError, match=r"returned an async env \(AsyncTwin\).*backend='inline'"):
        open_front_end(front_end, flavoured(space_env_fns(2), "async"), backend=backend)


class NeedsALoop(SpaceEnv):
    """Makes something bound to the running loop in ``__init__``, as an aiohttp session does."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()
        super().__init__()


def aiohttp_env():
    import aiohttp  # the http extra: the test is skipped without it

    return aiohttp.ClientSession()  # what docs/network.md has async envs make


@pytest.mark.parametrize("factory", [NeedsALoop, aiohttp_env])
def test_a_factory_that_needs_a_loop_on_thread_is_told_to_use_inline(front_end, factory):
    if factory is aiohttp_env:
        pytest.importorskip("aiohttp", reason='needs the "http" extra: pip install "aiovec[http]"')
    with pytest.raises(TypeError, match=r"env_fns\[0\]\(\) needs a running event loop") as info:
        open_front_end(front_end, [factory, factory], backend="thread")
    assert "backend='thread' runs synchronous envs" in str(info.value)
    assert "use backend='inline' for async envs" in str(info.value)
    assert "no running event loop" in str(info.value.__cause__)


# on process and ray, envs close in their workers (see test_process.py and test_ray.py)
@pytest.mark.parametrize("backend", ["inline", "thread"])
def test_envs_built_before_a_failed_construction_are_closed(backend, front_end):
    closed: list[int] = []

    class Tracked(SpaceEnv):
        def close(self):
            closed.append(1)

    fns = [Tracked, Tracked, functools.partial(Tracked, spaces.Discrete(2))]

    with pytest.raises((ValueError, TypeError)):
        open_front_end(front_end, fns, backend=backend)
    assert len(closed) == 3, "envs built before the failure must be closed"


def test_usable_after_every_kind_of_bad_call(lock):
    """Several rejected calls in a row change nothing."""
    before = counters(lock.venv)
    for call in (
        lambda v: v.step(np.array([0, 1])),
        lambda v: v.reset(seed=[1]),
        lambda v: v.reset(options={"reset_mask": np.zeros(NUM_ENVS, dtype=bool)}),
        lambda v: v.step(np.array([0.5, 0.5, 0.5])),
    ):
        with pytest.raises((ValueError, TypeError)):
            call(lock.venv)
    assert counters(lock.venv) == before
    for _ in range(6):
        lock.step()
