"""Backends: where envs live.  Each is loaded lazily, by name, on first use.

``import aiovec`` imports none of them; a backend whose optional dependency is
missing says which extra to install.
"""

from __future__ import annotations

import importlib

from aiovec.backends._base import Backend, EnvTraits

__all__ = ("Backend", "EnvTraits", "load_backend")

_MODULES = {
    "inline": ("aiovec.backends.inline", "InlineBackend"),
    "thread": ("aiovec.backends.thread", "ThreadBackend"),
    "process": ("aiovec.backends.process", "ProcessBackend"),
    "ray": ("aiovec.backends.ray", "RayBackend"),
}
_EXTRAS = {"ray": "ray"}  # backend -> (the top-level module it needs, and) its extra


def load_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name`` (imported on first use).

    Raises:
        ModuleNotFoundError: The backend's optional dependency is not installed
            (the message says which extra to install).
    """
    module_name, attr = _MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get(name)
        if extra is None or exc.name != extra:
            raise
        raise ModuleNotFoundError(
            f"backend={name!r} needs {extra}, which is not installed: "
            f'pip install "aiovec[{extra}]"',
            name=exc.name,
        ) from exc
    cls: type[Backend] = getattr(module, attr)
    return cls
