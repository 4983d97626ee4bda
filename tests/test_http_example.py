"""examples/http_env.py's aiohttp envs (a session opened in ``__init__``) on every backend.

Skipped without the ``http`` extra (aiohttp); CI also runs the example itself.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest
from conftest import BACKENDS, FRONT_ENDS, SYNC_ONLY_BACKENDS, open_front_end

pytest.importorskip("aiohttp", reason='needs the "http" extra: pip install "aiovec[http]"')

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "http_env.py"


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("aiovec_http_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # for pickling its envs' factories
    try:
        spec.loader.exec_module(module)
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)  # Ray workers cannot import it by name
        yield module
        cloudpickle.unregister_pickle_by_value(module)
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def url(example: ModuleType) -> Iterator[str]:
    with example.serve() as url:
        yield url


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b not in SYNC_ONLY_BACKENDS])
def test_http_and_websocket_envs_run_on_every_backend_and_front_end(
    example: ModuleType, url: str, front_end: str, backend: str
) -> None:
    fns = [functools.partial(example.HttpEnv, url), functools.partial(example.WebSocketEnv, url)]
    venv = open_front_end(front_end, fns * 2, backend=backend, step_timeout=10.0)
    try:
        first, _ = venv.reset(seed=3)
        again, _ = venv.reset(seed=3)
        np.testing.assert_array_equal(first, again)  # seeded envs play seeded games
        obs, rewards, _, _, _ = venv.step(np.ones(4, np.int64))
        np.testing.assert_allclose(obs[:, 0], 0.1)  # everyone walked right
        np.testing.assert_allclose(rewards, -np.abs(obs[:, 0] - obs[:, 1]))
    finally:
        venv.shutdown()
