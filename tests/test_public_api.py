"""The public surface: names, modules, errors, lazy imports."""

from __future__ import annotations

import multiprocessing
import pathlib
import pickle
import re
import subprocess
import sys
import tomllib

import gymnasium
import pytest

import aiovec

PUBLIC = {
    "AlreadyPendingCallError",
    "AsyncEnv",
    "AsyncioVectorEnv",
    "BlockingVectorEnv",
    "ClosedError",
    "Collector",
    "DiscardedGroup",
    "EnvError",
    "EnvTimeoutError",
    "Episode",
    "EpisodeBatch",
    "EpisodeCollector",
    "LatencyStats",
    "NoAsyncCallError",
    "RestartPolicy",
    "SegmentBatch",
    "State",
    "StateError",
    "WorkerDiedError",
    "__version__",
    "make",
    "rewards_differ",
    "serve",
}


def test_all_is_exactly_the_public_names():
    assert isinstance(aiovec.__all__, tuple)
    assert set(aiovec.__all__) == PUBLIC
    public_attrs = {name for name in dir(aiovec) if not name.startswith("_")}
    submodules = {"backends", "testing", "gameserver", "compat"}
    assert public_attrs - PUBLIC <= submodules


def test_the_version_is_pyprojects_and_has_its_changelog_section():
    root = pathlib.Path(__file__).parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert aiovec.__version__ == project["version"]
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{aiovec.__version__}] - " in changelog, "CHANGELOG.md has no section for it"


@pytest.mark.parametrize("name", sorted(PUBLIC - {"__version__"}))
def test_public_objects_live_in_aiovec(name):
    assert getattr(aiovec, name).__module__ == "aiovec"


def test_exception_tree():
    assert issubclass(aiovec.EnvTimeoutError, aiovec.EnvError)
    assert issubclass(aiovec.EnvTimeoutError, TimeoutError)
    assert issubclass(aiovec.WorkerDiedError, aiovec.EnvError)
    assert issubclass(aiovec.StateError, ValueError)
    assert issubclass(aiovec.ClosedError, aiovec.StateError)
    assert issubclass(aiovec.ClosedError, gymnasium.error.ClosedEnvironmentError)
    # gymnasium.vector.AsyncVectorEnv's errors, so that code written for it catches aiovec's
    assert issubclass(aiovec.EnvTimeoutError, multiprocessing.TimeoutError)
    for name in ("NoAsyncCallError", "AlreadyPendingCallError"):
        assert issubclass(getattr(aiovec, name), aiovec.StateError)
        assert issubclass(getattr(aiovec, name), getattr(gymnasium.error, name))


@pytest.mark.parametrize("cls", [aiovec.NoAsyncCallError, aiovec.AlreadyPendingCallError])
def test_gymnasium_state_errors_keep_their_name_and_pickle(cls):
    error = cls("Calling `step_wait` without any prior call to `step_async`.", "step")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert (str(copy), copy.name) == (str(error), "step")


@pytest.mark.parametrize("cls", [aiovec.EnvError, aiovec.EnvTimeoutError, aiovec.WorkerDiedError])
def test_env_errors_name_envs_and_pickle(cls):
    error = cls({5: KeyError("x"), 2: ValueError("boom")}, "step()")
    assert error.env_index == 2
    assert list(error.errors) == [2, 5]
    assert isinstance(error.__cause__, ValueError)
    assert "env 2 failed in step()" in str(error)
    assert "1 other env(s): 5" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert copy.env_index == 2
    assert str(copy) == str(error)


@pytest.mark.parametrize(
    ("cause", "shown"),
    [
        (TypeError("bad thing"), "env 0 failed in reset(): TypeError: bad thing"),
        (TimeoutError(), "env 0 failed in reset(): TimeoutError"),
        (KeyError("x"), "env 0 failed in reset(): KeyError: 'x'"),
    ],
)
def test_env_error_shows_its_cause_as_a_traceback_does(cause, shown):
    assert str(aiovec.EnvError({0: cause}, "reset()")) == shown


def test_state_is_public_and_is_what_venv_state_returns():
    with aiovec.BlockingVectorEnv([lambda: gymnasium.make("CartPole-v1")]) as envs:
        assert envs.vector_env.state is aiovec.State.NEEDS_RESET
        envs.reset(seed=0)
        assert envs.vector_env.state is aiovec.State.READY
    assert pickle.loads(pickle.dumps(aiovec.State.BROKEN)) is aiovec.State.BROKEN


def test_env_error_needs_a_failing_env():
    with pytest.raises(ValueError, match="at least one"):
        aiovec.EnvError({})


def test_import_loads_no_backend_and_no_optional_dependency():
    code = (
        "import sys, aiovec; "
        "print(sorted(m for m in sys.modules if m.startswith(('aiovec.backends.', 'ray', "
        "'uvloop', 'anyio.from_thread'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(eval(out.stdout))
    assert loaded <= {"aiovec.backends._base", "aiovec.backends._drive"}  # the protocol only


def test_async_env_defaults_and_seeding():
    class Env(aiovec.AsyncEnv[int, int]):
        observation_space = gymnasium.spaces.Discrete(2)
        action_space = gymnasium.spaces.Discrete(2)

    import asyncio

    env = Env()
    asyncio.run(env.reset(seed=3))
    first = env.np_random.integers(1000)
    asyncio.run(env.reset(seed=3))
    assert env.np_random.integers(1000) == first
    assert env.np_random_seed == 3
    assert asyncio.run(env.render()) is None
    assert asyncio.run(env.close()) is None
    with pytest.raises(NotImplementedError, match="step"):
        asyncio.run(env.step(0))
    assert env.unwrapped is env


def test_mixed_protocol_envs_are_refused():
    class Mixed:
        observation_space = gymnasium.spaces.Discrete(2)
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return 0, {}

        async def step(self, action):
            return 0, 0.0, False, False, {}

    with pytest.raises(TypeError, match="mixes protocols"):
        aiovec.AsyncioVectorEnv([Mixed])


def test_both_front_ends_take_exactly_the_same_arguments():
    import inspect

    def parameters(cls):
        return [
            (p.name, p.kind, p.default, p.annotation)
            for p in inspect.signature(cls.__init__).parameters.values()
        ]

    assert parameters(aiovec.BlockingVectorEnv) == parameters(aiovec.AsyncioVectorEnv)


def test_docstrings_are_markdown_not_sphinx():
    """The API reference renders docstrings as Markdown: a Sphinx role would show literally."""
    role = re.compile(r":(?:class|meth|func|attr|data|exc|mod|obj):`")
    package = pathlib.Path(aiovec.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if role.search(line)
    ]
    assert not found, f"Sphinx roles in docstrings (write `name` instead): {found}"
