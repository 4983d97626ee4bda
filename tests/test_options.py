"""The vector env's options are declared once (``aiovec._core.options``).

Every option must reach the vector env whichever way it is built:
`AsyncioVectorEnv`, `BlockingVectorEnv`, and ``aiovec.make`` (both front
ends).  A new option that one of them forgets fails here.
"""

from __future__ import annotations

import inspect
from typing import Any

import anyio
import gymnasium
import pytest
from gymnasium.vector import AutoresetMode

import aiovec
from aiovec._core.options import VECTOR_OPTIONS
from aiovec._vector import AsyncioVectorEnv

# One value per option that differs from its default and is valid with 2 envs.
NON_DEFAULT: dict[str, Any] = {
    "backend": "thread",
    "num_workers": 2,
    "autoreset_mode": AutoresetMode.SAME_STEP,
    "step_timeout": 30.0,
    "on_error": "restart",
    "copy": False,
    "reset_timeout": 40.0,
    "max_concurrency": 1,
    "backend_options": {},
    "reset_options": lambda env_id, episode: None,
    "observation_mode": "different",
    "check_observations": True,
}


def _keywords(function: Any) -> list[inspect.Parameter]:
    parameters = inspect.signature(function).parameters.values()
    return [p for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]


def test_the_table_covers_every_option() -> None:
    assert set(NON_DEFAULT) == set(VECTOR_OPTIONS)


@pytest.mark.parametrize("cls", [aiovec.AsyncioVectorEnv, aiovec.BlockingVectorEnv])
def test_signatures_follow_the_declaration(cls: type) -> None:
    """Each front end's keywords are exactly the declared options, with the same defaults."""
    names = [p.name for p in _keywords(cls.__init__)]
    assert names == list(VECTOR_OPTIONS)
    reference = {p.name: (p.default, p.annotation) for p in _keywords(AsyncioVectorEnv.__init__)}
    assert {p.name: (p.default, p.annotation) for p in _keywords(cls.__init__)} == reference


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The arguments every `AsyncioVectorEnv` built during the test was given."""
    calls: list[dict[str, Any]] = []
    original = AsyncioVectorEnv.__init__
    signature = inspect.signature(original)

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(signature.bind(self, *args, **kwargs).arguments)
        original(self, *args, **kwargs)

    monkeypatch.setattr(AsyncioVectorEnv, "__init__", spy)
    return calls


def _build(way: str, name: str, value: Any) -> Any:
    factory = lambda: gymnasium.make("CartPole-v1")  # noqa: E731
    if way == "await":
        return aiovec.AsyncioVectorEnv([factory] * 2, **{name: value})
    if way == "blocking":
        return aiovec.BlockingVectorEnv([factory] * 2, **{name: value})
    return aiovec.make("CartPole-v1", 2, blocking=way == "make-blocking", **{name: value})


def _close(venv: Any) -> None:
    if isinstance(venv, aiovec.BlockingVectorEnv):
        venv.close()
    else:
        anyio.run(venv.close)


@pytest.mark.parametrize("way", ["await", "blocking", "make-await", "make-blocking"])
@pytest.mark.parametrize("name", VECTOR_OPTIONS)
def test_every_option_reaches_the_vector_env(
    received: list[dict[str, Any]], way: str, name: str
) -> None:
    venv = _build(way, name, NON_DEFAULT[name])
    try:
        assert len(received) == 1
        assert received[0][name] is NON_DEFAULT[name]
    finally:
        _close(venv)


def test_make_takes_max_concurrency() -> None:
    """The call of issue 19: ``make`` used to pass ``max_concurrency`` to each env."""
    with aiovec.make("CartPole-v1", 4, blocking=True, max_concurrency=2) as envs:
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        limiter = envs.vector_env._backend.limiter  # type: ignore[union-attr]
        assert isinstance(limiter, anyio.CapacityLimiter)
        assert limiter.total_tokens == 2
