"""Fixtures of the fault suite: every test is leak-checked; vector envs are built here.

- ``backend``: every backend, ray included where it is installed and aiovec
  has it (skipped otherwise);
- ``open_venv``: builds aiovec through the test's front end (``front_end``
  fixture of ``tests/conftest.py``); at teardown it releases every
  :class:`~aiovec.testing.Gate` first (so hung calls end), closes the vector
  env, and checks that no task is left on the await front end's loop;
- ``gate``: a fresh gate, released at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from conftest import BACKENDS, HAVE_RAY, AwaitFrontEnd, FrontEnd, open_front_end

from aiovec.testing import Gate
from faults.leaks import LeakCheck, pending_tasks
from faults.scenarios import Once

FAULT_BACKENDS = [*dict.fromkeys([*(b for b in BACKENDS if b != "remote"), "ray"])]
"""Every backend but "remote", whose faults (drops, deadlines, late replies) tests/test_serve.py
injects; a worker's faults are the server's backend's, tested here on it."""


@pytest.fixture(autouse=True)
def _no_leaks(leak_check: LeakCheck) -> None:
    """Every test of the fault suite is leak-checked."""


def skip_unless_available(backend: str) -> None:
    """Skip a backend whose optional dependency is missing."""
    if backend == "ray" and not HAVE_RAY:
        pytest.skip('needs the "ray" extra: pip install "aiovec[ray]"')


@pytest.fixture(params=FAULT_BACKENDS)
def backend(request: pytest.FixtureRequest, ray_cluster: Any) -> str:
    name = str(request.param)
    skip_unless_available(name)
    return name


class Gates:
    """Every gate a test made; all released at teardown, before the vector envs close."""

    def __init__(self, directory: Any) -> None:
        self.directory = directory
        self.made: list[Gate] = []

    def __call__(self) -> Gate:
        gate = Gate(self.directory)
        self.made.append(gate)
        return gate

    def once(self) -> Once:
        """A token that only the first of any number of processes can take."""
        return Once(self.directory)

    def release_all(self) -> None:
        for gate in self.made:
            gate.release()


@pytest.fixture
def gates(tmp_path: Any) -> Iterator[Gates]:
    made = Gates(tmp_path)
    yield made
    made.release_all()


@pytest.fixture
def gate(gates: Gates) -> Gate:
    return gates()


def close_checked(adapter: FrontEnd) -> None:
    """Close an adapter; on the await front end no task may be left on its loop."""
    try:
        if not adapter.venv.closed:
            adapter.close()
        if isinstance(adapter, AwaitFrontEnd):
            left = pending_tasks(adapter._runner.get_loop())
            assert not left, f"tasks left on the loop after close(): {left}"
    finally:
        adapter.shutdown()


@pytest.fixture
def open_venv(backend: str, front_end: str, gates: Gates) -> Iterator[Callable[..., FrontEnd]]:
    """Build aiovec through ``front_end`` on ``backend``; closed and checked at teardown."""
    opened: list[FrontEnd] = []

    def make(env_fns: Sequence[Callable[[], Any]], **kwargs: Any) -> FrontEnd:
        adapter = open_front_end(front_end, env_fns, backend=backend, **kwargs)
        opened.append(adapter)
        return adapter

    yield make
    gates.release_all()
    errors = []
    for adapter in reversed(opened):
        try:
            close_checked(adapter)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    # Drop them: a closed process backend keeps its workers' sentinel pipes open
    # until the vector env is freed (test_shutdown.py has a test for that).
    opened.clear()
    assert not errors, f"closing aiovec at teardown failed: {errors!r}"
