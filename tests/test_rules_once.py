"""Rules that must exist once: a second copy, written later, fails here.

Each test reads aiovec's source (without importing the backends) and checks
that a rule has one home: the backend names, the concurrency limit, the
making of a step flow, the close timeout, and each public type's name.
"""

from __future__ import annotations

import ast
import collections
import importlib.util
import pathlib

import pytest

from aiovec._core.validate import BACKENDS
from aiovec.backends import load_backend

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "aiovec"

# Copies that the grouped-worker layer (issue 19) removes from the process and
# Ray code; empty these when it lands.
PENDING: dict[str, set[str]] = {"flows": set(), "close timeouts": set(), "env closes": set()}


def _modules() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


MODULES = _modules()


def _where(predicate: object) -> set[str]:
    """The modules with a node for which ``predicate(node)`` is true."""
    assert callable(predicate)
    return {name for name, tree in MODULES.items() if any(map(predicate, ast.walk(tree)))}


def _calls(name: str) -> object:
    """A predicate: a call of ``name`` (as a function or a method)."""

    def is_call(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        return (isinstance(func, ast.Name) and func.id == name) or (
            isinstance(func, ast.Attribute) and func.attr == name
        )

    return is_call


def test_each_public_type_is_defined_once() -> None:
    """A class or type alias has one definition (there were two ``Op`` types)."""
    homes: dict[str, list[str]] = collections.defaultdict(list)
    for module, tree in MODULES.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(module)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp | ast.Subscript):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id[:1].isupper():
                        homes[target.id].append(module)
    twice = {name: where for name, where in homes.items() if len(where) > 1}
    assert {name: where for name, where in twice.items() if not name.startswith("_")} == {}


def test_backend_names_are_the_backend_modules() -> None:
    """``BACKENDS`` lists exactly the modules that define a ``<Name>Backend``."""
    found = set()
    for module, tree in MODULES.items():
        folder, _, file = module.rpartition("/")
        if file == "__init__.py":  # a backend that is a package: backends/name/
            folder, _, file = folder.rpartition("/")
        name = file.removesuffix(".py")
        classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
        if folder == "backends" and f"{name.capitalize()}Backend" in classes:
            found.add(name)
    assert found == set(BACKENDS)


@pytest.mark.parametrize("name", [name for name in BACKENDS if name != "ray"])
def test_load_backend_finds_each_name(name: str) -> None:
    if name == "remote" and importlib.util.find_spec("msgspec") is None:  # (no serve extra)
        with pytest.raises(ModuleNotFoundError, match=r'needs msgspec.*"aiovec\[serve\]"'):
            load_backend(name)
        return
    assert load_backend(name).__name__ == f"{name.capitalize()}Backend"


def test_load_backend_refuses_an_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"backend must be one of 'inline'.*got str 'nope'"):
        load_backend("nope")


def test_only_the_limit_module_takes_concurrency_tokens() -> None:
    takers = set()
    for method in ("acquire_on_behalf_of", "acquire_on_behalf_of_nowait", "release_on_behalf_of"):
        takers |= _where(_calls(method))
    assert takers == {"backends/_limit.py"}


def test_only_the_core_makes_step_flows() -> None:
    def makes_a_flow(node: ast.AST) -> bool:  # (a worker group's step_flow method is another)
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"step_flow", "new_step_flow"}
        )

    makers = _where(makes_a_flow)
    assert makers - PENDING["flows"] == {"_core/calls.py"}


def test_one_close_timeout() -> None:
    """Only ``_drive`` says how long an env's ``close()`` may take."""

    def defines_close_timeout(node: ast.AST) -> bool:
        return isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and "CLOSE_TIMEOUT" in target.id for target in node.targets
        )

    assert _where(defines_close_timeout) - PENDING["close timeouts"] == {"backends/_drive.py"}


def test_backends_close_envs_only_through_drive() -> None:
    """No backend calls an env's ``close()`` itself: ``_drive`` does (one timeout, errors)."""

    def closes_an_env(node: ast.AST) -> bool:
        if not (_calls("close")(node) and isinstance(node, ast.Call)):
            return False
        assert isinstance(node.func, ast.Attribute)
        return "env" in ast.unparse(node.func.value).lower()

    closers = {m for m in _where(closes_an_env) if m.startswith("backends/")}
    assert closers - PENDING["env closes"] == {"backends/_drive.py"}


def test_a_worker_writes_its_replies_only_through_its_sink() -> None:
    """On the worker's side only the process sink (``process/child.py``) writes to a pipe.

    The job code (``pool/host/``) emits every result through its sink; it once
    also wrote replies and published parts to the pipe itself, past the sink a
    Ray actor set.
    """

    def writes_to_a_pipe(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        called = ast.unparse(node.func)
        return called in {"write_all", "os.write"} or called.endswith(".write_all")

    writers = _where(writes_to_a_pipe)
    assert {m for m in writers if m.startswith("backends/pool/")} == set()
    assert "backends/process/child.py" in writers
