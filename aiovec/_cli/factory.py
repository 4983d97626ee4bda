"""``aiovec bench``'s first two steps: load the env factory, then probe it.

1. **Load** the factory: ``package.module:make_env`` is imported (the current
   directory is on the path, as for ``python -m``); ``path/to/file.py:make_env``
   is loaded from that file, its folder put first on ``sys.path`` (as when the
   file is run as a script) and the module registered with cloudpickle to
   travel *by value*, so worker processes need not be able to import it; a
   gymnasium registry id (``CartPole-v1``) is ``gymnasium.make`` of it.
   ``--env-kwargs`` (a JSON object) are bound to it.
2. **Probe**: the factory is called once, here, and what it returns is checked
   to be an env (sync or async) and closed; a gymnasium env whose id has a
   vector entry point (gymnasium's own vector env of it) is noted.  Anything
   wrong is one paragraph (`FactoryError`) naming the factory, what went wrong
   and what a factory must be; ``--traceback`` adds the traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium

from aiovec._cli.report import short
from aiovec.backends._base import check_env

__all__ = ("Factory", "FactoryError", "load_factory", "print_error", "probe")

_FACTORY_HELP = (
    "A factory is a callable that takes no arguments and returns a new env each time it "
    "is called: a gymnasium.Env or an aiovec.AsyncEnv (an env class works too)."
)


class FactoryError(Exception):
    """The factory cannot be loaded, called, or does not make an env (one paragraph)."""


@dataclass(frozen=True)
class Factory:
    """A loaded env factory, where it came from, and (once probed) what it makes."""

    target: str
    name: str
    make: Callable[[], Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()  # bound before ``kwargs`` (a registry id's)
    kind: str = "sync"  # "sync" or "async" envs, once probed
    entry_point: str | None = None  # the id, if it has a vector entry point (probed)

    @property
    def expression(self) -> str:
        """How the recommended code spells the factory (its arguments bound)."""
        if not self.args and not self.kwargs:
            return self.name
        bound = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"lambda: {self.name}({', '.join(bound)})"


def load_factory(target: str, kwargs: Mapping[str, Any] | None = None) -> Factory:
    """Import ``MODULE:FACTORY``, load ``path/to/file.py:FACTORY`` or take a registry id.

    ``kwargs`` are bound to the factory.

    Raises:
        FactoryError: The target is malformed, the module or file cannot be
            loaded, or it has no such callable.
    """
    kwargs = dict(kwargs or {})
    source, sep, name = target.rpartition(":")
    if not sep and target in gymnasium.registry:
        made = functools.partial(gymnasium.make, target, **kwargs)
        return Factory(target, "gymnasium.make", made, kwargs, (target,))
    if not sep or not source or not name:
        raise FactoryError(
            f"expected MODULE:FACTORY, path/to/file.py:FACTORY or a gymnasium registry id, "
            f"got {target!r} (e.g. mypackage.envs:make_env, envs.py:make_env or CartPole-v1)."
        )
    is_file = source.endswith(".py") or "/" in source or os.sep in source
    module = _load_file(Path(source)) if is_file else _import(source)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            names = sorted(k for k, v in vars(module).items() if callable(v) and k[0] != "_")
            raise FactoryError(
                f"{source} has no attribute {name!r}; it defines these callables: "
                f"{', '.join(names) or 'none'}."
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"{target} is not callable (it is {short(repr(obj))}). {_FACTORY_HELP}")
    return Factory(target, name, functools.partial(obj, **kwargs) if kwargs else obj, kwargs)


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise FactoryError(
                f"no module named {module_name!r} (searched the current directory and the "
                "installed packages; for a file, write path/to/file.py:FACTORY)."
            ) from exc
        raise FactoryError(_failed(f"importing {module_name}", exc)) from exc
    except Exception as exc:
        raise FactoryError(_failed(f"importing {module_name}", exc)) from exc


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise FactoryError(f"no such file: {path}.")
    module_name = f"_aiovec_bench_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise FactoryError(f"cannot load {path} as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # its sibling modules import, as in a script
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        if not isinstance(exc, Exception):
            raise
        raise FactoryError(_failed(f"running {path}", exc)) from exc
    cloudpickle.register_pickle_by_value(module)  # workers cannot import it by name
    return module


def probe(factory: Factory) -> Factory:
    """Call the factory once and check what it returns; the factory, its `kind` known.

    Also its `entry_point`: the env's registry id, if the id has a vector
    entry point (gymnasium's own vector env of it).

    Raises:
        FactoryError: The call raised or returned something that is not an env.
    """
    try:
        env = factory.make()
    except Exception as exc:
        hint = ""
        if isinstance(exc, TypeError) and "argument" in str(exc):
            hint = (
                " It must take no arguments: pass them with --env-kwargs "
                "(e.g. '{\"size\": 7}') or bind them in a function of your own."
            )
        raise FactoryError(
            _failed(f"calling {factory.name}()", exc) + hint + " " + _FACTORY_HELP
        ) from exc
    try:
        check_env(0, env)  # the env protocol's members, as AsyncioVectorEnv checks them
    except TypeError as exc:
        what = str(exc).replace("env_fns[0]()", f"{factory.name}()")
        raise FactoryError(f"{what}. {_FACTORY_HELP}") from None
    kind = "async" if inspect.iscoroutinefunction(env.step) else "sync"
    spec: Any = getattr(env, "spec", None)  # a gymnasium env made from the registry has one
    entry = str(spec.id) if getattr(spec, "vector_entry_point", None) is not None else None
    _close(env)
    return dataclasses.replace(factory, kind=kind, entry_point=entry)


def _close(env: Any) -> None:
    """Close a probe env, best effort (its close is not what is measured)."""
    try:
        result = env.close()
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result))
    except Exception:
        pass  # a probe env that fails to close is not what the user asked about


async def _awaited(awaitable: Any) -> None:
    await awaitable


def _failed(what: str, exc: BaseException) -> str:
    return f"{what} raised {short(f'{type(exc).__name__}: {exc}')}."


def print_error(exc: FactoryError, target: str, *, show_traceback: bool) -> None:
    """Say on stderr why the factory cannot be used (with its traceback if asked)."""
    if show_traceback and exc.__cause__ is not None:
        traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(file=sys.stderr)
    more = ""
    if exc.__cause__ is not None and not show_traceback:
        more = " Run again with --traceback to see where."
    print(f"aiovec bench: cannot use the env factory {target}: {exc}{more}", file=sys.stderr)
